"""Text a call brings in that Redis, Celery's JSON and the providers cannot carry (issue 11, case 4).

Every field of a call reaches Redis (the ledger, the audit, the queue) and JSON (the message, the
results). A ``str`` holding a lone surrogate (``"call_\\ud800"``: not valid Unicode, not encodable
as UTF-8) makes redis-py raise ``UnicodeEncodeError`` at the first write, so it is stopped here,
before anything is sent:

- **call id**: a lone surrogate, a control character (NUL included), more than
  ``MAX_CALL_ID_CHARS`` characters, or the shape of a credential (it would be a Celery task id,
  shown unmasked in Flower, task events and the audit trail) refuse the whole batch
  (:class:`~toolfleet.errors.BatchRejected`, reason ``bad_call_id``), as a missing or repeated id
  does: a result could not be paired with it.
- **tool name**: lone surrogates are replaced by U+FFFD (the call then gets ``UNKNOWN_TOOL``, as
  any name no tool has).
- **arguments**: a lone surrogate anywhere in them (raw text, a key or a value) gives the call
  ``INVALID_ARGUMENT`` saying where; the other calls run. NUL characters are valid Unicode and JSON:
  they pass, and a tool that cannot use them says so in its own result.
"""

from __future__ import annotations

import json
import logging
import traceback
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from ..models import ErrorCode, ToolCall, ToolResult
from ..text import safe_text
from ..tools.redact import redact_arguments, redact_text, redact_value, secret_values
from ..tools.registry import Registry
from ..tools.spec import ToolSpec
from ..tools.validation import check_call

log = logging.getLogger(__name__)

MAX_CALL_ID_CHARS = 16_384
"""The longest call (or turn) id taken. Gateways write more than an id into it: LiteLLM in front of
Gemini 3 appends the model's thought signature, ``call_<hex>__thought__<base64>`` (BerriAI/litellm#16895;
about 950 characters, "multiple KB" in other reports), which must come back unchanged or Gemini
refuses the next request; a limit of 256 refused every batch of those. The bound stays, as a guard
against a payload that is not an id at all."""


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def call_id_problem(call_id: Any, what: str = "call id") -> str | None:
    """Why ``call_id`` cannot be a call id (``what``: or a turn id, the other half of a task id),
    or None."""
    if not isinstance(call_id, str):
        return f"a {what} must be text, not {type(call_id).__name__}"
    if not encodable(call_id):
        return f"{what} {ascii(call_id)} holds a lone surrogate (not valid Unicode)"
    if any(unicodedata.category(ch) == "Cc" for ch in call_id):
        return f"{what} {ascii(call_id)} holds a control character"
    if len(call_id) > MAX_CALL_ID_CHARS:
        return f"a {what} of {len(call_id)} characters is longer than {MAX_CALL_ID_CHARS}"
    # it would be a Celery task id: Flower, events, logs, the audit trail. Trailing "=" is base64's
    # padding (a gateway's thought signature), no secret: "...aPw==" read as the assignment pw="="
    unpadded = call_id.rstrip("=")
    if redact_text(unpadded) != unpadded:
        return (f"a {what} of {len(call_id)} characters has the shape of a credential (docs/secrets.md); "
                f"{what}s travel unmasked in task ids, so it is refused (not shown here)")
    return None


def tool_calls(calls: Iterable[Any]) -> list[ToolCall]:
    """``calls`` as :class:`ToolCall` objects, in order: a ``ToolCall`` as it is, a mapping in its
    shape (``{"id", "name", "arguments"}``: ``arguments`` a JSON text or an object; ``index``
    defaults to the call's position) validated into one. Raises ``TypeError`` naming what to pass
    for anything else (a dict passed where a ``ToolCall`` is expected failed deep inside with
    ``AttributeError: 'dict' object has no attribute 'id'``), pydantic's ``ValidationError`` (a
    ``ValueError``) for a mapping that is not a call (no ``id`` or ``name``)."""
    if isinstance(calls, (str, bytes, Mapping)):
        raise TypeError(f"calls must be a list of ToolCall (or of dicts with id, name and arguments), not "
                        f"{type(calls).__name__}; a provider's response goes to submit_response")
    taken: list[ToolCall] = []
    for position, call in enumerate(calls):
        if isinstance(call, ToolCall):
            taken.append(call)
        elif isinstance(call, Mapping):
            taken.append(ToolCall.model_validate({"index": position, **call}))
        else:
            raise TypeError(f"call at position {position} is a {type(call).__name__}, not a ToolCall: pass "
                            "ToolCall(id=..., name=..., arguments=...) or a dict with those keys (a provider's "
                            "response goes to submit_response)")
    return taken


