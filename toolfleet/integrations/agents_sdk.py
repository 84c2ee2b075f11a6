"""OpenAI Agents SDK: an Agent whose function tools run on the fleet.

Glue (the SDK's native way is ``@function_tool`` functions run in the runner's process)::

    fleet = FleetTools(dispatcher, workspace="/srv/ws")          # the fleet's tools, as FunctionTools
    agent = Agent(name="coder", tools=fleet.tools)
    result = await Runner.run(agent, "fix the bug", hooks=fleet.hooks)

How the SDK runs the calls of one model response (openai-agents 0.24, ``run_internal/tool_actions.py``):
every function call of the response becomes its own asyncio task (``gather_with_cancel``), each calling
``FunctionTool.on_invoke_tool(ToolContext, arguments_json)``; ``RunHooks.on_llm_end`` is awaited with the
whole ``ModelResponse`` before any of them starts. So :class:`FleetTools` keeps the fleet's plan rule across
the calls of one response: ``on_llm_end`` registers the response's calls of fleet tools as one turn, in
model order, *unarmed* (no worker runs any of them yet); the first ``on_invoke_tool`` arms it, and each
invocation awaits its own call's result by call id (``ToolContext.tool_call_id``). A conflicting write pair
in one response therefore runs in model order, reads side by side, exactly as with
:meth:`~toolfleet.Dispatcher.submit`.

What the SDK does not allow (README, "OpenAI Agents SDK"):

- The turn is armed as a whole: a call the SDK itself decides not to run (a tool input guardrail rejects
  it, or the SDK's ``needs_approval`` holds it) while a sibling of the same response runs, still runs on
  the fleet. Use the fleet's policy for approvals (held calls wait for ``toolfleet approve``); the
  FunctionTools made here set neither ``needs_approval`` nor guardrails.
- Without ``hooks=fleet.hooks`` (or :meth:`FleetTools.on_llm_end` called from your own hooks) each call
  is its own turn: one result per call still holds, the plan rule across calls does not.
- The SDK's ``timeout_seconds`` would cancel one invocation task; the fleet's per-call time limits
  (``ToolSpec.timeout_s``, enforced on the worker, ``TIMEOUT`` result) are used instead, so it is left unset.

Cancelling the run (cancelling the task awaiting ``Runner.run``) cancels the turn of the response being
run: calls not started never start, running ones are stopped (``CANCELLED`` / ``NOT_EXECUTED``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from contextlib import suppress
from typing import Any

try:
    from agents import FunctionTool, RunHooks
    from agents.items import ModelResponse
except ImportError as exc:  # the core needs none of this: say how to get it
    raise ImportError(f"toolfleet.integrations.agents_sdk needs openai-agents: pip install 'toolfleet[agents]' "
                      f"({exc})") from exc

from ..aio import _in_thread, _quietly, _start
from ..errors import ToolfleetError
from ..models import ErrorCode, ToolCall, ToolResult

_KEPT_TURNS = 100  # FleetTools.turns: the latest fleet turns opened (a long-lived server opens them without end)


class _Batch:
    """One fleet turn and a future per call id, set by one thread reading ``turn.as_completed``."""

    def __init__(self, turn: Any, calls: Sequence[ToolCall], timeout_s: float, completed: deque[str],
                 final_wait_s: float = 0.0) -> None:
        self.turn = turn
        self.final_wait_s = final_wait_s  # after a give-up's cancel: how long the final results may take
        self.completed = completed
        self.calls = {c.id: c for c in calls}
        self.futures = {c.id: concurrent.futures.Future() for c in calls}
        self.invoked: set[str] = set()
        self._arm_lock = threading.Lock()
        self._thread = threading.Thread(target=self._collect, args=(timeout_s,), daemon=True,
                                        name=f"toolfleet-agents-{turn.turn_id[:8]}")
        self._thread.start()

    def _collect(self, timeout_s: float) -> None:
        try:
            for result in self.turn.as_completed(timeout_s):
                future = self.futures.get(result.call_id)
                if future is not None and not future.done():
                    self.completed.append(result.call_id)
                    future.set_result(result)
        except BaseException as exc:  # timeout (the turn was cancelled), Redis gone for good
            # A give-up cancelled the turn: a call that was running gets its own final result
            # (CANCELLED, OUTCOME_UNKNOWN) within the cancel grace; telling the model it never ran
            # (NOT_EXECUTED, "try the call again") before then would have it repeat a write that ran.
            if isinstance(exc, TimeoutError):
                self.turn.wait(self.final_wait_s)
            for call_id, future in self.futures.items():
                if not future.done():
                    late = self.turn.result(call_id)
                    future.set_result(late if late is not None else _unknown(self.calls[call_id], exc))

    def arm(self) -> None:
        with self._arm_lock:
            if not self.turn.armed:
                self.turn.arm()

    def finished(self) -> bool:
        return all(f.done() for f in self.futures.values())

    def cancel(self, reason: str) -> None:
        if not self.turn.done:
            with suppress(ToolfleetError):
                self.turn.cancel(reason)


def _unknown(call: ToolCall, exc: BaseException) -> ToolResult:
    """A call of a submitted turn whose result never came: it may have run, so never ``NOT_EXECUTED``."""
    return ToolResult.failure(call.id, call.name, ErrorCode.OUTCOME_UNKNOWN,
                              f"the fleet gave no result, and the call may have run: {exc}",
                              "check its effect before repeating it")


def _failure(call: ToolCall, exc: BaseException) -> ToolResult:
    return ToolResult.failure(call.id, call.name, ErrorCode.NOT_EXECUTED, f"the fleet gave no result: {exc}",
                              "try the call again")


class FleetTools:
    """The tools of ``dispatcher.registry`` as Agents SDK ``FunctionTool`` objects (``tools``) and the
    ``RunHooks`` (``hooks``) that make each model response one fleet turn.

    ``workspace`` and ``session_id`` are those of :meth:`~toolfleet.Dispatcher.open_turn`; ``names``
    limits the tools offered; ``timeout_s`` bounds the wait for one response's results (seconds; when
    it passes the turn is cancelled and the waiting calls get a ``NOT_EXECUTED``/``CANCELLED`` text).
    ``strict`` asks the SDK for strict JSON schemas (only valid when every parameter is required).
    The invocation returns the result's ``content`` (the text the model reads; an error's text starts
    with ``Error [CODE]``); no exception reaches the SDK. Call :meth:`close` (or use ``with``) when done:
    a turn whose calls the SDK never invoked is cancelled then.
    """

    def __init__(self, dispatcher: Any, *, workspace: str | None = None, session_id: str | None = None,
                 timeout_s: float = 600.0, names: Iterable[str] | None = None, strict: bool = False) -> None:
        self.dispatcher = dispatcher
        self.workspace = workspace
        self.session_id = session_id
        self.timeout_s = timeout_s
        wanted = set(names) if names is not None else None
        self.specs = {s.name: s for s in dispatcher.registry if wanted is None or s.name in wanted}
        self.tools = [self._function_tool(spec, strict) for spec in self.specs.values()]
        self.hooks = _FleetHooks(self)
        self._batches: dict[str, _Batch] = {}  # call id -> the turn it belongs to
        self._lock = threading.Lock()
        # the latest fleet turns opened, in order, and the call ids of their results in the order they
        # came in (for inspection and tests); older ones are let go
        self.turns: deque[Any] = deque(maxlen=_KEPT_TURNS)
        self.completed: deque[str] = deque(maxlen=_KEPT_TURNS * 20)

    def _function_tool(self, spec: Any, strict: bool) -> FunctionTool:
        async def invoke(ctx: Any, arguments: str) -> str:
            return await self.invoke(spec.name, getattr(ctx, "tool_call_id", None), arguments)

        return FunctionTool(name=spec.name, description=spec.description or spec.name,
                            params_json_schema=spec.parameters, on_invoke_tool=invoke, strict_json_schema=strict)

    async def on_llm_end(self, response: ModelResponse) -> None:
        """Register the fleet calls of ``response`` as one unarmed turn (model order). Earlier turns
        with calls the SDK never invoked are cancelled first. A batch that cannot be registered
        (duplicate ids, Redis trouble) falls back to one turn per call at invocation."""
        self._cancel_leftovers("the Agents SDK did not run this call")
        calls = []
        for item in response.output:
            if getattr(item, "type", None) == "function_call" and item.name in self.specs:
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or "",
                                      index=len(calls)))
        with self._lock:
            if not calls or any(c.id in self._batches for c in calls):
                return
        try:
            batch = await _start(lambda: self._open(calls, False),
                                 lambda b: b.cancel("the agent run was cancelled"), name="toolfleet-agents-open")
        except (ToolfleetError, TimeoutError):
            return
        with self._lock:
            for call in calls:
                self._batches[call.id] = batch

    def _open(self, calls: Sequence[ToolCall], armed: bool) -> _Batch:
        turn = self.dispatcher.open_turn(armed=False, workspace=self.workspace, session_id=self.session_id)
        try:
            turn.add_calls(calls, raise_errors=True)
            if armed:
                turn.arm()
        except BaseException:
            with suppress(ToolfleetError):
                self.dispatcher.ledger.cancel(turn.turn_id, "submission failed")
            turn.abandon()
            raise
        turn.close()
        self.turns.append(turn)
        settings = self.dispatcher.settings
        return _Batch(turn, calls, self.timeout_s, self.completed,
                      final_wait_s=settings.cancel_grace_s + settings.kill_grace_s + 10.0)

    async def invoke(self, name: str, call_id: str | None, arguments: str) -> str:
        """Run one call on the fleet and return the text the model reads. Cancelling the awaiting
        task cancels the call's turn."""
        with self._lock:
            batch = self._batches.get(call_id) if call_id else None
            if batch is not None and call_id in batch.invoked:
                # invoked before: this is another call under a reused id (``call_0`` in every
                # conversation of some providers), never the old call's result
                batch = None
        call_id = call_id or f"call_{uuid.uuid4().hex}"
        cancelled = "the agent run was cancelled"
        try:
            if batch is None:
                call = ToolCall(id=call_id, name=name, arguments=arguments)
                batch = await _start(lambda: self._open([call], True), lambda b: b.cancel(cancelled),
                                     name="toolfleet-agents-open")
                with self._lock:
                    self._batches[call_id] = batch
            else:
                await _in_thread(batch.arm, name="toolfleet-agents-arm")
            batch.invoked.add(call_id)
            result = await asyncio.shield(asyncio.wrap_future(batch.futures[call_id]))
        except asyncio.CancelledError:
            # In this thread, before CancelledError propagates: a cancel handed to another task or
            # to a thread may never start (asyncio.run cancels every task left when the run ends).
            if batch is not None:
                _quietly(lambda: batch.cancel(cancelled))
            raise
        except (ToolfleetError, TimeoutError) as exc:
            return _failure(ToolCall(id=call_id, name=name, arguments=arguments), exc).content
        finally:
            # the call is answered (or given up): its entry goes, or a long-lived FleetTools serving
            # runs without hooks would keep every turn by call id; a call id seen again is a new call
            if batch is not None:
                with self._lock:
                    if self._batches.get(call_id) is batch:
                        del self._batches[call_id]
        return result.content

    def _cancel_leftovers(self, reason: str) -> None:
        """Forget finished turns; cancel those with calls the SDK never invoked."""
        with self._lock:
            batches = list({id(b): b for b in self._batches.values()}.values())
        for batch in batches:
            if batch.finished() or not batch.calls.keys() <= batch.invoked:
                batch.cancel(reason)  # nothing to do when finished
                with self._lock:
                    for call_id in batch.calls:
                        self._batches.pop(call_id, None)

    def close(self) -> None:
        """Cancel every turn with calls the SDK never invoked or results still out."""
        with self._lock:
            batches = {id(b): b for b in self._batches.values()}.values()
            self._batches.clear()
        for batch in batches:
            batch.cancel("the agent run ended")

    def __enter__(self) -> FleetTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FleetHooks(RunHooks):
    """``RunHooks`` that register each model response's fleet calls as one turn (:meth:`FleetTools.on_llm_end`).
    To keep hooks of your own, subclass ``RunHooks`` and call ``await fleet.on_llm_end(response)`` from your
    ``on_llm_end``."""

    def __init__(self, fleet: FleetTools) -> None:
        self._fleet = fleet

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        await self._fleet.on_llm_end(response)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        await asyncio.to_thread(self._fleet._cancel_leftovers, "the agent produced its final output")
