"""The asyncio API: awaitable submit, ``async for`` over results as they finish, awaitable results.

It wraps the synchronous :class:`~toolfleet.Dispatcher` and :class:`~toolfleet.Turn` (whose
driver is already a thread reading Redis by push), so every guarantee is theirs: the plan rule, one
result per call, model order, approvals by call id. What it adds is the asyncio contract:

- Nothing blocks the event loop. Blocking steps (submitting, which talks to Redis and the broker)
  run in a worker thread; waiting for results is a daemon thread per wait that hands the outcome to
  the loop with ``call_soon_threadsafe`` (not the loop's default executor, whose few threads many
  waiting turns would exhaust).
- **Cancelling the awaiting task cancels the turn.** When a task awaiting :meth:`AsyncTurn.results`,
  :meth:`AsyncTurn.messages`, :meth:`AsyncTurn.wait_settled`, an ``async for`` over
  :meth:`AsyncTurn.as_completed`, or :meth:`AsyncDispatcher.run` / ``submit`` is cancelled
  (``task.cancel()``, ``asyncio.timeout``, ``wait_for``, a ``TaskGroup`` failing), the turn is
  cancelled (:meth:`Turn.cancel`: calls not started never start, running calls are stopped, finished
  calls keep their results) and ``CancelledError`` propagates as asyncio expects. A cancel during
  ``submit`` cancels the turn as soon as its submission returns. The cancel does not wait for Redis
  on the loop's thread (:meth:`Turn.cancel_soon`). Pass ``cancel_turn=False`` to a
  wait to only stop waiting. Source: docs/design.md, "Cancellation and time" and "Around the loop people
  already run"; docs/guarantees.md row AIO1.
- The waiter threads end when the turn is done; after a cancel that is within ``cancel_grace_s``
  (+ a little), so no thread outlives the turn by more than that.

Usage::

    async with AsyncDispatcher(settings, registry) as fleet:
        turn = await fleet.submit_response(response)
        async for result in turn.as_completed():
            ...
        messages = await turn.messages()

        async with fleet.open_stream() as stream:          # early dispatch from an async stream
            async for event in await client.chat.completions.create(..., stream=True):
                await stream.feed(event)
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from .dispatcher.approvals import PendingCall
from .dispatcher.client import Dispatcher
from .dispatcher.turn import Turn
from .models import ToolCall, ToolResult
from .policy.config import Policy
from .policy.rules import Rule
from .settings import Settings
from .tools.registry import Registry

T = TypeVar("T")
log = logging.getLogger(__name__)

_END = object()


async def _in_thread(fn: Callable[[], T], *, on_cancel: Callable[[], None] | None = None,
                     name: str = "toolfleet-aio") -> T:
    """Run the blocking ``fn`` in a daemon thread and await its outcome. When the awaiting task is
    cancelled, ``on_cancel`` runs (in the loop's thread, before ``CancelledError`` propagates).
    ``fn`` runs in a copy of the awaiting task's context variables, as with ``asyncio.to_thread``:
    a new thread starts with none, and a turn takes the caller's current span (OpenTelemetry's
    context) as its trace's parent."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def target() -> None:
        try:
            value, exc = context.run(fn), None
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting task as is
            value, exc = None, error
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the loop closed meanwhile: nobody awaits it any more
            pass

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        return await future
    except asyncio.CancelledError:
        if on_cancel is not None:
            _quietly(on_cancel)
        raise


async def _start(fn: Callable[[], T], undo: Callable[[T], None], *, name: str,
                 undo_soon: Callable[[T], None] | None = None) -> T:
    """Run the blocking ``fn`` (which starts something: a turn, a stream) in a thread and await it.
    When the awaiting task is cancelled, ``undo`` gets what ``fn`` started the moment ``fn`` returns
    it (in ``fn``'s thread), or ``undo_soon`` (default ``undo``) at once if it is there: in the
    loop's thread, so it must not wait for Redis."""
    lock = threading.Lock()
    state: dict[str, Any] = {}

    def run() -> T:
        value = fn()
        with lock:
            state["value"] = value
            late = state.get("cancelled", False)
        if late:  # the awaiting task was cancelled while fn ran
            _quietly(lambda: undo(value))
        return value

    def on_cancel() -> None:
        with lock:
            state["cancelled"] = True
            started = "value" in state
        if started:
            (undo_soon or undo)(state["value"])

    return await _in_thread(run, on_cancel=on_cancel, name=name)


