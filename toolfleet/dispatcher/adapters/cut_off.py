"""Calls a response cut off at the model's output token limit: they do not run.

A provider that stops a response at its token limit returns what was written so far, and a tool
call being written then comes back closed with only the arguments that were complete (Anthropic:
``stop_reason: "max_tokens"``, its docs' "Stop reasons" ask to raise ``max_tokens`` or continue;
the non-streamed ``tool_use`` carries the fields written before the cut, anthropics/claude-code#45436).
Such a call may validate and run with an optional argument missing (a ``grep`` over the whole
workspace instead of one folder), so it gets ``INVALID_ARGUMENT`` instead:

- Anthropic Messages: ``stop_reason`` ``max_tokens`` (or ``model_context_window_exceeded``): the
  last ``tool_use`` block, when it is the message's last block (text after it means it was
  finished);
- OpenAI Chat Completions: ``finish_reason: "length"``: the last tool call;
- OpenAI Responses: a ``function_call`` item (or a built-in tool item the client executes,
  :data:`RUNNABLE`: a shell command cut short must not run) whose ``status`` is ``"incomplete"``,
  and the last output item of a response whose ``status`` is ``"incomplete"`` for
  ``max_output_tokens`` when it is such an item not marked ``"completed"``.

Streams, where a call runs the moment its end is signalled, follow the same rules where the
stream says so before the call completes, so a streamed call and the same call whole get the same
answer (the parsers list such calls in ``cut_off`` and their reason in ``cut_why``, and
:class:`~toolfleet.dispatcher.streaming.TurnStream` answers them with :func:`cut_off_result`):

- OpenAI Chat, streamed: ``finish_reason: "length"`` completes the calls still open, so those are
  cut off (a call whose arguments already formed a complete JSON object ran before it: nothing in
  the stream said it would be the last);
- OpenAI Responses, streamed: a ``function_call`` item whose ``output_item.done`` carries
  ``status: "incomplete"``, and at the terminal event (``response.incomplete``) the calls still
  open that :func:`responses_cut_calls` names in its ``response``;
- Anthropic, streamed: not covered: ``content_block_stop`` ends the block (and the call runs)
  before ``message_delta`` brings ``stop_reason: "max_tokens"``.

Arguments cut mid-JSON in any stream never complete and get ``INVALID_ARGUMENT`` from the stream's
end (:class:`~toolfleet.dispatcher.streaming.TurnStream`).

A response the provider's safety system stopped runs none of its calls: each gets
``PERMISSION_DENIED`` (:func:`safety_stop_result`), whole or where a stream says so before the call
completes (Chat ``finish_reason: "content_filter"`` completing the calls still open; a Responses
terminal ``response.incomplete`` for ``content_filter``, for the calls still open; an Anthropic
stream's ``stop_reason`` comes after its blocks ended, as for ``max_tokens``):

- Anthropic Messages: ``stop_reason: "refusal"`` (its docs, "Handle streaming refusals": a
  streaming classifier intervened; the conversation must be reset, nothing of that turn goes on);
- OpenAI Chat Completions: ``finish_reason: "content_filter"`` (content omitted by a flag of the
  content filters: a call may be partial, and the model's output was flagged);
- OpenAI Responses: ``status: "incomplete"`` with ``incomplete_details.reason: "content_filter"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...models import ErrorCode, ToolCall, ToolResult
from .base import as_dict
from .openai_chat import first_choice

ANTHROPIC_CUT = ("max_tokens", "model_context_window_exceeded")
RUNNABLE = ("function_call", "local_shell_call", "shell_call", "apply_patch_call", "tool_search_call")
"""Responses items of calls toolfleet takes whose arguments the model writes (:mod:`.client_tools`)."""


def cut_off_results(adapter_name: str, payload: Any, calls: Sequence[ToolCall]) -> dict[str, ToolResult]:
    """``{call id: INVALID_ARGUMENT result}`` for the calls of ``payload`` (a non-streamed response
    of ``adapter_name``'s format, already parsed into ``calls``) that the token limit cut off."""
    data = as_dict(payload)
    if not calls or not isinstance(data, dict):
        return {}
    names = {c.id: c.name for c in calls}
    stopped = safety_stop(adapter_name, data)
    if stopped is not None:
        return {c.id: safety_stop_result(c, stopped) for c in calls}
    cut: list[tuple[str, str]] = []  # (call id, what said so)
    if adapter_name == "anthropic" and data.get("stop_reason") in ANTHROPIC_CUT:
        blocks = data.get("content")
        last = as_dict(blocks[-1]) if isinstance(blocks, list) and blocks else None
        if isinstance(last, dict) and last.get("type") == "tool_use" and last.get("id") == calls[-1].id:
            cut.append((calls[-1].id, f"stop_reason {data['stop_reason']}"))
    elif adapter_name == "openai_chat":
        first = first_choice(data)
        if isinstance(first, dict) and first.get("finish_reason") == "length":
            cut.append((calls[-1].id, "finish_reason length"))
    elif adapter_name == "openai_responses":
        cut.extend((call_id, "status incomplete") for call_id in responses_cut_calls(data) if call_id in names)
    return {call_id: cut_off_result(ToolCall(id=call_id, name=names[call_id]), why) for call_id, why in cut}


def safety_stop(adapter_name: str, data: dict[str, Any]) -> str | None:
    """What says the provider's safety system stopped ``data`` (a whole response of
    ``adapter_name``'s format, plain data; module docstring), as a ``why`` for
    :func:`cut_off_result`, or None."""
    if adapter_name == "anthropic" and data.get("stop_reason") == "refusal":
        return "stop_reason refusal"
    if adapter_name == "openai_chat":
        first = first_choice(data)
        if isinstance(first, dict) and first.get("finish_reason") == "content_filter":
            return "finish_reason content_filter"
    if adapter_name == "openai_responses" and data.get("status") == "incomplete":
        details = as_dict(data.get("incomplete_details") or {})
        if isinstance(details, dict) and details.get("reason") == "content_filter":
            return "incomplete_details.reason content_filter"
    return None


SAFETY_STOPS = ("stop_reason refusal", "finish_reason content_filter", "incomplete_details.reason content_filter")
"""The ``why`` of each safety stop (:func:`safety_stop`), which :func:`cut_off_result` answers as one."""


def safety_stop_result(call: ToolCall, why: str) -> ToolResult:
    """The ``PERMISSION_DENIED`` result of a call of a response the provider's safety system stopped."""
    return ToolResult.failure(
        call.id, call.name, ErrorCode.PERMISSION_DENIED,
        f"the provider's safety system stopped the response that made this call ({why}); the call did not run",
        "do not repeat it as it was: rephrase or remove the turn that was stopped (Anthropic asks to reset the "
        "conversation after a refusal)",
    )


def cut_off_result(call: ToolCall, why: str) -> ToolResult:
    """The ``INVALID_ARGUMENT`` result of a call the token limit cut off (``why``: what said so), or
    the ``PERMISSION_DENIED`` one of a safety stop (``why`` in :data:`SAFETY_STOPS`)."""
    if why in SAFETY_STOPS:
        return safety_stop_result(call, why)
    return ToolResult.failure(
        call.id, call.name, ErrorCode.INVALID_ARGUMENT,
        f"the response was cut off ({why}: the output token limit) while this call was being written; its "
        "arguments may be incomplete, so it did not run",
        "make the call again with all of its arguments (fewer or shorter calls per response fit the limit)",
    )


def responses_cut_calls(response: dict[str, Any]) -> list[str]:
    """The ``call_id`` of each call item (:data:`RUNNABLE`) of a Responses ``response`` (plain data) that
    the token limit cut off: its ``status`` is ``"incomplete"``, or it is the last output item of a
    response whose ``status`` is ``"incomplete"`` for ``max_output_tokens`` (or no reason given)
    and it is not marked ``"completed"``. Items that are not objects are skipped."""
    items = [i for i in map(as_dict, response.get("output") or []) if isinstance(i, dict)]
    details = as_dict(response.get("incomplete_details") or {})
    reason = details.get("reason") if isinstance(details, dict) else None
    cut_at_limit = response.get("status") == "incomplete" and reason in (None, "max_output_tokens")
    cut = []
    for n, item in enumerate(items):
        if item.get("type") not in RUNNABLE or not isinstance(item.get("call_id"), str):
            continue
        last_of_incomplete = cut_at_limit and n == len(items) - 1 and item.get("status") != "completed"
        if item.get("status") == "incomplete" or last_of_incomplete:
            cut.append(item["call_id"])
    return cut
