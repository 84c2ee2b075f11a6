"""OpenAI Responses: the built-in tool items the *client* executes, each a call with one answer.

Besides ``function_call`` and ``custom_tool_call``, the Responses API emits output items for its
built-in tools that it does not run itself; the client runs them and answers each in the next
request's input, paired by ``call_id``. A call left without its answer makes that request fail,
so each gets exactly one, in model order, in its own shape (:data:`CLIENT_CALLS`).

Sources: openai-python ``types/responses`` (``response_output_item.py``,
``response_input_item_param.py``, ``response_function_shell_tool_call.py``,
``response_function_shell_call_output_content_param.py``, ``response_tool_search_call.py``,
``response_tool_search_output_item_param_param.py``, ``response_apply_patch_tool_call_output.py``)
and the OpenAI guides "Local shell", "Shell", "Apply patch", "Computer use", "Tool search".

================  ==========================================================================
item              what toolfleet does, and the answer
================  ==========================================================================
local_shell_call  ``action {type: "exec", command: [argv], timeout_ms, working_directory, env,
                  user}`` runs as the fleet's shell tool ``run_command`` (the argv shell-quoted,
                  ``cd -- DIR &&`` and ``NAME=value`` in front), through validation, policy,
                  plan and sandbox like any call. Answer ``{"type": "local_shell_call_output",
                  "call_id", "output": text}`` (``call_id``, as the guide and the OpenAI Agents
                  SDK send it; openai-python's generated type names the field ``id``).
shell_call        ``action {commands: [...], timeout_ms, max_output_length}`` runs as
                  ``run_command`` with the commands one per line (one bash script: each runs
                  after the one before, the status is the last one's). Answer
                  ``{"type": "shell_call_output", "call_id", "output": [{"stdout", "stderr",
                  "outcome": {"type": "exit", "exit_code"} | {"type": "timeout"}}],
                  "max_output_length"?}``; ``run_command`` prints stdout and stderr as one
                  stream, which goes back as ``stdout`` (cut to ``max_output_length``
                  characters together with ``stderr``, whose note is kept first, and passed
                  back as the guide asks);
                  a non-zero exit is the outcome's ``exit_code``; an error toolfleet reports
                  (the call did not run, was stopped...) is ``stderr``, with exit code 1, or
                  the ``timeout`` outcome for ``TIMEOUT``.
apply_patch_call  toolfleet has no patch tool: ``UNKNOWN_TOOL``, answered ``{"type":
                  "apply_patch_call_output", "call_id", "status": "failed", "output": text}``.
tool_search_call  ``execution: "client"``: toolfleet has no deferred tools to load (every tool
                  it serves is in the request's ``tools``), so the answer is ``{"type":
                  "tool_search_output", "call_id", "execution": "client", "status":
                  "completed", "tools": []}``.
computer_call     needs a screenshot toolfleet cannot take: the batch is refused up front,
                  before anything runs (:class:`~toolfleet.errors.BatchRejected`, reason
                  ``unanswerable_call``, the call ids in ``call_ids``).
================  ==========================================================================

Not calls: an item whose answer the same response already carries (a call the server ran), a
``tool_search_call`` with ``execution: "server"``, a ``shell_call`` whose ``environment`` is not
``local`` (a hosted container). Without the shell tool in the registry, a shell item gets
``UNKNOWN_TOOL`` in its own answer shape. A field that cannot be read (no ``command`` list, a
``timeout_ms`` that is no number, a ``user`` toolfleet cannot run as) makes that call's
``INVALID_ARGUMENT`` result; the other calls run. A ``call_id`` that is missing or not a string
refuses the batch as it does for a ``function_call`` (nothing could be paired with its answer).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BatchRejected
from ...models import ErrorCode, ToolCall, ToolResult
from ...tools.validation import MAX_NESTING
from .wire import at, cut, depth_of, kind, need_text, short

CLIENT_CALLS = {
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "computer_call": "computer_call_output",
}
"""Item types of built-in tool calls the client executes, and the type of the item answering each."""
SHELL_TOOL = "run_command"
"""The fleet tool a shell item runs as (:mod:`toolfleet.tools.command`)."""
UNANSWERABLE = frozenset({"computer_call"})
"""Kinds toolfleet cannot answer honestly: a batch holding one is refused before anything runs."""
_NAMES = {"local_shell_call": SHELL_TOOL, "shell_call": SHELL_TOOL, "apply_patch_call": "apply_patch",
          "tool_search_call": "tool_search", "computer_call": "computer"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STOPPED = "\n\nOutput before it stopped:\n"  # ToolResult.failure puts a handler's output after this
_EXIT_STATUS = re.compile(r"command exited with status (-?\d+)")


@dataclass(frozen=True)
class ClientCall:
    """One client-executed item read: its ``kind`` (item type), the :class:`ToolCall` toolfleet
    takes for it, ``problem`` (message, hint) when a field cannot be read, and the
    ``max_output_length`` of a ``shell_call`` (passed back in its answer)."""

    kind: str
    call: ToolCall
    problem: tuple[str, str] | None = None
    max_output_length: int | None = None


def answered_ids(items: Iterable[Any]) -> set[str]:
    """The call ids that answer items among ``items`` carry (a call the server ran has its answer
    in the same response); ``local_shell_call_output`` may carry it as ``id``."""
    return {answer_id(i) for i in items if isinstance(i, Mapping) and i.get("type") in CLIENT_CALLS.values()} - {""}


def answer_id(item: Mapping[str, Any]) -> str:
    """The call id an answer item carries: its ``call_id``, or a ``local_shell_call_output``'s
    ``id`` (openai-python's generated type names the field so); ``""`` when it has none."""
    for field in ("call_id", "id") if item.get("type") == "local_shell_call_output" else ("call_id",):
        if isinstance(item.get(field), str) and item[field]:
            return str(item[field])
    return ""


def is_client_call(item: Mapping[str, Any], answered: Iterable[str] = ()) -> bool:
    """True when ``item`` is a built-in tool call the client must answer (module docstring)."""
    kind_ = item.get("type")
    if not isinstance(kind_, str) or kind_ not in CLIENT_CALLS:
        return False
    call_id = item.get("call_id")
    if isinstance(call_id, str) and call_id in (answered if isinstance(answered, (set, frozenset)) else set(answered)):
        return False
    if kind_ == "tool_search_call":
        return item.get("execution") != "server"
    if kind_ == "shell_call":
        environment = item.get("environment")
        return not (isinstance(environment, Mapping) and environment.get("type") not in (None, "local"))
    return True


def read_item(item: Mapping[str, Any], index: int, here: str) -> ClientCall:
    """The :class:`ClientCall` of a client-executed ``item`` at position ``index`` in model order
    (``here``: its JSON pointer). Raises BatchRejected only for a ``call_id`` that is not a string."""
    kind_ = str(item["type"])
    call_id = need_text(item.get("call_id"), at(here, "call_id"), "a call_id")
    name, problem, arguments, limit = _NAMES[kind_], None, {}, None
    action = item.get("action")
    try:
        if kind_ == "local_shell_call":
            arguments = _local_shell(action)
        elif kind_ == "shell_call":
            arguments, limit = _shell(action)
        elif kind_ == "apply_patch_call" and _shallow(item.get("operation")):  # kept for the record; not run
            arguments = {"operation": item["operation"]}
        elif kind_ == "tool_search_call" and _shallow(item.get("arguments")):
            arguments = dict(item["arguments"])
    except _Unreadable as exc:
        problem = (f"{kind_} {call_id}: {exc}; it did not run", "send the call again with the action as the "
                   "tool describes it")
    return ClientCall(kind_, ToolCall(id=call_id, name=name, arguments=arguments, index=index), problem, limit)


def _shallow(value: Any) -> bool:
    """An object nested no deeper than validation reads (``MAX_NESTING``)."""
    return isinstance(value, dict) and depth_of(value, MAX_NESTING) <= MAX_NESTING


def tool_name(kind_: str) -> str:
    """The name of the :class:`ToolCall` toolfleet takes for a client item of type ``kind_``."""
    return _NAMES[kind_]


class _Unreadable(ValueError):
    """A field of a client item that cannot be run as given (the call's INVALID_ARGUMENT)."""


def _action(action: Any) -> dict[str, Any]:
    if not isinstance(action, dict):
        raise _Unreadable(f"action must be an object, not {kind(action)}")
    return action


def _timeout(action: dict[str, Any]) -> dict[str, Any]:
    value = action.get("timeout_ms")
    if value is None:
        return {}
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise _Unreadable(f"action.timeout_ms must be a positive number of milliseconds, not {kind(value)} "
                          f"{cut(str(value), 40)}")
    return {"timeout_s": value / 1000}


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _Unreadable(f"{what} must be a non-empty array of strings, not {kind(value)}")
    return value


def _local_shell(action: Any) -> dict[str, Any]:
    """``run_command`` arguments of a ``local_shell_call`` action."""
    action = _action(action)
    if action.get("type") not in (None, "exec"):
        raise _Unreadable(f"action.type {short(str(action.get('type')), 40)} is not 'exec'")
    line = shlex.join(_strings(action.get("command"), "action.command"))
    env = action.get("env")
    if env:
        if not isinstance(env, dict) or not all(isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str)
                                                for k, v in env.items()):
            raise _Unreadable("action.env must map variable names to string values")
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + line
    directory = action.get("working_directory")
    if directory:
        if not isinstance(directory, str):
            raise _Unreadable(f"action.working_directory must be a string, not {kind(directory)}")
        line = f"cd -- {shlex.quote(directory)} && {line}"
    if action.get("user"):
        raise _Unreadable("action.user cannot be honoured: commands run as the sandbox's own user")
    return {"command": line, **_timeout(action)}


