"""Session lifecycle on the agent side (issue 13, item 2): open a session with the initial value
of its stored states, close it, list the open ones. The states themselves are kept by
:class:`toolfleet.tools.state.SessionStore`; expiry is Redis's (``ttl_s`` after the session was
opened or last saved)."""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import ToolfleetError
from ..tools.registry import Registry
from ..tools.state import SessionState, SessionStore
from .wire import encodable


def declared_states(registry: Registry) -> dict[str, SessionState]:
    """The session states the tools of ``registry`` declare, by name. Raises
    :class:`ToolfleetError` when two tools declare one name with different types."""
    found: dict[str, SessionState] = {}
    for spec in registry:
        state = spec.state
        if state is None:
            continue
        known = found.get(state.name)
        if known is not None and object not in (known.type, state.type) and known.type is not state.type:
            raise ToolfleetError(f"two tools declare the session state {state.name!r} with different types")
        if known is None or known.type is object:  # a spec from the catalog (tools/published.py) yields
            found[state.name] = state
    return found


def open_session(store: SessionStore, registry: Registry, session_id: str | None = None, *,
                 state: dict[str, Any] | None = None, ttl_s: int | None = None, replace: bool = False) -> str:
    """Open a session and return its id (a new one when ``session_id`` is ``None``).

    ``state`` maps a declared state's name to its initial value: an instance of its type, or its
    JSON form (validated); states not given start as their type's ``initial()``. Raises
    :class:`ToolfleetError` for an unknown state name, a value that is not a valid state, an id
    that is not valid Unicode, or a session that is open already (unless ``replace``);
    :class:`~toolfleet.errors.BrokerUnavailable` if Redis does not answer."""
    session_id = session_id or uuid.uuid4().hex
    if not session_id or not encodable(session_id):
        raise ToolfleetError(f"session id {ascii(session_id)} is not usable (empty or a lone surrogate)")
    declared = declared_states(registry)
    unknown = sorted(set(state or {}) - set(declared))
    if unknown:
        raise ToolfleetError(f"no tool declares the session state {', '.join(unknown)}; "
                             f"declared: {', '.join(sorted(declared)) or 'none'}")
    values: dict[SessionState, Any] = {}
    for name, decl in declared.items():
        given = (state or {}).get(name)
        if given is not None and not isinstance(given, decl.type if isinstance(decl.type, type) else object):
            try:
                given = decl.adapter.validate_python(given)
            except Exception as exc:
                raise ToolfleetError(f"initial state {name!r} is not a valid {decl.type!r}: {exc}") from exc
        values[decl] = given
    store.open(session_id, values, ttl_s=ttl_s, replace=replace)
    return session_id
