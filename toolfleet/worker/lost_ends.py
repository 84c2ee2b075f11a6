"""Ends of an execution that its handler could not report, recorded by the worker's main
process (its steps thread, worker/main_steps.py) or by the task after an interrupt: a pool process
killed at its hard time limit or on a cancel, one that died (the message goes back to the queue),
a stale execution's death kept as a late note (F3). Each records fenced: with the claim token of
the process that ran it, else as a late note."""

from __future__ import annotations

import logging
import os
from typing import Any

from ..models import CallEnvelope, ErrorCode, ToolResult
from ..observe.results import result_recorded
from ..tools.spec import ToolSpec
from .execute import with_journal_key
from .runtime import Runtime

log = logging.getLogger(__name__)


def abandoned(runtime: Runtime, kwargs: dict[str, Any], *, broken: bool, pid: int | None = None) -> None:
    """The pool process running a call died or was killed: release the call's journal key (so the
    next execution probes at once instead of waiting out the lease), mark its claim dead (process
    ``pid``: a redelivered copy of the message may claim the call), and, when the death says the
    tool is in trouble, count a failure on its breaker."""
    try:
        env = CallEnvelope.model_validate(kwargs.get("envelope", {}))
        fence = runtime.ledger.fence_of(env.turn_id, env.call_id)  # (token, deadline, pid): retried
        if pid:
            runtime.ledger.fence_dead(env.turn_id, env.call_id, pid)
        spec = runtime.registry.get(env.name)
        env = env if spec is None else with_journal_key(spec, env)
        key = runtime.journal.key(env.name, env.idempotency_key)
        mine = fence is not None and fence[2] == (pid or os.getpid())
        if mine and fence[0]:
            # the dead execution holds the latest claim: its entry by its own token (the claim's),
            # never the entry of a copy that claimed the call since the claim was marked dead
            runtime.journal.release(key, str(fence[0]))
        else:  # a newer claim of the call by another process: that execution's entry (the same owner) stays held
            keep = str(fence[0]) if fence is not None and not mine else None
            runtime.journal.release_owner(key, f"{env.turn_id}:{env.call_id}", keep_token=keep)
        if broken:
            runtime.breakers.observe(env.name, ok=False)
    except Exception as exc:  # best effort: leases lapse by themselves
        log.warning("could not release the journal key of a lost call (%s)", exc)


def spec_of(runtime: Runtime, kwargs: dict[str, Any]) -> ToolSpec | None:
    envelope = kwargs.get("envelope")
    return runtime.registry.get(envelope.get("name")) if isinstance(envelope, dict) else None


def killed(runtime: Runtime, kwargs: dict[str, Any], pid: int | None, code: ErrorCode, message: str, hint: str,
            *, broken: bool, unstarted: tuple[str, str] | None = None) -> None:
    """The pool process ``pid`` running a call was killed (its hard limit, a cancel): release what
    the execution held (:func:`abandoned`), then record its end (:func:`finalize`). ``unstarted``:
    the (message, hint) of a ``NOT_EXECUTED`` recorded instead when no claim began the call (the
    process was stuck before it could start it), in one atomic step with the claim, so a claim
    that lands first makes the end ``code`` as before, and one that lands after is refused."""
    abandoned(runtime, kwargs, broken=broken, pid=pid)
    if unstarted is not None and record_unstarted(runtime, kwargs, *unstarted):
        return
    finalize(runtime, kwargs, code, message, hint, pid=pid)


def record_unstarted(runtime: Runtime, kwargs: dict[str, Any], message: str, hint: str) -> bool:
    """Record the call's ``NOT_EXECUTED`` (``message``, ``hint``) if no claim began it, in one
    atomic step with the claim; returns whether it was recorded."""
    try:
        env = CallEnvelope.model_validate(kwargs.get("envelope", {}))
    except Exception:
        return False
    result = ToolResult.failure(env.call_id, env.name, ErrorCode.NOT_EXECUTED, message, hint)
    if not runtime.ledger.record_result(env.turn_id, result, unless_started=True):
        return False
    log.warning("call %s of turn %s: its pool process was stopped before it started the call; recorded "
                "NOT_EXECUTED", env.call_id, env.turn_id)
    result_recorded(env, result)
    return True


def note_stale_death(runtime: Runtime, kwargs: dict[str, Any], pid: int | None) -> None:
    """The pool process ``pid`` died running a call that another execution took over, or that
    already has its answer: the redelivered message can only be refused (superseded, done), so
    the death is kept as a late note for the operator (F3), like any stale execution's end. A
    call still held by this claim and unanswered is left to the redelivery, which decides."""
    try:
        env = CallEnvelope.model_validate(kwargs.get("envelope", {}))
        fence = runtime.ledger.fence_of(env.turn_id, env.call_id)
        if not pid or fence is None or not fence[2]:  # whose claim it is cannot be told: the redelivery decides
            return
        if fence[2] == pid and env.call_id not in runtime.ledger.results(env.turn_id):
            return
        # fenced as stale: this process's own token on an answered call, or token 0 (another holds it)
        finalize(runtime, kwargs, ErrorCode.WORKER_LOST,
                  "the pool process running this stale execution died before it reported; a newer execution "
                  "holds the call or the caller has its answer", "the caller's answer stands", pid=pid)
    except Exception as exc:  # best effort: only the operator's note depends on it
        log.warning("could not note the death of a stale execution (%s)", exc)


def recorded(runtime: Runtime, envelope: dict[str, Any]) -> ToolResult | None:
    """The result the ledger holds for the call of ``envelope`` (``None`` if none, or unreadable)."""
    try:
        env = CallEnvelope.model_validate(envelope)
        return runtime.ledger.results(env.turn_id).get(env.call_id)
    except Exception:  # best effort: only Flower's state depends on it
        return None


def finalize(runtime: Runtime, kwargs: dict[str, Any], code: ErrorCode, message: str, hint: str,
              pid: int | None = None) -> None:
    """Record the end of an execution the handler could not report (killed, interrupted), fenced:
    with the call's latest claim token when that claim is the one process ``pid`` made, else as a
    stale report (a late note): a newer execution holds the call."""
    try:
        env = CallEnvelope.model_validate(kwargs.get("envelope", {}))
    except Exception:
        return
    result = ToolResult.failure(env.call_id, env.name, code, message, hint)
    ledger = runtime.ledger
    try:  # the handler ran: its claim tells the worker, the start time and the attempts
        result = ledger.with_run_facts(env.turn_id, result)
    except Exception as exc:  # best effort: the result itself matters more
        log.warning("could not read the claim of call %s (%s)", env.call_id, exc)
    fence = ledger.fence_of(env.turn_id, env.call_id)
    token = None if fence is None else (fence[0] if pid is None or fence[2] in (0, pid) else 0)
    if ledger.record_result(env.turn_id, result, fencing_token=token):
        result_recorded(env, result)