def _shell(action: Any) -> tuple[dict[str, Any], int | None]:
    """``run_command`` arguments and the ``max_output_length`` of a ``shell_call`` action."""
    action = _action(action)
    commands = _strings(action.get("commands"), "action.commands")
    limit = action.get("max_output_length")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise _Unreadable(f"action.max_output_length must be a non-negative integer, not {kind(limit)}")
    return {"command": "\n".join(commands), **_timeout(action)}, limit


def refuse_unanswerable(calls: Iterable[tuple[ClientCall, str]]) -> None:
    """Raise BatchRejected (reason ``unanswerable_call``) if any of ``calls`` (each with its JSON
    pointer in the payload) is of a kind toolfleet cannot answer (:data:`UNANSWERABLE`)."""
    bad = [(c, p) for c, p in calls if c.kind in UNANSWERABLE]
    if bad:
        ids = tuple(c.call.id for c, _ in bad)
        raise BatchRejected(
            f"{bad[0][0].kind} {', '.join(ids)}: toolfleet cannot answer it (a computer_call_output needs a "
            "screenshot of the client's screen), and the API refuses a request with a call left unanswered; "
            "the batch was refused and nothing ran. Run computer calls with a computer-use harness.",
            reason="unanswerable_call", call_ids=ids, pointer=bad[0][1])


