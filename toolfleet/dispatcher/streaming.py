"""Early dispatch from a stream: each call is taken by its turn the moment its arguments are
complete, before the stream ends (docs/design.md, step 1 for streams).

:class:`TurnStream` sits between a provider's event stream and a :class:`Turn`: ``feed`` each
event as it arrives; a call whose arguments the event completed is validated, planned against the
earlier calls and submitted before ``feed`` returns. ``close`` at the end of the stream takes the
calls still open (a call whose end was never signalled gets ``INVALID_ARGUMENT``: its arguments
may be cut short), rebuilds the assistant message and closes the turn. Results come back in model
order, as for a whole response. A call the stream itself says the output token limit cut off
(Chat ``finish_reason: "length"``, a Responses item ``status: "incomplete"``) gets
``INVALID_ARGUMENT`` as it completes, as it does when the response comes whole
(:mod:`.adapters.cut_off`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable, Sequence
from typing import Any, NoReturn

from ..errors import BatchRejected, ToolfleetError
from ..models import ErrorCode, ToolCall, ToolResult
from .adapters import detect_event, get_adapter
from .adapters.client_tools import client_results, is_client_call
from .adapters.custom_calls import custom_call_result
from .adapters.cut_off import cut_off_result
from .adapters.namespaces import resolve as resolve_namespaces
from .adapters.openai_responses import OUTPUT_OF
from .turn import Turn
from .wire import call_id_problem

log = logging.getLogger(__name__)


class TurnStream:
    """Feeds one stream into one turn. Use as a context manager or call :meth:`close` at the end.

    ``format`` is a stream format name (``openai_chat_stream``, ``openai_responses_stream``,
    ``anthropic_stream``, or the plain format names) or None to tell it from the first event
    that says. ``feed``, ``close`` and ``abort`` may come from different threads (the asyncio API
    aborts on one thread while a cancelled task's ``feed`` still runs on another): they take turns,
    so an abort sees every call a feed before it took, and a feed after it raises.
    """

    def __init__(self, turn: Turn, format: str | None = None) -> None:
        self.turn = turn
        self.adapter: Any = None
        self.parser: Any = None
        self.events_read = 0
        self._pending: list[Any] = []  # events read before the format could be told
        self._aborting = False
        self._lock = threading.RLock()  # one feed/close/abort at a time (the parser is not thread-safe)
        if format is not None:
            self._use(_stream_adapter(format))

    def _use(self, adapter: Any) -> None:
        self.adapter = adapter
        self.parser = adapter.parser()
        self.turn.adapter = adapter

    def feed(self, event: Any) -> list[ToolCall]:
        """Read one event; returns the calls it completed (already validated and submitted).

        Raises :class:`BatchRejected` when an event cannot be read or a completed call has no id
        or repeats an earlier id: the turn is then cancelled (calls not started never start,
        running ones are stopped) and closed; any other error of the parser does the same.
        :class:`~toolfleet.errors.ToolfleetError` once the turn is closed.
        """
        with self._lock:
            return self._feed(event)

    def _feed(self, event: Any) -> list[ToolCall]:
        if self.turn.closed:
            raise ToolfleetError(f"turn {self.turn.turn_id} is closed; its stream takes no more events")
        self.events_read += 1
        if self.parser is None:
            found = detect_event(event)
            if found is None:
                self._pending.append(event)
                return []
            self._use(found)
            events, self._pending = [*self._pending, event], []
        else:
            events = [event]
        try:
            calls = [call for e in events for call in self.parser.feed(e)]
        except BatchRejected as exc:
            # an unreadable event, or a call toolfleet cannot answer (.adapters.client_tools): the
            # turn ends here, as it would have refused the same response sent whole
            self._refuse(exc)
        except Exception as exc:
            self._abort(f"the stream's parser failed: {type(exc).__name__}")
            raise
        return self._take(calls, cut_off=self.parser.cut_off)  # an event may complete a call by cutting it off

    def close(self) -> Turn:
        """End of the stream: take the calls still open, rebuild the assistant message, close the
        turn and return it. Idempotent. Raises :class:`BatchRejected` as :meth:`feed` does, the turn
        then cancelled and closed (``unknown_format``: no event so far said which format it is);
        anything else it raises (:class:`~toolfleet.errors.BrokerUnavailable`: Redis did not answer
        as the last calls were taken) ends the turn the same way, without waiting for Redis."""
        with self._lock:
            try:
                return self._close()
            except BatchRejected:
                raise
            except BaseException as exc:
                self._abort(f"the stream's close failed: {type(exc).__name__}", wait=False)
                raise

    def _close(self) -> Turn:
        if self.turn.closed:
            return self.turn
        if self.parser is None:
            if self._pending:
                try:
                    adapter = _stream_adapter(None, self._pending)
                except BatchRejected as exc:  # no call could be read: the turn ends all the same
                    self._refuse(exc)
                self._use(adapter)
                for event in self._pending:
                    self._take(self.parser.feed(event), cut_off=self.parser.cut_off)
            else:
                self.turn.close()
                return self.turn
        calls = self.parser.finish()
        self._take(calls, cut_off=self.parser.cut_off)
        self.turn.response = self.parser.response()
        return self.turn.close()

    def abort(self, reason: str, *, wait: bool = True) -> Turn:
        """The stream failed (its reader raised, the caller gave up): cancel the turn and close it,
        as leaving the ``with`` block by an exception does. Calls begun and not taken get
        ``NOT_EXECUTED``; calls taken keep running only until the cancel reaches them. ``wait``:
        wait for Redis to take the cancel (:meth:`Turn.cancel`, raises what Redis raises) or not
        (:meth:`Turn.cancel_soon`: the turn's driver sends it until Redis does; raises nothing
        from Redis). After :meth:`close` (the stream ended, then the caller gave up) it cancels the
        turn all the same. Idempotent; returns the turn, closed even when the cancel raised."""
        with self._lock:
            if not self.turn.closed:
                self._abort(reason, wait=wait)
            elif not self.turn.done:  # done: every call has its result, nothing is left to cancel
                self._cancel(reason, wait)
        return self.turn

    def _cancel(self, reason: str, wait: bool) -> None:
        """:meth:`Turn.cancel` (waits for Redis, raises what it raises) or, without ``wait``,
        :meth:`Turn.cancel_soon` unless the turn is cancelled already."""
        if wait:
            self.turn.cancel(reason)
        elif not self.turn.cancelled:
            self.turn.cancel_soon(reason)

    @property
    def warnings(self) -> list[str]:
        """What the parser ignored, and why."""
        return list(self.parser.warnings) if self.parser is not None else []

    def _take(self, calls: list[ToolCall], cut_off: Collection[str] = ()) -> list[ToolCall]:
        """Give ``calls`` to the turn; returns them as taken (a namespaced Responses call named by
        the fleet tool it runs: :mod:`.adapters.namespaces`). ``cut_off``: the parser's ids of calls
        the stream cut off so far (made a set only when an event completes calls: linear in the stream)."""
        if not calls:
            return calls
        cut_off = set(cut_off)
        namespaces = getattr(self.parser, "namespaces", None)  # Responses: a namespaced function's fleet tool
        if namespaces:
            calls = resolve_namespaces(calls, namespaces, self.turn.registry.__contains__)
        why = getattr(self.parser, "cut_why", {})  # the token limit cut them off, as the stream said
        failed = {
            call.id: cut_off_result(call, why[call.id]) if call.id in why else ToolResult.failure(
                call.id, call.name, ErrorCode.INVALID_ARGUMENT,
                "the stream ended before the arguments of this call were complete; it did not run",
                "send the call again in full.",
            )
            for call in calls
            if call.id in cut_off
        }
        custom = getattr(self.parser, "custom", ())
        failed.update({call.id: custom_call_result(call) for call in calls if call.id in custom})
        client = getattr(self.parser, "client", None)  # Responses: built-in tools the client executes
        if client:
            answers = client_results(calls, client, lambda name: self.turn.registry.get(name) is not None)
            failed.update({k: v for k, v in answers.items() if k not in failed})
        try:
            self.turn.add_calls(calls, failed=failed)
        except BatchRejected as exc:  # none of them taken: those the turn could take get NOT_EXECUTED
            self._refuse(exc, released=calls)
        return calls

    def _refuse(self, exc: BatchRejected, released: Sequence[ToolCall] = ()) -> NoReturn:
        """The stream is refused at this event: cancel and close the turn, and raise ``exc`` saying so.
        ``released``: the calls this event completed, refused with it (none of them was taken)."""
        # a call toolfleet cannot answer (a computer_call) is left out by its id; a repeated id's
        # first call is answered and a bad id is no call id (:func:`_takeable` sees to both; the
        # error's ids are escaped, and could name a good call)
        refused = exc.call_ids if exc.reason == "unanswerable_call" else ()
        self._abort(f"stream refused: {exc.reason}", refused=refused, released=released)
        raise BatchRejected(
            f"{exc} (at stream event {self.events_read}; calls taken before it keep running or "
            "finished results, calls not started were cancelled)",
            reason=exc.reason,
            call_ids=exc.call_ids,
            pointer=exc.pointer,
        ) from exc

    def _abort(self, reason: str, refused: Collection[str] = (), released: Sequence[ToolCall] = (),
               wait: bool = True) -> None:
        """Cancel and close the turn (idempotent). The calls the stream had begun and not taken
        (``released``: those the refused event completed; then those still open) are taken as
        ``NOT_EXECUTED``, but for those the turn cannot take (``refused`` ids: a computer_call, a
        repeated id; an id that is missing or no call id; a second call of one id), and the
        assistant message is rebuilt from the events so far with the calls taken only
        (:func:`answered_only`), so ``turn.assistant_messages()`` still pairs with ``turn.messages()``.
        The turn is closed even when the cancel raises (then raised after): it is cancelled here
        (:meth:`Turn.cancel` marks it before it sends), so the calls begun get ``NOT_EXECUTED``."""
        if self.turn.closed or self._aborting:
            return
        self._aborting = True
        try:
            self._cancel(reason, wait)
        finally:
            self._end_aborted(reason, refused, released)

    def _end_aborted(self, reason: str, refused: Collection[str], released: Sequence[ToolCall]) -> None:
        """The rest of :meth:`_abort`, once the turn is cancelled: answer the calls begun, rebuild
        the message, close the turn."""
        if self.parser is not None:
            try:
                rest = _takeable([*released, *self.parser.finish()], {*refused, *(c.id for c in self.turn.calls)})
                self.turn.add_calls(rest, failed={c.id: ToolResult.failure(
                    c.id, c.name, ErrorCode.NOT_EXECUTED,
                    f"the stream ended early ({reason}) before this call was taken; it did not run",
                    "send the call again in full.") for c in rest})
            except Exception:  # noqa: BLE001 - the turn still ends; a call it could not take has no result
                log.warning("turn %s: the calls the stream had begun could not be answered NOT_EXECUTED",
                            self.turn.turn_id, exc_info=True)
            try:
                self.turn.response = answered_only(self.parser.response(), {c.id for c in self.turn.calls})
            except Exception:  # noqa: BLE001 - the events so far may not rebuild; the turn still ends
                pass
        self.turn.close()

    def __enter__(self) -> TurnStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """Leaving the block closes the turn; leaving it by an exception (the stream's reader
        failed, the caller's own code raised, a KeyboardInterrupt) cancels it first: the caller was
        told the stream failed, so no call of it starts later (calls not started never start,
        running ones are stopped, finished ones keep their results)."""
        if exc_type is None:
            self.close()
            return
        reason = f"the stream was left by an exception: {exc_type.__name__}"
        try:
            self.abort(reason)  # closed in the block (close()), then the block raised: cancelled all the same
        except Exception as exc:  # noqa: BLE001 - the block's own exception goes on, not this one
            log.warning("turn %s: could not cancel it after %s (%s: %s); the dispatcher's exit hook or the turn's "
                        "lease ends it", self.turn.turn_id, reason, type(exc).__name__, exc)


def answered_only(response: Any, taken: Collection[str]) -> Any:
    """The rebuilt ``response`` (a Chat completion, an Anthropic message, a Responses response)
    with only the calls its turn took (``taken`` ids; the first call of each id), so each call it
    lists has its result: a call the turn refused (no usable id, a repeated id, a computer_call)
    left in it would make the next request unpaired. Anything else is kept as it is."""
    seen: set[str] = set()

    def keep(call_id: Any) -> bool:
        if not isinstance(call_id, str) or call_id not in taken or call_id in seen:
            return False
        seen.add(call_id)
        return True

    if not isinstance(response, dict):
        return response
    if isinstance(response.get("choices"), list):  # Chat
        choices = []
        for choice in response["choices"]:
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
                calls = [c for c in message["tool_calls"] if isinstance(c, dict) and keep(c.get("id"))]
                rest = {k: v for k, v in message.items() if k != "tool_calls"}
                choice = {**choice, "message": {**rest, "tool_calls": calls} if calls else rest}
            choices.append(choice)
        return {**response, "choices": choices}
    if isinstance(response.get("output"), list):  # Responses
        return {**response, "output": [i for i in response["output"] if not isinstance(i, dict)
                                       or not (i.get("type") in tuple(OUTPUT_OF) or is_client_call(i))
                                       or keep(i.get("call_id"))]}
    if isinstance(response.get("content"), list):  # Anthropic
        return {**response, "content": [b for b in response["content"] if not isinstance(b, dict)
                                        or b.get("type") != "tool_use" or keep(b.get("id"))]}
    return response


def _takeable(calls: Iterable[ToolCall], taken: Collection[str]) -> list[ToolCall]:
    """``calls`` the turn can still take, in order: a call id, none of ``taken``, the first of its id."""
    seen = set(taken)
    out = []
    for call in calls:
        if call.id and call_id_problem(call.id) is None and call.id not in seen:
            seen.add(call.id)
            out.append(call)
    return out


def _stream_adapter(format: str | None, events: list[Any] | None = None) -> Any:
    if format is None:
        from .adapters import detect

        adapter = detect(events or [])
    else:
        adapter = get_adapter(format)
        if not adapter.streamed:
            adapter = get_adapter(f"{adapter.name}_stream")
    if not adapter.streamed:
        raise BatchRejected(f"{adapter.name} is not a stream format", reason="unknown_format")
    return adapter
