"""The agent side's entry point: ``Dispatcher`` turns calls, responses and streams into turns.

Path (docs/design.md): adapter in -> check ids -> validate (name, then arguments) -> plan -> register
in the ledger -> record the error results of bad calls -> submit what waits for nothing. A whole
batch goes through it at once (:meth:`Dispatcher.submit`); a stream goes through it one call at a
time as each call's arguments complete (:meth:`Dispatcher.open_stream`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis

from ..errors import BrokerUnavailable, ToolfleetError, TurnNotFound
from ..keys import hash_tag_problem
from ..ledger import Ledger
from ..models import ToolCall, ToolResult
from ..policy.config import Policy
from ..policy.loops import LoopDetector
from ..policy.rules import Rule, RuleStore
from ..settings import Settings
from ..tools.published import catalog_registry
from ..tools.registry import Registry, default_registry
from ..tools.state import SessionStore
from ..worker.app import create_app
from .adapters import Adapter, as_dict, detect, get_adapter
from .adapters.client_tools import client_results
from .adapters.custom_calls import custom_call_results
from .adapters.cut_off import cut_off_results
from .adapters.namespaces import resolve as resolve_namespaces
from .affinity import close_live_session
from .approvals import Approvals, PendingCall
from .availability import Availability
from .guard import Guard
from .locks import ResourceLocks
from .streaming import TurnStream
from .submit import Submitter
from .turn import Turn, check_ids
from .wire import call_id_problem, clean_call, encodable, tool_calls

log = logging.getLogger(__name__)
# close(): after cancelling its live turns, how long (beyond cancel_grace_s) their drivers get to record
# the final results and mark the turns ended before the connections close (docs/guarantees.md, E1)
CLOSE_WAIT_S = 3.0


class Dispatcher:
    """Runs batches of tool calls on the workers of ``settings.namespace``.

    ``registry``: the tools calls are validated and planned against. Default: the tools the live
    workers publish (their full specs, no tool code imported) over the built-in ones, re-read when
    a call names a tool it does not know (:func:`toolfleet.tools.published.catalog_registry`).
    A registry given here is used as it is: it wins over the catalog (the worker validates every
    call again against its own spec). ``policy`` decides what runs, waits for a person's approval
    or is refused (default: :meth:`Policy.permissive`); give the workers the same policy, they check it again. Raises
    :class:`~toolfleet.errors.BrokerUnavailable` at construction if Redis does not answer.
    """

    def __init__(
        self, settings: Settings | None = None, registry: Registry | None = None, policy: Policy | None = None
    ) -> None:
        self.settings = settings or Settings()
        self.policy = policy if policy is not None else Policy.permissive()
        self.ledger = Ledger(self.settings)
        self.registry = registry if registry is not None else \
            catalog_registry(self.settings, default_registry(), self.ledger.redis)
        self.app = create_app(self.settings, self.registry)
        self._turns: weakref.WeakSet[Turn] = weakref.WeakSet()
        self._turns_lock = threading.Lock()  # adding a turn vs close()'s snapshot (a WeakSet is not thread-safe)
        self._closed = False
        self.submitter = Submitter(self.app, self.settings, self.ledger.audit)
        self.rules = RuleStore(self.ledger.redis, self.ledger.keys, self.settings.redis_url)
        self.approvals = Approvals(self.ledger, self.rules)
        loops = LoopDetector(self.ledger.redis, self.ledger.keys, url=self.settings.redis_url,
                             limit=self.policy.loops.limit, ttl_s=self.settings.result_ttl_s)
        self.guard = Guard(self.policy, self.registry, self.approvals, self.rules, loops)
        self.availability = Availability(self.settings, self.ledger.redis, self.app)
        self.locks = ResourceLocks(self.settings, self.ledger.redis)
        self.sessions = SessionStore(self.ledger.redis, self.ledger.keys, url=self.settings.redis_url,
                                     default_ttl_s=self.settings.result_ttl_s)  # stored session state

    def open_session(self, session_id: str | None = None, *, state: dict[str, Any] | None = None,
                     ttl_s: int | None = None, replace: bool = False) -> str:
        """Open a session with the initial value of its stored states and return its id; pass it
        as ``session_id`` to the turns of the conversation. See
        :func:`toolfleet.dispatcher.sessions.open_session` (what is raised and when);
        ``ttl_s`` (default ``settings.result_ttl_s``): the session expires that long after it was
        opened or last saved. ``replace`` starts the session's next life as :meth:`close_session`
        and opening it would: its live shell, if it has one, is ended too."""
        from .sessions import open_session

        opened = open_session(self.sessions, self.registry, session_id, state=state, ttl_s=ttl_s, replace=replace)
        if replace:  # the old life's shell (cwd, environment, processes) is not the new life's
            self._close_live_shell(opened)
        return opened

    def close_session(self, session_id: str) -> bool:
        """Close a session: its stored states are deleted at once, and its live shell (the ``shell``
        tool's, :mod:`toolfleet.tools.shell_session`) is ended by its holder, every process of it,
        within ``min(heartbeat_s / 2, 1 s)`` (docs/guarantees.md L4). True if it had either. Raises
        :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer."""
        stored = self.sessions.close(session_id)
        return self._close_live_shell(session_id) or stored

    def _close_live_shell(self, session_id: str) -> bool:
        """End the session's live shell, if it has one (:func:`.affinity.close_live_session`);
        True if it had one. Raises :class:`BrokerUnavailable` when Redis fails."""
        try:
            return close_live_session(self.settings, session_id) is not None
        except redis.RedisError as exc:
            raise BrokerUnavailable(self.settings.ledger, str(exc)) from exc

    def open_turn(
        self,
        *,
        workspace: str | None = None,
        session_id: str | None = None,
        turn_id: str | None = None,
        adapter: Adapter | None = None,
        response: Any = None,
        armed: bool = True,
        _calls: Sequence[ToolCall] = (),
        _exclusive: bool = False,
    ) -> Turn:
        """A turn that takes calls as they come (:meth:`Turn.add_calls`) until :meth:`Turn.close`.

        ``workspace`` is the directory the file tools and commands work in (as the workers see
        it); ``session_id`` ties the turns of one conversation together for loop detection. Calls
        the policy asks about are held (``turn.pending``) until approved or denied. Raises
        :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer,
        :class:`~toolfleet.errors.ToolfleetError` if an id or the workspace is not valid Unicode, or the turn id starts
        with ``}`` (its keys' hash tag would be empty: docs/scaling.md). ``armed=False``:
        workers run none of its calls until :meth:`~toolfleet.ledger.Ledger.arm` (what
        :meth:`submit` does once the whole batch is sent).
        """
        if self._closed:
            raise ToolfleetError("this dispatcher is closed: open a new Dispatcher")
        turn_id = turn_id or uuid.uuid4().hex
        # half of each call's task id (Flower, logs), and the hash tag of the turn's keys
        problem = call_id_problem(turn_id, "turn id") or hash_tag_problem("turn id", turn_id)
        if problem:
            raise ToolfleetError(problem)
        for what, text in (("workspace", workspace), ("session_id", session_id)):  # the turn id's is checked above
            if text is not None and not encodable(text):  # Redis and JSON could not carry it
                raise ToolfleetError(f"{what} {ascii(text)} holds a lone surrogate (not valid Unicode)")
        # the calls :meth:`submit` is about to add are registered with the turn's open (one script
        # fewer per batch: the turn's first add_calls finds them there)
        registered = {call.id: clean_call(call).name for call in _calls}
        # _exclusive: a turn id another process opened raises TurnExists, nothing written (a successor
        # turn of a takeover, which several resumes may try to submit: integrations/takeover.py)
        opened = self.ledger.open_turn(turn_id, registered, armed=armed, exclusive=_exclusive)
        turn = Turn(
            turn_id=turn_id,
            registry=self.registry,
            ledger=self.ledger,
            submitter=self.submitter,
            settings=self.settings,
            workspace=workspace,
            session_id=session_id,
            adapter=adapter,
            response=response,
            guard=self.guard,
            availability=self.availability,
            locks=self.locks,
            armed=armed,
            events_after=opened,
            registered=registered,
        )
        with self._turns_lock:
            if not self._closed:  # else close() could not see it: never started, its lease lapses (E1)
                self._turns.add(turn)
                return turn.start()
        raise ToolfleetError("this dispatcher was closed while the turn opened; it did not start")

    def submit(self, calls: Sequence[ToolCall | Mapping[str, Any]], *,
               failed: Mapping[str, ToolResult] | None = None, **options: Any) -> Turn:
        """Start running ``calls`` (model order) and return the turn's handle at once.

        ``calls``: :class:`~toolfleet.models.ToolCall` objects, or dicts in their shape
        (``{"id": "c1", "name": "read_file", "arguments": {"path": "README.md"}}``; ``arguments``
        a JSON text or an object); anything else raises ``TypeError`` saying what to pass. A
        provider's whole response goes to :meth:`submit_response` instead.

        ``failed`` maps call ids to error results decided by the caller: those calls get them (under
        their own id and name) and do not run; ids of no call are ignored. ``options`` are those of
        :meth:`open_turn`. Raises :class:`~toolfleet.errors.BatchRejected` (nothing runs) if two
        calls share an id or a call has none, :class:`~toolfleet.errors.BrokerUnavailable` (naming
        the URL) if Redis or the broker does not answer: then nothing of the batch runs, even the
        calls already sent.
        """
        calls = tool_calls(calls)
        check_ids(calls)
        turn = self.open_turn(armed=False, _calls=calls, **options)
        try:
            turn.add_calls(calls, failed=failed, raise_errors=True)
            turn.arm()
        except BaseException:
            # Nothing of the batch may run: the turn is not armed, so a worker that got one of its
            # calls does not run it; cancel it too where Redis still answers, and free its locks.
            try:
                self.ledger.cancel(turn.turn_id, "submission failed")
            except TurnNotFound:
                pass
            except ToolfleetError:  # an arm whose reply was lost may have armed it: cancel once Redis is back
                _cancel_in_background(self.ledger, turn.turn_id, self.settings.turn_lease_s)
            turn.abandon()
            raise
        return turn.close()

    def submit_response(self, payload: Any, *, format: str | None = None, **options: Any) -> Turn:
        """Parse a provider response (``format``, or told from its shape) and submit its calls.

        A stream's events (a list) are accepted too and go through :meth:`submit_stream`, once
        all of them were read: a recorded stream that cannot be read is refused whole, before
        anything runs. ``turn.messages()`` then gives the tool results in the same provider's
        shape, and ``turn.assistant_messages()`` the model's own message to put before them.
        Raises :class:`~toolfleet.errors.BatchRejected` (with the JSON ``pointer``) for a payload
        that cannot be read. A call the response's token limit cut off gets ``INVALID_ARGUMENT``
        and does not run (:mod:`~toolfleet.dispatcher.adapters.cut_off`), as does a custom tool call
        (``UNKNOWN_TOOL``: :mod:`~toolfleet.dispatcher.adapters.custom_calls`). A Responses built-in
        tool item the client executes is a call answered in its own shape: shells run as
        ``run_command``, the others get the answers of
        :mod:`~toolfleet.dispatcher.adapters.client_tools`; a ``computer_call`` refuses the batch
        (reason ``unanswerable_call``) before anything runs.
        """
        adapter = get_adapter(format) if format else detect(payload)
        if adapter.streamed:
            adapter.replay(payload)
            return self.submit_stream(as_dict(payload), format=adapter.name, **options)
        calls = adapter.parse(payload)
        if hasattr(adapter, "namespaces"):  # Responses: a namespaced function's fleet tool (.adapters.namespaces)
            calls = resolve_namespaces(calls, adapter.namespaces(payload), self.registry.__contains__)
        failed = {**cut_off_results(adapter.name, payload, calls), **custom_call_results(adapter, payload, calls)}
        if hasattr(adapter, "client_calls"):  # Responses: built-in tools the client executes (.adapters.client_tools)
            failed.update(client_results(calls, adapter.client_calls(payload), self._known))
        return self.submit(calls, failed=failed, adapter=adapter, response=payload, **options)

    def _known(self, name: str) -> bool:
        """The registry has a tool called ``name`` (a catalog registry reads the catalog again first)."""
        return self.registry.get(name) is not None

    def open_stream(self, *, format: str | None = None, **options: Any) -> TurnStream:
        """A :class:`TurnStream`: ``feed`` it each event of a provider stream as it arrives; each
        call is submitted as soon as its arguments are complete. ``close`` it at the end (or use
        it as a context manager). ``format`` as in :func:`~toolfleet.dispatcher.adapters.get_adapter`,
        or None to tell it from the events."""
        return TurnStream(self.open_turn(**options), format)

    def submit_stream(self, events: Iterable[Any], *, format: str | None = None, **options: Any) -> Turn:
        """Read ``events`` to their end, submitting each call the moment its arguments are
        complete, then return the closed turn (results may still be coming)."""
        with self.open_stream(format=format, **options) as stream:
            for event in events:
                stream.feed(event)
        return stream.turn

    def tools(self, format: str = "openai_chat") -> list[dict[str, Any]]:
        """The ``tools`` list of a request in ``format`` (``chat``, ``responses``, ``anthropic``)."""
        return get_adapter(format).tools(self.registry)

    def run(self, calls: Sequence[ToolCall | Mapping[str, Any]], *, timeout_s: float | None = None,
            **options: Any) -> list[ToolResult]:
        """Submit and wait: every call's result, in model order. When ``timeout_s`` passes first the
        turn is cancelled and ``TimeoutError`` raised (giving up ends the turn: :meth:`Turn.results`)."""
        return self.submit(calls, **options).results(timeout_s)

    def cancel(self, turn_id: str, reason: str = "cancelled by caller") -> int:
        """Cancel a turn by id, from any process. Returns how many calls will never start.
        Raises :class:`~toolfleet.errors.TurnNotFound` for an unknown turn."""
        return self.ledger.cancel(turn_id, reason)

    def pending(self, turn_id: str) -> list[PendingCall]:
        """The calls of any turn (by id, from any process) waiting for a person, in model order.
        Raises :class:`~toolfleet.errors.TurnNotFound` for an unknown turn."""
        return self.approvals.pending(turn_id)

    def approve(
        self, turn_id: str, call_id: str, *, by: str | None = None, remember: str | bool = False
    ) -> Rule | None:
        """Approve a pending call of any turn; see :meth:`Turn.approve`."""
        return self.approvals.approve(turn_id, call_id, by=by, remember=remember)

    def deny(
        self, turn_id: str, call_id: str, reason: str = "a person denied it", *, by: str | None = None,
        remember: str | bool = False,
    ) -> Rule | None:
        """Deny a pending call of any turn; see :meth:`Turn.deny`."""
        return self.approvals.deny(turn_id, call_id, reason, by=by, remember=remember)

    def close(self) -> None:
        """Close the dispatcher's connections. Its turns end first: one still running is cancelled
        (reason "the dispatcher was closed": calls not started never start, running ones stop), and
        every turn's driver gets up to ``cancel_grace_s`` + :data:`CLOSE_WAIT_S` seconds in all to record
        the final results and mark its turn ended in the ledger (a driver still at it then is logged;
        its turn's lease lapses within ``turn_lease_s``, E1). Idempotent (a second call returns at once);
        raises nothing. A closed dispatcher opens no turn (:class:`~toolfleet.errors.ToolfleetError`)."""
        with self._turns_lock:
            if self._closed:
                return
            self._closed = True  # no turn opens from now on
            turns = list(self._turns)
        deadline = time.monotonic() + self.settings.cancel_grace_s + CLOSE_WAIT_S
        # each turn is cancelled in a thread of its own: with Redis frozen a cancel waits for a socket
        # timeout (BROKER_SOCKET_TIMEOUT_S), and one after another that was one timeout per turn
        cancels = [threading.Thread(target=_end_on_close, args=(turn,), name=f"toolfleet-close-{turn.turn_id[:8]}",
                                    daemon=True) for turn in turns if not turn.done]
        for thread in cancels:
            thread.start()
        for thread in cancels:
            thread.join(max(deadline - time.monotonic(), 0.0))
        for turn in turns:
            if not turn.join_driver(deadline - time.monotonic()):
                log.warning("turn %s: its driver still runs as the dispatcher closes; its lease lapses "
                            "within %g s", turn.turn_id, self.settings.turn_lease_s)
        self.submitter.close()
        self.app.close()
        self.ledger.redis.close()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _end_on_close(turn: Turn) -> None:
    """Cancel and close ``turn`` as its dispatcher closes; raises nothing (the lease covers a failure)."""
    try:
        turn.cancel("the dispatcher was closed")
        turn.close()
    except Exception as exc:  # noqa: BLE001 - closing anyway; the lease covers it
        log.warning("turn %s: could not cancel it on close (%s)", turn.turn_id, exc)


CANCEL_RETRY_S = 0.5


def _cancel_in_background(ledger: Ledger, turn_id: str, lease_s: float) -> threading.Thread:
    """Cancel a turn whose submission failed, once Redis takes it: an arm whose reply was lost
    may have armed the turn, and its calls already sent would run until its lease lapses (no
    dispatcher renews it now). Tried every :data:`CANCEL_RETRY_S` for ``lease_s`` at most (a
    daemon thread; past the lease every claim is refused anyway). Promise 6, docs/guarantees.md."""
    def retry() -> None:
        deadline = time.monotonic() + lease_s
        while time.monotonic() < deadline:
            time.sleep(CANCEL_RETRY_S)
            try:
                ledger.cancel(turn_id, "submission failed")
                return
            except TurnNotFound:  # nothing of it in Redis: nothing can run
                return
            except ToolfleetError:
                continue
            except Exception as exc:  # noqa: BLE001 - a defect must not kill the thread silently
                log.warning("turn %s: the cancel of its failed submission could not be sent (%s)", turn_id, exc)
                return

    thread = threading.Thread(target=retry, name=f"toolfleet-cancel-{turn_id[:12]}", daemon=True)
    thread.start()
    return thread