def client_results(calls: Sequence[ToolCall], client: Mapping[str, ClientCall],
                   known: Callable[[str], bool]) -> dict[str, ToolResult]:
    """``{call id: result}`` for the client calls among ``calls`` that do not run: an unreadable
    item (``INVALID_ARGUMENT``), a shell item with no shell tool in the registry (``known(name)``
    False) and ``apply_patch_call`` (``UNKNOWN_TOOL``), ``tool_search_call`` (ok, no tools)."""
    out = {}
    for call in calls:
        item = client.get(call.id)
        if item is None:
            continue
        if item.problem is not None:
            out[call.id] = ToolResult.failure(call.id, call.name, ErrorCode.INVALID_ARGUMENT, *item.problem)
        elif item.kind == "tool_search_call":
            out[call.id] = ToolResult(
                call_id=call.id, name=call.name, status="ok", data={"tools": []},
                content="no tools to load: every tool toolfleet serves is already in the request's tools list")
        elif item.kind == "apply_patch_call":
            out[call.id] = ToolResult.failure(
                call.id, call.name, ErrorCode.UNKNOWN_TOOL,
                "apply_patch_call: toolfleet has no patch tool, so the patch was not applied",
                "edit files with the fleet's file tools (edit_file, write_file) offered as function tools")
        elif call.name == SHELL_TOOL and not known(SHELL_TOOL):
            out[call.id] = ToolResult.failure(
                call.id, call.name, ErrorCode.UNKNOWN_TOOL,
                f"{item.kind}: this fleet serves no shell tool ({SHELL_TOOL}), so the command did not run",
                f"serve {SHELL_TOOL} (it needs bubblewrap on the worker) or do not offer the shell tool to the model")
    return out


