"""OpenAI Responses: the tool a ``function_call`` with a ``namespace`` names.

Source: OpenAI API reference, Responses: a ``namespace`` tool (``{"type": "namespace", "name",
"description", "tools"}``, openai-python ``NamespaceTool``: "groups function/custom tools under a
shared namespace"; its ``name`` is "the namespace name used in tool calls") makes the model call a
function inside it as ``{"type": "function_call", "namespace": "crm", "name": "lookup", ...}``
(``ResponseFunctionToolCall.namespace``: "the namespace of the function to run"). Gateways that
speak the Responses API pass it on (OpenRouter's ``FunctionCallItem.namespace``: "for tools
registered as part of a namespace tool group (e.g. an MCP server)").

Fleet tool names have no namespace (``[a-zA-Z0-9_-]``); a tool of a group is named
``GROUP__tool``, as the MCP host names a hosted server's tools (``toolfleet worker --mcp
NAME=COMMAND``). So a call with ``namespace: ns`` and ``name: n``:

- runs ``ns__n`` when the registry has a tool by that name (the request declared ``GROUP__tool``
  as the tool ``tool`` of the namespace ``GROUP``);
- else runs ``n`` (the namespace only groups the fleet's own tools in the request: a
  ``namespace`` tool wrapping ``dispatcher.tools("responses")``; and the OpenAI Agents SDK's
  "deferred top-level" shape, ``namespace`` equal to ``name``); a name the registry has in neither
  form gets ``UNKNOWN_TOOL`` for ``n``.

Only the call's ``name`` toolfleet runs changes: the item goes back in the next request as it came
(``namespace`` and ``name`` as the model wrote them), and its ``function_call_output`` is paired by
``call_id`` alone. A ``namespace`` that is not a non-empty string is not read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...models import ToolCall
from ...tools.spec import GROUP_SEPARATOR as SEPARATOR


def item_namespace(item: Mapping[str, Any]) -> str | None:
    """The ``namespace`` of a ``function_call`` item, or None (none, or not a non-empty string)."""
    value = item.get("namespace")
    return value if item.get("type") == "function_call" and isinstance(value, str) and value else None


def namespaces_of(items: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """``{call_id: namespace}`` of the ``function_call`` items that carry one."""
    out = {}
    for item in items:
        namespace = item_namespace(item)
        if namespace is not None and isinstance(item.get("call_id"), str):
            out[item["call_id"]] = namespace
    return out


def tool_name(name: str, namespace: str | None, known: Callable[[str], bool]) -> str:
    """The fleet tool a call of ``name`` in ``namespace`` runs (``known(name)``: the registry has it)."""
    if namespace and namespace != name and known(f"{namespace}{SEPARATOR}{name}"):
        return f"{namespace}{SEPARATOR}{name}"
    return name


def resolve(calls: Iterable[ToolCall], namespaces: Mapping[str, str], known: Callable[[str], bool]) -> list[ToolCall]:
    """``calls`` with each namespaced one's ``name`` the fleet tool it runs (:func:`tool_name`)."""
    out = []
    for call in calls:
        name = tool_name(call.name, namespaces.get(call.id), known)
        out.append(call if name == call.name else call.model_copy(update={"name": name}))
    return out
