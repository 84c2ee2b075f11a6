"""The worker's load-before / save-after around the handler of a tool with session state
(:mod:`toolfleet.tools.state`): the state is loaded into ``ctx.session``, the handler runs, and a
call whose access is ``write`` saves it back, also when the handler raised, while the execution
still holds its call (``ctx.check_fence()``: a stale execution or a cancelled turn saves nothing)."""

from __future__ import annotations

from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from ..errors import ToolFailure
from ..tools.context import ToolContext
from ..tools.spec import ToolSpec
from ..tools.state import SessionStore


def session_store(runtime: Any) -> SessionStore:
    """The process's :class:`SessionStore` (on the ledger's connection, remade after a fork)."""
    ledger = runtime.ledger
    store = getattr(runtime, "_session_store", None)
    if store is None or store.redis is not ledger.redis:
        store = SessionStore(ledger.redis, runtime.keys, url=runtime.settings.redis_url,
                             default_ttl_s=runtime.settings.result_ttl_s)
        runtime._session_store = store
    return store


def call_handler(runtime: Any, spec: ToolSpec, ctx: ToolContext, kwargs: dict[str, Any],
                 arguments: dict[str, Any]) -> Any:
    """``spec.handler(**kwargs)``, with the session state loaded before and saved after when the
    tool declares one. Raises what the handler raises, or :class:`ToolFailure` when the state
    cannot be loaded (the handler does not run) or saved (its changes are not kept)."""
    state = spec.state
    if state is None:
        return spec.handler(**kwargs)
    store = session_store(runtime)
    loaded = store.load(state, ctx.session_id)
    ctx.session = loaded.value
    if spec.access_for(arguments) != "write":
        return spec.handler(**kwargs)
    try:
        value = spec.handler(**kwargs)
    except BaseException:
        _save(store, spec, ctx, loaded)  # a failed save wins: it says more
        raise
    _save(store, spec, ctx, loaded)
    return value


def _save(store: SessionStore, spec: ToolSpec, ctx: ToolContext, loaded: Any) -> None:
    """Save ``ctx.session`` unless this execution no longer holds its call: ``check_fence``
    raises for a stale execution (a newer one claimed the call, the answer was given, the hard
    limit passed) or a cancelled turn, and then nothing is saved (the state stays as before)."""
    ctx.check_fence()
    try:
        store.save(spec.state, ctx.session_id or "", loaded, ctx.session)
    except ToolFailure:
        # a cancel's interrupt or the soft time limit that lands while the state's JSON is made is
        # wrapped by pydantic's serializer, and read as "cannot be stored as JSON" (a breaker's
        # find): nothing was stored either way, and the call's answer is the stop's
        ctx.check_cancelled()  # CallCancelled: CANCELLED
        if ctx.remaining_s <= 0:
            raise SoftTimeLimitExceeded() from None  # TIMEOUT
        raise