def history_roles(items: Sequence[Any]) -> dict[int, tuple[str, str]]:
    """For :func:`~toolfleet.dispatcher.history.repair_history`: ``{position: ("call" | "result",
    call id)}`` of the client-executed built-in tool items of a Responses history and of their
    answers. Left out (kept where they are): the items of calls the server ran and their outputs,
    and ``computer_call`` items and their outputs (no placeholder could stand in for a screenshot).

    Call ids repeat across turns, so an answer is the server's by what stands before it, not by its
    id alone: one marked ``execution: "server"``, or one whose latest call of its kind and id before
    it is a call the server ran (or, with no call before it, whose kind and id have only such calls).
    The client's answer to a client ``tool_search_call`` that reuses a server-run one's id is the
    client's (it used to be kept as the server's, and a placeholder added beside it)."""
    skipped = {*UNANSWERABLE, *(CLIENT_CALLS[k] for k in UNANSWERABLE)}
    call_of = {answer: call for call, answer in CLIENT_CALLS.items()}
    runs: dict[tuple[str, str], set[bool]] = {}  # (call kind, id) -> who ran its calls (True: the client)
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("type"), str) and item["type"] in CLIENT_CALLS:
            runs.setdefault((item["type"], str(item.get("call_id") or "")), set()).add(is_client_call(item))
    latest: dict[tuple[str, str], bool] = {}  # (call kind, id) -> its latest call so far is the client's
    out = {}
    for n, item in enumerate(items):
        kind_ = item.get("type") if isinstance(item, Mapping) else None
        if not isinstance(kind_, str) or kind_ in skipped:
            continue
        if kind_ in CLIENT_CALLS:
            call_id = str(item.get("call_id") or "")
            latest[(kind_, call_id)] = client = is_client_call(item)
            if client:
                out[n] = ("call", call_id)
        elif kind_ in call_of and item.get("execution") != "server":
            key = (call_of[kind_], answer_id(item))
            if latest.get(key, runs.get(key) != {False}):
                out[n] = ("result", key[1])
    return out


def placeholder_answer(kind_: str, result: ToolResult) -> dict[str, Any]:
    """The answer of a client item of type ``kind_`` carrying ``result`` (history repair's ``ABORTED``)."""
    return answer(ClientCall(kind_, ToolCall(id=result.call_id, name=result.name)), result)


def answer(item: ClientCall, result: ToolResult) -> dict[str, Any]:
    """The input item answering ``item`` with ``result`` (module docstring, the shape of each kind)."""
    kind_, call_id = item.kind, result.call_id
    if kind_ == "shell_call":
        out = {"type": "shell_call_output", "call_id": call_id, "output": [_shell_output(result, item)]}
        return out if item.max_output_length is None else {**out, "max_output_length": item.max_output_length}
    if kind_ == "apply_patch_call":
        return {"type": "apply_patch_call_output", "call_id": call_id,
                "status": "completed" if result.ok else "failed", "output": result.content}
    if kind_ == "tool_search_call":
        tools = result.data.get("tools") if isinstance(result.data, dict) else None
        return {"type": "tool_search_output", "call_id": call_id, "execution": "client", "status": "completed",
                "tools": tools if isinstance(tools, list) and result.ok else []}
    return {"type": CLIENT_CALLS[kind_], "call_id": call_id, "output": result.content}


def _shell_output(result: ToolResult, item: ClientCall) -> dict[str, Any]:
    """One ``{"stdout", "stderr", "outcome"}`` entry of a ``shell_call_output``."""
    if result.ok:
        stdout, stderr, outcome = result.content, "", {"type": "exit", "exit_code": 0}
    else:
        head, _, printed = result.content.partition(_STOPPED)
        status = _EXIT_STATUS.search(result.error.message if result.error else "")
        if result.code is ErrorCode.EXECUTION_ERROR and status:  # it ran and exited non-zero: its status says it
            stdout, stderr, outcome = printed, "", {"type": "exit", "exit_code": int(status.group(1))}
        else:  # toolfleet's error (did not run, stopped...) is the stderr
            stdout, stderr = printed, head
            outcome = {"type": "timeout"} if result.code is ErrorCode.TIMEOUT else {"type": "exit", "exit_code": 1}
    limit = item.max_output_length
    if limit is not None:  # characters of stdout and stderr together; stderr (toolfleet's account of an
        stderr = stderr[:limit]  # error: cancelled, not run...; run_command prints into stdout) first, so a
        stdout = stdout[: limit - len(stderr)]  # long output cannot leave only an unexplained exit code
    return {"stdout": stdout, "stderr": stderr, "outcome": outcome}