def _quietly(action: Callable[[], None]) -> None:
    """Run a cancel on the way out of a cancelled task: a failure (Redis gone: the turn's lease then
    lapses within ``turn_lease_s`` and workers refuse its calls) is logged, never raised over the
    ``CancelledError``."""
    try:
        action()
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("could not cancel the turn of a cancelled task (%s); its lease lapses by itself", exc)


class AsyncTurn:
    """The asyncio face of a :class:`~toolfleet.Turn` (``.turn`` is the synchronous handle).

    Every wait takes ``timeout_s`` (None: until the turn is done) and ``cancel_turn`` (default
    True: a cancelled awaiting task cancels the turn). A ``timeout_s`` that passes behaves as in
    :meth:`Turn.results`: the turn is cancelled and ``TimeoutError`` raised.
    """

    def __init__(self, turn: Turn) -> None:
        self.turn = turn

    @property
    def turn_id(self) -> str:
        return self.turn.turn_id

    @property
    def calls(self) -> list[ToolCall]:
        return self.turn.calls

    @property
    def done(self) -> bool:
        return self.turn.done

    @property
    def pending(self) -> list[PendingCall]:
        """The calls waiting for a person's approval, in model order."""
        return self.turn.pending

    def result(self, call_id: str) -> ToolResult | None:
        """The result of ``call_id`` if it is in, else None (does not wait)."""
        return self.turn.result(call_id)

    def cancel(self, reason: str = "cancelled by caller") -> None:
        """Cancel the turn (:meth:`Turn.cancel`); returns at once, without waiting for Redis on the
        loop's thread (:meth:`Turn.cancel_soon`: a cancel Redis does not take is sent on by the
        turn's driver until it does)."""
        self.turn.cancel_soon(reason)

    def _canceller(self, cancel_turn: bool) -> Callable[[], None] | None:
        if not cancel_turn:
            return None
        return lambda: self.turn.cancel_soon("the awaiting asyncio task was cancelled")

    async def results(self, timeout_s: float | None = None, *, cancel_turn: bool = True) -> list[ToolResult]:
        """Every call's result, in model order (:meth:`Turn.results`). Raises ``TimeoutError``
        after ``timeout_s`` (the turn is cancelled), :class:`~toolfleet.errors.BrokerUnavailable`
        if Redis went away for good."""
        return await _in_thread(lambda: self.turn.results(timeout_s), on_cancel=self._canceller(cancel_turn),
                                name=f"toolfleet-aio-{self.turn_id}")

    async def messages(self, timeout_s: float | None = None, *, cancel_turn: bool = True) -> list[dict[str, Any]]:
        """The tool-result messages in the batch's provider format (:meth:`Turn.messages`)."""
        return await _in_thread(lambda: self.turn.messages(timeout_s), on_cancel=self._canceller(cancel_turn),
                                name=f"toolfleet-aio-{self.turn_id}")

    async def wait_settled(self, timeout_s: float | None = None, *, cancel_turn: bool = True) -> list[PendingCall]:
        """Wait until every call has its result or waits on a person; the pending calls
        (:meth:`Turn.wait_settled`; ``TimeoutError`` after ``timeout_s``, the turn left running)."""
        return await _in_thread(lambda: self.turn.wait_settled(timeout_s), on_cancel=self._canceller(cancel_turn),
                                name=f"toolfleet-aio-{self.turn_id}")

    async def as_completed(self, timeout_s: float | None = None, *, cancel_turn: bool = True
                           ) -> AsyncIterator[ToolResult]:
        """``async for result in turn.as_completed()``: each result the moment it is recorded,
        every call once (:meth:`Turn.as_completed`; one consumer per turn). Cancelling the task,
        or leaving the loop early (``break``, an exception: the generator is closed), cancels the
        turn unless ``cancel_turn=False``."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Any] = asyncio.Queue()

        def pump() -> None:
            try:
                for result in self.turn.as_completed(timeout_s):
                    loop.call_soon_threadsafe(inbox.put_nowait, result)
                item: Any = _END
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consuming task
                item = exc
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the loop closed: nobody consumes
                pass

        threading.Thread(target=pump, name=f"toolfleet-aio-{self.turn_id}", daemon=True).start()
        finished = False
        try:
            while True:
                item = await inbox.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished and cancel_turn:  # cancelled, or the consumer left early
                _quietly(lambda: self.turn.cancel_soon("the awaiting asyncio task stopped consuming the results"))

    async def approve(self, call_id: str, *, by: str | None = None, remember: str | bool = False) -> Rule | None:
        """Approve the held call ``call_id`` (:meth:`Turn.approve`; raises
        :class:`~toolfleet.errors.NotPending`)."""
        return await asyncio.to_thread(self.turn.approve, call_id, by=by, remember=remember)

    async def deny(self, call_id: str, reason: str = "a person denied it", *, by: str | None = None,
                   remember: str | bool = False) -> Rule | None:
        """Deny the held call ``call_id`` (:meth:`Turn.deny`; raises
        :class:`~toolfleet.errors.NotPending`)."""
        return await asyncio.to_thread(self.turn.deny, call_id, reason, by=by, remember=remember)

    def assistant_messages(self) -> list[dict[str, Any]]:
        return self.turn.assistant_messages()


class AsyncTurnStream:
    """``async with fleet.open_stream(...) as stream: await stream.feed(event)`` for each event of a
    provider stream (an ``AsyncOpenAI``/``AsyncAnthropic`` stream, say): each call is submitted the
    moment its arguments are complete (:class:`~toolfleet.TurnStream`); :attr:`turn` is the
    :class:`AsyncTurn`. Leaving the block closes the turn (no more calls); leaving it by an exception
    (the task was cancelled, the stream's reader failed) cancels the turn first, as ``TurnStream``
    does. ``feed`` raises :class:`~toolfleet.errors.BatchRejected` as ``TurnStream.feed`` does."""

    def __init__(self, dispatcher: Dispatcher, format: str | None, options: dict[str, Any]) -> None:
        self._dispatcher, self._format, self._options = dispatcher, format, options
        self._stream: Any = None
        self.turn: AsyncTurn | None = None

    async def open(self) -> AsyncTurnStream:
        """Open the turn (a few Redis round trips, in a thread). Idempotent."""
        if self._stream is None:
            def undo(stream: Any) -> None:  # nothing read yet: it waits for no Redis (on the loop's thread)
                stream.abort("the awaiting asyncio task was cancelled while the stream opened", wait=False)

            self._stream = await _start(lambda: self._dispatcher.open_stream(format=self._format, **self._options),
                                        undo, name="toolfleet-aio-stream")
            self.turn = AsyncTurn(self._stream.turn)
        return self

    async def feed(self, event: Any) -> list[ToolCall]:
        """Read one event; returns the calls it completed (already validated and submitted)."""
        await self.open()
        try:
            return await asyncio.to_thread(self._stream.feed, event)
        except asyncio.CancelledError:
            _quietly(lambda: self._stream.turn.cancel_soon("the awaiting asyncio task was cancelled"))
            raise

    async def close(self) -> AsyncTurn:
        """End of the stream: the calls still open are taken, the turn closed and returned."""
        await self.open()
        await asyncio.to_thread(self._stream.close)
        assert self.turn is not None
        return self.turn

    async def __aenter__(self) -> AsyncTurnStream:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._stream is None:
            return
        if exc_type is None:
            end: Callable[[], Any] = self._stream.close
        else:  # as TurnStream's own exit: the calls still open are not taken but answered NOT_EXECUTED
            why = "the awaiting asyncio task was cancelled" if issubclass(exc_type, asyncio.CancelledError) \
                else f"the stream was left by an exception: {exc_type.__name__}"
            _quietly(lambda: self._stream.turn.cancel_soon(why))  # at once, on the loop: nothing more is sent
            stream = self._stream

            def end() -> None:
                stream.abort(why, wait=False)
        await _in_thread(end, name="toolfleet-aio-close")  # its thread starts now, so the close happens
        # even if this task is cancelled again (asyncio.run cancels leftovers)


class AsyncDispatcher:
    """The asyncio face of :class:`~toolfleet.Dispatcher` (same arguments; ``.dispatcher`` is the
    synchronous one). Raises :class:`~toolfleet.errors.BrokerUnavailable` at construction if Redis
    does not answer (construction is a few blocking round trips: build it before the loop is busy,
    or with ``await asyncio.to_thread(AsyncDispatcher, ...)``)."""

    def __init__(self, settings: Settings | None = None, registry: Registry | None = None,
                 policy: Policy | None = None, *, dispatcher: Dispatcher | None = None) -> None:
        self.dispatcher = dispatcher if dispatcher is not None else Dispatcher(settings, registry, policy)

    async def _submitting(self, fn: Callable[[], Turn]) -> AsyncTurn:
        why = "the awaiting asyncio task was cancelled during submission"
        turn = await _start(fn, lambda t: t.cancel(why), undo_soon=lambda t: t.cancel_soon(why),
                            name="toolfleet-aio-submit")
        return AsyncTurn(turn)

    async def submit(self, calls: Sequence[ToolCall], **options: Any) -> AsyncTurn:
        """:meth:`Dispatcher.submit` without blocking the loop; same options and exceptions."""
        return await self._submitting(lambda: self.dispatcher.submit(calls, **options))

    async def submit_response(self, payload: Any, *, format: str | None = None, **options: Any) -> AsyncTurn:
        """:meth:`Dispatcher.submit_response` without blocking the loop."""
        return await self._submitting(lambda: self.dispatcher.submit_response(payload, format=format, **options))

    async def submit_stream(self, events: Any, *, format: str | None = None, **options: Any) -> AsyncTurn:
        """:meth:`Dispatcher.submit_stream` over an already-read iterable of events (an async
        stream: feed ``open_stream()`` yourself, each ``feed`` is short)."""
        return await self._submitting(lambda: self.dispatcher.submit_stream(events, format=format, **options))

    def open_stream(self, *, format: str | None = None, **options: Any) -> AsyncTurnStream:
        """An :class:`AsyncTurnStream` (use ``async with``); ``format`` and ``options`` as in
        :meth:`Dispatcher.open_stream`."""
        return AsyncTurnStream(self.dispatcher, format, options)

    async def run(self, calls: Sequence[ToolCall], *, timeout_s: float | None = None,
                  **options: Any) -> list[ToolResult]:
        """Submit and await every result in model order; cancelling the task cancels the turn."""
        turn = await self.submit(calls, **options)
        return await turn.results(timeout_s)

    def tools(self, format: str = "openai_chat") -> list[dict[str, Any]]:
        """The ``tools`` list of a request (:meth:`Dispatcher.tools`)."""
        return self.dispatcher.tools(format)

    async def cancel(self, turn_id: str, reason: str = "cancelled by caller") -> int:
        return await asyncio.to_thread(self.dispatcher.cancel, turn_id, reason)

    async def approve(self, turn_id: str, call_id: str, **options: Any) -> Rule | None:
        return await asyncio.to_thread(self.dispatcher.approve, turn_id, call_id, **options)

    async def deny(self, turn_id: str, call_id: str, reason: str = "a person denied it", **options: Any) -> Rule | None:
        return await asyncio.to_thread(self.dispatcher.deny, turn_id, call_id, reason, **options)

    def close(self) -> None:
        """:meth:`Dispatcher.close`, blocking (up to ``cancel_grace_s`` + 3 s); leaving ``async with``
        closes on a thread instead."""
        self.dispatcher.close()

    async def __aenter__(self) -> AsyncDispatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # close() waits for its turns' cancels and drivers (up to cancel_grace_s + CLOSE_WAIT_S, E1):
        # in a thread, so the loop's other tasks run meanwhile; it starts now, so the close happens
        # even if this task is cancelled again
        await _in_thread(self.close, name="toolfleet-aio-close")
