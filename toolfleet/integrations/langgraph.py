"""LangGraph: :class:`FleetToolNode`, a drop-in for ``ToolNode`` whose tool calls run on the fleet.

::

    fleet = Dispatcher(settings, registry, policy)
    tools = FleetToolNode(fleet)
    model = chat_model.bind_tools(tools.tools)              # the fleet's specs, declared once
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    graph.add_node("tools", tools)                          # instead of ToolNode([...])
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)   # routes to "tools" or END
    graph.add_edge("tools", "agent")
    app = graph.compile(checkpointer=InMemorySaver())

What the node does with the last message's ``tool_calls`` (an ``AIMessage``) (then its ``invalid_tool_calls``,
which get ``INVALID_ARGUMENT`` results): one fleet turn (plan rule, every call one result, limits,
policy), and one ``ToolMessage`` per call in model order, paired by ``tool_call_id``, ``status="error"``
for an error result (``artifact`` carries the result's ``status``, ``error`` code/message/hint,
``data``, ``run_ms`` and ``worker``).

**Approvals.** Calls the policy holds for a person (docs/policy.md) surface as a LangGraph
``interrupt`` whose value is ``{"turn_id": ..., "pending": [{"call_id", "name", "arguments",
"reason"}, ...]}`` (arguments with secrets masked), once every other call has its result. Resume
with ``Command(resume=answer)``; ``answer`` is a map by call id (``{"c2": "approve", "c4": {"decision":
"deny", "reason": "not on Fridays"}}``) or one decision for every pending call (``"approve"``,
``True``, ``"deny"``, ``False``, ``{"decision": ..., "reason": ...}``). A pending call the answer does
not mention stays pending and is asked about again (a second interrupt). An answer that is not
understood is a denial (fail closed), whose reason says so (:mod:`.langgraph_approvals`).

**Resume never re-runs a call.** LangGraph re-executes an interrupted node from its start. The
node's first turn id is derived from the thread id, the AIMessage's id and each call's id, name and
arguments (canonical JSON), plus, for an AIMessage without an id, the messages before it, so every
run of the node finds its batch again, and another batch (call ids such as ``call_0`` repeat across
turns) never maps to it; a recorded turn whose calls are not this batch's (ids and names, what the
ledger keeps) is never reused either: the batch then runs as a turn of its own. Without an AIMessage
id and a thread id, two batches with the same calls and the same messages before them are the same
batch (give the AIMessage an id, as ``add_messages`` does, or a thread id). In the process that
started it, the node takes its live turn back (nothing is submitted again; finished calls keep their
results) and applies the answer by call id. In another process (a server whose resumes land
anywhere), the node takes the turn over (:mod:`.takeover`): it cancels the old turn (atomically,
calls not started get ``NOT_EXECUTED``, i.e. never ran), keeps every other result, and submits only
the calls that never ran, with their call ids and model order, as a new turn, where the held ones
are held again and answered by the same resume value. A batch whose calls all ran (a replayed
checkpoint) returns the recorded results; calls that never ran (``NOT_EXECUTED``: e.g. the process
holding the turn exited, and its exit hook cancelled it) are submitted again, as in a takeover.
Several resumes at once take the turn over one after another: one that finds the next turn claimed
and not submitted yet waits, as its claimant does, for the outcome of every call that started in
the turn before, and the next turn is opened once (:mod:`.takeover`; docs/guarantees.md LG2). This
holds while the ledger keeps the turn (``result_ttl_s``, a day by default).

The thread id is also the turn's ``session_id`` (loop detection across the turns of one
conversation), unless ``session_id`` is given. Needs ``pip install 'toolfleet[langgraph]'``.
Source: docs/design.md, "Around the loop people already run" (a ToolNode replacement, the same
guarantees) and "Result contract" (a call held for approval is pending, answered by call id);
docs/guarantees.md rows LG1 and LG2.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import redis
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt

from ..aio import AsyncTurn, _in_thread
from ..dispatcher.client import Dispatcher
from ..dispatcher.turn import Turn
from ..dispatcher.wire import clean_call
from ..errors import BrokerUnavailable, ToolfleetError, TurnExists
from ..models import ErrorCode, ToolCall, ToolResult
from . import takeover
from .langgraph_approvals import _ask, answer_pending, decisions_for

__all__ = ["FleetToolNode", "decisions_for", "to_tool_messages"]

@dataclass
class _Live:
    """The batch of one node run: its live turn, and the results that stand from turns of the same
    batch that ran before it (taken over: :mod:`.takeover`)."""

    turn: Turn
    standing: dict[str, tuple[str, ToolResult]] = field(default_factory=dict)  # call id -> (turn id, result)


class FleetToolNode(RunnableLambda):
    """A LangGraph node (sync ``invoke`` and async ``ainvoke``) that runs the last AIMessage's tool
    calls as one fleet turn and returns their ``ToolMessage``s in model order.

    ``dispatcher``: the :class:`~toolfleet.Dispatcher` (its registry is what :attr:`tools` offers the
    model; its policy decides what is held for approval). ``messages_key``: the state's messages
    field. ``workspace``: the directory the file tools and commands work in, as workers see it.
    ``timeout_s`` bounds each wait of the node (results, or the other calls while some are held): when
    it passes the turn is cancelled and the calls' final results (``CANCELLED``/``NOT_EXECUTED``) are
    returned. Raises :class:`~toolfleet.errors.BrokerUnavailable` when Redis does not answer,
    :class:`~toolfleet.errors.BatchRejected` (nothing runs) when a tool call has no id or two share
    one (their ``ToolMessage``s could not be paired), :class:`~toolfleet.errors.ToolfleetError` when
    the last message is not an ``AIMessage`` (as ``ToolNode`` refuses it). Each ``ToolMessage``'s
    ``artifact["turn_id"]`` names the turn that ran it (``toolfleet trace``/``cancel`` take it).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        name: str = "tools",
        messages_key: str = "messages",
        workspace: str | None = None,
        session_id: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        super().__init__(self._run, afunc=self._arun, name=name)
        self.dispatcher = dispatcher
        self.messages_key = messages_key
        self.workspace = workspace
        self.session_id = session_id
        self.timeout_s = timeout_s
        self._turns: dict[str, _Live] = {}  # batches interrupted for approval, by batch id
        self._doomed: set[str] = set()  # batches whose async node was cancelled while submitting
        self._lock = threading.Lock()

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The fleet's tools in OpenAI format, for ``chat_model.bind_tools(node.tools)`` (one source:
        the same specs validate, plan and run the calls)."""
        return self.dispatcher.tools("openai_chat")

    # ---- the node ----
    def _run(self, state: Any, config: RunnableConfig) -> Any:
        message, calls = self._calls(state)
        if not calls:
            return self._output(state, [])
        batch = self._batch_id(config, message, calls, state)
        live = self._attach(batch, calls, config)
        if isinstance(live, list):  # ran before: its recorded results, nothing runs again
            return self._output(state, live)
        turn = live.turn
        try:
            while (pending := turn.wait_settled(self.timeout_s)) and not self._cancelled(turn.turn_id):
                answer = interrupt(_ask(turn.turn_id, pending))  # raises GraphInterrupt the first time
                answer_pending(turn, pending, answer)
            results = self._final(batch, live, calls)
        except TimeoutError:
            turn.cancel(f"the LangGraph node gave up after {self.timeout_s} s")
            results = self._final(batch, live, calls)
        except GraphInterrupt:
            raise  # paused for a person: the turn waits, held, for the resume
        except BaseException as exc:
            self._drop(batch, turn, exc)
            raise
        return self._output(state, results)

    async def _arun(self, state: Any, config: RunnableConfig) -> Any:
        """As :meth:`_run`, without blocking the loop; cancelling the awaiting task cancels the turn."""
        message, calls = self._calls(state)
        if not calls:
            return self._output(state, [])
        batch = self._batch_id(config, message, calls, state)
        live = await _in_thread(lambda: self._attach(batch, calls, config), on_cancel=lambda: self._doom(batch))
        if isinstance(live, list):
            return self._output(state, live)
        turn = AsyncTurn(live.turn)
        try:
            while ((pending := await turn.wait_settled(self.timeout_s))
                   and not await _in_thread(lambda: self._cancelled(turn.turn_id))):
                answer = interrupt(_ask(turn.turn_id, pending))
                await _in_thread(lambda a=answer, p=pending: answer_pending(turn.turn, p, a))
            results = await _in_thread(lambda: self._final(batch, live, calls), on_cancel=lambda: turn.cancel())
        except TimeoutError:
            turn.cancel(f"the LangGraph node gave up after {self.timeout_s} s")
            results = await _in_thread(lambda: self._final(batch, live, calls))
        except GraphInterrupt:
            raise
        except BaseException as exc:  # CancelledError included: the awaiting task was cancelled
            self._drop(batch, turn.turn, exc)
            raise
        return self._output(state, results)

    def cancel_interrupted(self, reason: str = "the graph was not resumed") -> list[str]:
        """Cancel every turn this node holds for an interrupt (their calls not started never start
        in it); returns their turn ids. Until then such a turn stays open (its lease renewed by this
        process), waiting for the resume. A graph resumed after all (here or elsewhere) runs the
        calls that never ran, in a new turn: a resume is a request to go on."""
        with self._lock:
            held, self._turns = list(self._turns.values()), {}
        for live in held:
            with suppress(ToolfleetError):
                live.turn.cancel(reason)
        return [live.turn.turn_id for live in held]

    # ---- steps ----
    def _calls(self, state: Any) -> tuple[AIMessage | None, list[ToolCall]]:
        messages = _messages(state, self.messages_key)
        if not messages:
            return None, []
        message = messages[-1]
        if not isinstance(message, AIMessage):  # as ToolNode: its calls are the last message's
            raise ToolfleetError(f"the last message of {self.messages_key!r} is a {type(message).__name__}, not "
                                 "the AIMessage whose tool calls this node runs (route here with tools_condition)")
        calls = [ToolCall(id=c.get("id") or "", name=c.get("name") or "", arguments=c.get("args") or {}, index=i)
                 for i, c in enumerate(message.tool_calls)]
        for bad in message.invalid_tool_calls:  # arguments the provider could not parse: the fleet says why
            calls.append(ToolCall(id=bad.get("id") or "", name=bad.get("name") or "",
                                  arguments=bad.get("args") or "", index=len(calls)))
        return message, calls

    def _batch_id(self, config: RunnableConfig, message: AIMessage | None, calls: list[ToolCall],
                  state: Any = None) -> str:
        """The id of this batch, the same every time the node runs for it (also on resume): the
        first turn's id. Seeded with the thread id, the AIMessage's id, each call's id, name and
        canonical arguments, and (an AIMessage without an id) the messages before it: a batch that
        differs in any of them gets another id."""
        thread = str((config.get("configurable") or {}).get("thread_id") or "")
        message_id = getattr(message, "id", None) or ""
        before = "" if message_id else _history_digest(_messages(state, self.messages_key)[:-1])
        seed = json.dumps([thread, message_id, before, [[c.id, c.name, _canonical(c.arguments)] for c in calls]])
        return "lg-" + hashlib.sha256(seed.encode("utf-8", "backslashreplace")).hexdigest()[:32]

    def _attach(self, batch: str, calls: list[ToolCall], config: RunnableConfig
                ) -> _Live | list[tuple[str, ToolResult]]:
        """The live turn of ``batch``: held by this node (an interrupted run), submitted now (first
        run), or taken over from the process that started it (:mod:`.takeover`); or, when every call
        already has its result, those results. A recorded turn under the batch's id whose calls are
        not this batch's (:func:`_same_calls`) is left alone: the batch runs under the next id of
        its line (``<batch>-n1``, ``-n2``, ...), found again the same way on resume."""
        with self._lock:
            live = self._turns.get(batch)
        if live is not None:
            if not takeover.moved(self.dispatcher, live.turn.turn_id):
                return live
            with self._lock:  # another process took it over meanwhile: follow the chain
                self._turns.pop(batch, None)
        for n in range(_MAX_OTHERS + 1):
            first = batch if n == 0 else f"{batch}-n{n}"
            attached = self._attach_chain(batch, first, calls, config)
            if attached is not None:
                return attached
        raise ToolfleetError(f"the tool calls of batch {batch} could not be attached to a turn (the ledger holds "
                             f"{_MAX_OTHERS + 1} other batches under its ids)")

    def _attach_chain(self, batch: str, first: str, calls: list[ToolCall], config: RunnableConfig
                      ) -> _Live | list[tuple[str, ToolResult]] | None:
        """:meth:`_attach` for the chain of turns that starts at ``first``; ``None`` when its first
        turn recorded other calls than ``calls`` (another batch)."""
        ledger = self.dispatcher.ledger
        for _ in range(takeover.MAX_CHAIN):
            tail, before, standing = takeover.follow(self.dispatcher, first)
            try:
                taken = ledger.calls(tail)
                opened = taken if tail == first else ledger.calls(first)
                recorded = ledger.results(tail) if taken else {}
                left = ledger.calls(before) if before is not None and not taken else {}
            except redis.RedisError as exc:
                raise BrokerUnavailable(self.dispatcher.settings.redis_url, str(exc)) from exc
            if opened and not _same_calls(opened, calls):
                return None  # not a replay: another batch's turn under this id
            if taken:
                ran = {cid for cid, r in recorded.items() if r.code != ErrorCode.NOT_EXECUTED}
                if all(c.id in standing or c.id in ran for c in calls):
                    return [standing.get(c.id) or (tail, recorded[c.id]) for c in calls]
                # Live elsewhere, or over with calls that never ran (its process cancelled it on exit,
                # or it was cancelled while held): the resume runs those, in a turn of its own.
                successor = f"{first}-{uuid.uuid4().hex[:8]}"
                if not takeover.claim(self.dispatcher, tail, successor):
                    continue  # another process took it over first: follow the chain again
                ended = takeover.end(self.dispatcher, tail, [c for c in calls if c.id in taken])
                standing.update({cid: (tail, r) for cid, r in ended.items() if r.code != ErrorCode.NOT_EXECUTED})
                tail = successor
            elif before is not None:
                # A successor another process claimed and has not submitted: it may still be waiting
                # for a call of ``before`` that runs (takeover.end). End ``before`` here too (its cancel
                # is done once), so such a call is waited for and stands, never sent again.
                ended = takeover.end(self.dispatcher, before, [c for c in calls if c.id in left])
                standing.update({cid: (before, r) for cid, r in ended.items() if r.code != ErrorCode.NOT_EXECUTED})
            rest = [c for c in calls if c.id not in standing]  # never ran: safe to send
            if not rest:
                return [standing[c.id] for c in calls]
            thread = (config.get("configurable") or {}).get("thread_id")
            session = self.session_id or (str(thread) if thread is not None else None)
            try:  # one process opens ``tail``: another that submits it at once gets TurnExists
                turn = self.dispatcher.submit(rest, turn_id=tail, workspace=self.workspace, session_id=session,
                                              _exclusive=True)
            except TurnExists:
                continue  # another process submitted it first: follow the chain again
            return self._keep(batch, _Live(turn, standing))
        raise ToolfleetError(f"the tool calls of batch {batch} could not be attached to a turn")

    def _cancelled(self, turn_id: str) -> bool:
        """Whether the turn was cancelled (taken over by a resume elsewhere, say): its held calls
        are then ``NOT_EXECUTED`` (the ledger's cancel, atomically), so none is asked about again,
        even while this turn's view still shows them held (the cancel's events not read yet: an
        answer just refused as ``NotPending``)."""
        try:
            return self.dispatcher.ledger.is_cancelled(turn_id)
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.dispatcher.settings.redis_url, str(exc)) from exc

    def _keep(self, batch: str, live: _Live) -> _Live:
        with self._lock:
            doomed = batch in self._doomed
            self._doomed.discard(batch)
            if not doomed:
                self._turns[batch] = live
        if doomed:  # its async node was cancelled while this was being submitted
            live.turn.cancel("the awaiting asyncio task was cancelled during submission")
        return live

    def _doom(self, batch: str) -> None:
        """An async node cancelled while its submission runs in a thread: cancel the turn now if it
        is there, else the moment :meth:`_keep` gets it."""
        with self._lock:
            live = self._turns.pop(batch, None)
            if live is None:
                self._doomed.add(batch)
        if live is not None:
            live.turn.cancel("the awaiting asyncio task was cancelled")

    def _drop(self, batch: str, turn: Turn, exc: BaseException) -> None:
        """The node failed or was cancelled (not an interrupt): the turn ends with it, so nothing of
        it runs later."""
        with self._lock:
            self._turns.pop(batch, None)
        with suppress(ToolfleetError):
            turn.cancel(f"the LangGraph node stopped ({type(exc).__name__})")

    def _final(self, batch: str, live: _Live, calls: list[ToolCall]) -> list[tuple[str, ToolResult]]:
        try:
            results = live.turn.results(self.timeout_s)
        except TimeoutError:  # the turn was cancelled by the timeout: its final results follow promptly
            results = live.turn.results(self.dispatcher.settings.cancel_grace_s + 60)
        with self._lock:
            self._turns.pop(batch, None)
        by_id = {**live.standing, **{r.call_id: (live.turn.turn_id, r) for r in results}}
        return [by_id[c.id] for c in calls]

    def _output(self, state: Any, results: list[tuple[str, ToolResult]]) -> Any:
        messages = to_tool_messages([r for _, r in results], [t for t, _ in results])
        if isinstance(state, list):
            return messages
        return {self.messages_key: messages}


def to_tool_messages(results: Sequence[ToolResult], turn_ids: Sequence[str | None] = ()) -> list[ToolMessage]:
    """One ``ToolMessage`` per result, in the given order: ``content`` the text for the model,
    ``tool_call_id`` the call id, ``status="error"`` for an error result, ``artifact`` the rest
    (``turn_id`` that ran it, from ``turn_ids``; ``status``, ``error`` code/message/hint, ``data``,
    ``run_ms``, ``worker``)."""
    out = []
    turn_ids = list(turn_ids) + [None] * (len(results) - len(turn_ids))
    for r, turn_id in zip(results, turn_ids, strict=False):
        artifact = {"turn_id": turn_id, "status": r.status, "data": r.data, "run_ms": r.run_ms, "worker": r.worker,
                    "error": r.error.model_dump(mode="json") if r.error else None}
        out.append(ToolMessage(content=r.content, tool_call_id=r.call_id, name=r.name,
                               status="error" if r.status == "error" else "success", artifact=artifact))
    return out


_MAX_OTHERS = 8  # other batches recorded under one batch id's line before the node gives up


def _canonical(arguments: Any) -> str:
    """A call's arguments as canonical JSON (keys sorted, no spaces): the same arguments, however
    written, give the same text; arguments that are not JSON (an invalid call's text) as given."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=lambda value: f"<{type(value).__name__}>")


def _history_digest(messages: Sequence[Any]) -> str:
    """A digest of the messages before the AIMessage (type, id, content, tool calls, tool call id
    of each): the same state gives the same digest on every run of the node."""
    digest = hashlib.sha256()
    for m in messages:
        part = [getattr(m, "type", type(m).__name__), getattr(m, "id", None), getattr(m, "content", None),
                [[c.get("id"), c.get("name"), c.get("args")] for c in getattr(m, "tool_calls", None) or []],
                getattr(m, "tool_call_id", None)]
        digest.update(json.dumps(part, sort_keys=True, ensure_ascii=False,
                                 default=lambda value: f"<{type(value).__name__}>").encode("utf-8", "backslashreplace"))
        digest.update(b"\n")
    return digest.hexdigest() if messages else ""


def _same_calls(recorded: dict[str, str], calls: Sequence[ToolCall]) -> bool:
    """Whether a turn's recorded calls (call id -> tool name, what the ledger keeps) are exactly
    ``calls`` (the arguments are in the turn's id)."""
    return recorded == {c.id: clean_call(c).name for c in calls}


def _messages(state: Any, key: str) -> list[Any]:
    if isinstance(state, list):
        return state
    if isinstance(state, dict):
        return list(state.get(key) or [])
    return list(getattr(state, key, None) or [])
