"""The seam between provider wire formats and toolfleet's provider-neutral calls and results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ...models import ToolCall, ToolResult
from ...tools.registry import Registry


class Adapter(Protocol):
    """One provider format, in and out.

    - ``parse(payload)``: the provider's response (a dict, or an SDK object with ``model_dump``)
      -> the calls in model order. Raises :class:`~toolfleet.errors.BatchRejected` when the payload
      has no readable calls list; a single malformed call is not a reason (it becomes an error result).
    - ``format_results(results)``: results in model order -> the messages (or items) to append to
      the next request.
    - ``tools(registry)``: the ``tools`` list of the request, from the same registry.
    """

    name: str

    def parse(self, payload: Any) -> list[ToolCall]: ...

    def format_results(self, results: Sequence[ToolResult]) -> list[dict[str, Any]]: ...

    def tools(self, registry: Registry) -> list[dict[str, Any]]: ...


def as_dict(payload: Any) -> Any:
    """Plain data from a dict or an SDK object (pydantic ``model_dump``), without importing the SDK."""
    if hasattr(payload, "model_dump"):
        return payload.model_dump(mode="json", exclude_unset=False)
    return payload
