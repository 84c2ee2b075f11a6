"""Wire envelopes shared by the dispatcher and the workers: tool calls, tool results, error codes.

All are frozen pydantic models serialised as JSON (never pickle). Shapes follow docs/design.md
("Result contract"); error codes are the ones in its table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ErrorCode(StrEnum):
    """Why a call has no ``ok`` result. The model and the program both branch on these.

    A ``StrEnum``: ``str(code)``, ``print(code)`` and f-strings give the bare code
    (``INVALID_ARGUMENT``), as JSON and pydantic do (issue 15, point 10)."""

    UNKNOWN_TOOL = "UNKNOWN_TOOL"  # no tool by that name; handler did not run
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # arguments unparsable or against the schema; did not run
    TOOL_UNAVAILABLE = "TOOL_UNAVAILABLE"  # no live worker serves the tool / circuit open; did not run
    PERMISSION_DENIED = "PERMISSION_DENIED"  # policy refused it; did not run
    EXECUTION_ERROR = "EXECUTION_ERROR"  # the handler failed
    TIMEOUT = "TIMEOUT"  # ran past its time limit and was stopped
    CANCELLED = "CANCELLED"  # turn cancelled while it ran; it was stopped
    NOT_EXECUTED = "NOT_EXECUTED"  # turn cancelled before it started
    WORKER_LOST = "WORKER_LOST"  # worker died under it; could not be safely re-run
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"  # side-effecting call whose outcome cannot be established
    LOOP_DETECTED = "LOOP_DETECTED"  # same call repeated too often in a row; did not run
    ABORTED = "ABORTED"  # placeholder for a call without a result (history repair)
    SESSION_LOST = "SESSION_LOST"  # the worker holding the live session's process is gone; did not run


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


NOT_JSON_ARGUMENTS = "<arguments that cannot be written as JSON>"


def means_no_arguments(text: str) -> bool:
    """Whether argument text means ``{}``: empty or white space only (OpenAI for a tool called
    without arguments, vLLM and Ollama; an Anthropic ``tool_use`` streamed with no
    ``input_json_delta``) or the JSON text ``null`` (Groq, langchain-ai/langchain#33896). Such a
    call runs as ``{}`` (:func:`~toolfleet.tools.validation.parse_arguments`) and goes back in the
    history as ``"{}"`` (``arguments_for_wire``, ``repair_history``)."""
    return text.strip() in ("", "null")


class ToolCall(_Frozen):
    """One call the model proposed, in the provider-neutral shape.

    ``arguments`` is the raw argument text as the model wrote it (a JSON string; ``""`` means ``{}``)
    or an already-decoded object (Anthropic ``input``). ``index`` is the position in model order.
    """

    id: str
    name: str
    arguments: str | dict[str, Any] = ""
    index: int = 0

    @field_validator("arguments", mode="before")
    @classmethod
    def _plain_arguments(cls, value: Any) -> Any:
        """An object that is not plain JSON (built in Python: a key that is not a string, a set,
        bytes) becomes a text saying so, which is not JSON: validation then makes it this call's
        ``INVALID_ARGUMENT``, where the object would fail the whole batch (or its send). A key
        ``1`` is not read as ``"1"``: which parameter was meant is the model's to say."""
        if not isinstance(value, dict) or plain_json(value):
            return value
        return NOT_JSON_ARGUMENTS


def plain_json(value: Any) -> bool:
    """Whether ``value`` is made only of what JSON text parses to: dicts with string keys, lists
    (tuples too), strings, numbers, booleans and None, each dict and list met once (walked without recursion,
    each container once: a cycle, or one list held twice, is not what a JSON text parses to, and
    walking it again would never end or grow exponentially)."""
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, (dict, list, tuple)):  # (a tuple is written as an array)
            if id(item) in seen:
                if isinstance(item, tuple):  # Python shares equal constant tuples; a tuple alone makes no cycle
                    continue
                return False
            seen.add(id(item))
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    return False
                stack.extend(item.values())
            else:
                stack.extend(item)
        elif not (item is None or isinstance(item, (str, int, float))):
            return False
    return True


class ToolError(_Frozen):
    """Structured error of a result: ``code``, what went wrong, and how to fix it."""

    code: ErrorCode
    message: str
    hint: str = ""


class ToolResult(_Frozen):
    """Exactly one per call. ``content`` is the text the model reads (never empty).

    Times are milliseconds: ``queued_ms`` from submit to start, ``run_ms`` from start to finish.
    ``attempts`` counts executions begun (0 when the handler never ran).
    """

    call_id: str
    name: str
    status: Literal["ok", "error"]
    content: str
    data: Any = None
    error: ToolError | None = None
    queued_ms: float | None = None
    run_ms: float | None = None
    attempts: int = 0
    worker: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def code(self) -> ErrorCode | None:
        return self.error.code if self.error else None

    @classmethod
    def failure(
        cls,
        call_id: str,
        name: str,
        code: ErrorCode,
        message: str,
        hint: str = "",
        *,
        output: str = "",
        **extra: Any,
    ) -> ToolResult:
        """An error result whose ``content`` states code, message and hint for the model, followed
        by ``output`` (what the handler printed before it failed or was stopped), if any. Secrets
        that ``message`` and ``hint`` quote are masked (:func:`toolfleet.tools.redact.redact_text`:
        they reach the audit trail and UIs); ``output`` is the tool's and is kept as it is."""
        from .tools.redact import redact_text  # the tools package imports this module

        message, hint = redact_text(message), redact_text(hint)
        content = f"Error [{code.value}]: {message}"
        if hint:
            content += f"\nHint: {hint}"
        if output:
            content += f"\n\nOutput before it stopped:\n{output}"
        return cls(
            call_id=call_id,
            name=name,
            status="error",
            content=content,
            error=ToolError(code=code, message=message, hint=hint),
            **extra,
        )


class CallEnvelope(_Frozen):
    """What the dispatcher sends to a worker for one call (the Celery task's only kwarg).

    ``key_id``, ``expires_at`` (unix s, dispatcher clock) and ``signature`` (HMAC-SHA256, URL-safe
    base64) are set when the fleet signs its messages (:mod:`toolfleet.signing`); a worker with a
    fleet key runs no message without a valid one.
    """

    turn_id: str
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    workspace: str | None = None
    session_id: str | None = None
    time_limit_s: float
    idempotency_key: str
    submitted_at: float  # unix seconds, dispatcher clock
    expires_at: float | None = None
    key_id: str | None = None
    signature: str | None = None
