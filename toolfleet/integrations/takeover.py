"""Continue a turn another process started and no longer drives (a framework resumed elsewhere).

A framework that pauses a batch of tool calls for a person (LangGraph's ``interrupt``) may resume it
in another process than the one whose :class:`~toolfleet.Turn` holds them: a held call then has no
driver here to submit it once approved. This module takes such a turn over without ever running a
call twice:

1. Claim the takeover once for all processes: ``SET <ns>:integrations:continued:<turn> <next> NX``
   (two resumes at once: one takes over, the other follows the chain).
2. Cancel the old turn (:meth:`Ledger.cancel`: atomically, every call not started gets
   ``NOT_EXECUTED``, i.e. it never ran), then wait (bounded) for the result of any call that had
   started; one still silent after the bound gets ``OUTCOME_UNKNOWN`` (never run again), recorded
   in the ledger for the turns after (its late result, if any, is then a late note).
3. The caller submits, as the turn ``<next>``, the calls whose result is ``NOT_EXECUTED`` or missing,
   with their call ids and model order; every other result stands. The submission opens ``<next>``
   exclusively (``Dispatcher.open_turn(_exclusive=True)``, in the ledger's open script): a resume
   that finds ``<next>`` claimed but not submitted yet (the claimant may still be waiting in step
   2 for a call that runs) does step 2 itself (cancelling again changes nothing), so a call still
   running in the old turn is waited for, never sent again; of the resumes that then submit
   ``<next>``, one opens it, the others follow the chain (:class:`~toolfleet.errors.TurnExists`).

A later resume follows the chain from the first turn id: results other than ``NOT_EXECUTED`` of
every turn in the chain stand, the last turn is the live one. Everything lives as long as the
ledger (``result_ttl_s``): resume within that, or the calls are not known to have run.
Source: docs/design.md, "Cancellation and time" (calls not started never start: ``NOT_EXECUTED``,
the handler did not run) and "Not negotiable" (every call gets exactly one result).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis

from ..dispatcher.client import Dispatcher
from ..errors import BrokerUnavailable, ToolfleetError, TurnNotFound
from ..models import ErrorCode, ToolCall, ToolResult

MAX_CHAIN = 64  # takeovers of one batch; past that something loops
WAIT_EXTRA_S = 10.0  # on top of cancel_grace_s + kill_grace_s, for a started call's result after the cancel


def continued_key(dispatcher: Dispatcher, turn_id: str) -> str:
    return f"{dispatcher.settings.namespace}:integrations:continued:{turn_id}"


def follow(dispatcher: Dispatcher, first: str) -> tuple[str, str | None, dict[str, tuple[str, ToolResult]]]:
    """(the live turn id of the chain that starts at ``first``, the turn it took over (``None``
    for ``first``), the results that stand from the turns before it: call id -> (turn id,
    result)). The live turn may not be submitted yet: its claimant may still be ending the turn
    before it (:func:`end`), whose started calls then have no result yet. Raises
    :class:`BrokerUnavailable` if Redis does not answer."""
    standing: dict[str, tuple[str, ToolResult]] = {}
    turn_id, before = first, None
    try:
        for _ in range(MAX_CHAIN):
            successor = dispatcher.ledger.redis.get(continued_key(dispatcher, turn_id))
            if successor is None:
                return turn_id, before, standing
            for call_id, result in dispatcher.ledger.results(turn_id).items():
                if result.code != ErrorCode.NOT_EXECUTED:
                    standing[call_id] = (turn_id, result)
            turn_id, before = successor.decode() if isinstance(successor, bytes) else str(successor), turn_id
    except redis.RedisError as exc:
        raise BrokerUnavailable(dispatcher.settings.redis_url, str(exc)) from exc
    raise ToolfleetError(f"turn {first} was taken over more than {MAX_CHAIN} times; refusing to follow further")


def moved(dispatcher: Dispatcher, turn_id: str) -> bool:
    """True once another process took ``turn_id`` over (its live turn is further down the chain)."""
    try:
        return bool(dispatcher.ledger.redis.exists(continued_key(dispatcher, turn_id)))
    except redis.RedisError as exc:
        raise BrokerUnavailable(dispatcher.settings.redis_url, str(exc)) from exc


def claim(dispatcher: Dispatcher, turn_id: str, successor: str) -> bool:
    """Claim the takeover of ``turn_id`` (True), or learn another process has it (False)."""
    try:
        return bool(dispatcher.ledger.redis.set(continued_key(dispatcher, turn_id), successor, nx=True,
                                                ex=dispatcher.settings.result_ttl_s))
    except redis.RedisError as exc:
        raise BrokerUnavailable(dispatcher.settings.redis_url, str(exc)) from exc


def end(dispatcher: Dispatcher, turn_id: str, calls: Sequence[ToolCall]) -> dict[str, ToolResult]:
    """Cancel ``turn_id`` and return the final result of each of ``calls``: ``NOT_EXECUTED`` for
    those that never started; a started call's own result, waited for up to ``cancel_grace_s`` +
    ``kill_grace_s`` + 10 s, else ``OUTCOME_UNKNOWN``."""
    ledger, settings = dispatcher.ledger, dispatcher.settings
    try:
        ledger.cancel(turn_id, "taken over by another process resuming its calls")
    except TurnNotFound:
        pass  # expired: every call below is then unknown, hence never re-run
    deadline = time.monotonic() + settings.cancel_grace_s + settings.kill_grace_s + WAIT_EXTRA_S
    after = "0-0"
    try:
        while True:
            results = ledger.results(turn_id)
            missing = [c for c in calls if c.id not in results]
            if not missing or time.monotonic() >= deadline:
                break
            for event in ledger.events(turn_id, after, block_ms=500):  # push: wake on the next result
                after = event.stream_id
    except redis.RedisError as exc:
        raise BrokerUnavailable(settings.redis_url, str(exc)) from exc
    for call in missing:
        unknown = ToolResult.failure(
            call.id, call.name, ErrorCode.OUTCOME_UNKNOWN,
            f"turn {turn_id} was taken over after this call started, and its outcome never arrived",
            "check its effect before asking again")
        # recorded in the ledger (unless its result came meanwhile): a later resume that follows the
        # chain reads it there, so it never takes the call for one that never ran and sends it again
        try:
            kept = ledger.record_result(turn_id, unknown)
            results[call.id] = unknown if kept else ledger.results(turn_id).get(call.id, unknown)
        except redis.RedisError as exc:
            raise BrokerUnavailable(settings.redis_url, str(exc)) from exc
    return {c.id: results[c.id] for c in calls}