def clean_call(call: ToolCall) -> ToolCall:
    """``call`` with lone surrogates in its name replaced (its id is checked by ``check_ids``)."""
    if encodable(call.name):
        return call
    return call.model_copy(update={"name": safe_text(call.name)})


def checked_call(registry: Registry, call: ToolCall) -> tuple[ToolSpec, dict[str, Any]] | ToolResult:
    """Every check a call gets before it may be sent: :func:`argument_problem`, then
    :func:`~toolfleet.tools.validation.check_call`. Returns ``(spec, arguments)`` or the call's
    error result; never raises on what a call holds: a check that fails on it (input past what
    Python's readers take, or a defect of ours) is that call's ``INVALID_ARGUMENT``, so the other
    calls of the batch run and every call still gets its one result (docs/design.md)."""
    try:
        return argument_problem(call) or check_call(registry, call)
    except Exception as exc:  # noqa: BLE001 - one call's content must not sink the batch
        # the exception's text may quote the arguments (secrets): its type only
        log.warning("call %s: its arguments could not be checked (%s); INVALID_ARGUMENT", call.id,
                    type(exc).__name__)
        log.debug("where the check of call %s failed:\n%s", call.id, "".join(traceback.format_tb(exc.__traceback__)))
        return ToolResult.failure(
            call.id, call.name, ErrorCode.INVALID_ARGUMENT,
            f"the call's arguments could not be checked ({type(exc).__name__}); nothing ran",
            "send plain JSON arguments, as the tool's schema describes them")


def argument_problem(call: ToolCall) -> ToolResult | None:
    """``INVALID_ARGUMENT`` for a call whose arguments hold text that is not valid Unicode, else None.
    Arguments this cannot read (not JSON, nested too deep for Python's reader) are left to
    ``check_call``, which gives each its own ``INVALID_ARGUMENT``."""
    try:
        return _surrogate_problem(call)
    except RecursionError:  # nested past Python's recursion limit: check_call reads it iteratively
        return None


def _surrogate_problem(call: ToolCall) -> ToolResult | None:
    raw = call.arguments
    where = None
    if isinstance(raw, str):
        if not encodable(raw):
            where = "the argument text"
        else:
            try:
                raw = json.loads(raw)  # "\\ud800" escapes decode to lone surrogates
            except ValueError:
                return None  # check_call says what is wrong with it
    if where is None:
        where = _bad_path(raw, "")
    if where is None:
        return None
    return ToolResult.failure(
        call.id, call.name, ErrorCode.INVALID_ARGUMENT,
        f"{where or 'the arguments'} hold(s) a lone surrogate (an unpaired \\ud800-\\udfff), which is not valid "
        "Unicode text; the call did not run",
        "send the arguments as valid UTF-8 text",
    )


def _bad_path(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return None if encodable(value) else (f"argument {path}" if path else "the argument text")
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}/{safe_text(str(key))}"
            if isinstance(key, str) and not encodable(key):
                return f"argument key {here}"
            found = _bad_path(item, here)
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _bad_path(item, f"{path}/{i}")
            if found:
                return found
    return None


def shown_arguments(arguments: dict[str, Any], sensitive: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """:func:`redact_arguments`, and the secret values it hid (declared ``sensitive``, secret-named)
    masked wherever else the arguments repeat them: ``{"command": "psql ... <the password>",
    "password": ...}`` would show in the ``command`` what ``password`` hides."""
    shown = redact_arguments(arguments, sensitive)
    known = secret_values(arguments, sensitive)
    return redact_value(shown, known) if known else shown
