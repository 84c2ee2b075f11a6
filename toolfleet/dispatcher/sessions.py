"""Session lifecycle on the agent side (issue 13, item 2): open a session with the initial value
of its stored states, close it, list the open ones. The states themselves are kept by
:class:`toolfleet.tools.state.SessionStore`; expiry is Redis's (``ttl_s`` after the session was
opened or last saved)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from ..errors import ToolfleetError
from ..tools.redact import redact_text
from ..tools.registry import Registry
from ..tools.state import SessionState, SessionStore
from ..tools.state_json import json_writer, validation_text
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
        values[decl] = None if given is None else initial_value(name, decl, given)
    store.open(session_id, values, ttl_s=ttl_s, replace=replace)
    return session_id


def initial_value(name: str, decl: SessionState, given: Any) -> Any:
    """The value to store for a state given at open. With the state's own type (the tools
    imported): ``given`` itself when it is an instance of the type's class, else ``given`` validated
    into the type (its JSON form; for a type that is not a class, ``set[str]``, an instance too).
    Known only from the workers' catalog (type ``object``): the JSON form of ``given`` (an instance is dumped by its own
    class: a pydantic model's ``model_dump(mode="json")``, a dataclass's pydantic adapter, so a
    :data:`~toolfleet.tools.state.JsonRandom` field keeps its generator), checked against the
    published ``json_schema`` when there is one. Raises :class:`ToolfleetError` naming the state
    and the path of what is wrong, or saying to pass the JSON form (or the tools' registry)."""
    if decl.type is not object:
        if isinstance(decl.type, type) and isinstance(given, decl.type):
            return given
        # anything else (a type that is not a class, ``set[str]`` or ``list[Todo]``, included: every value
        # would pass for one of those) is validated into the type: its JSON form, or an instance as it is
        try:
            schema = decl.adapter.json_schema()
        except Exception:  # noqa: BLE001 - no schema: nothing to say of its fields
            schema = None
        _unknown_fields(name, schema, given)
        try:
            return decl.adapter.validate_python(given)
        except Exception as exc:
            raise ToolfleetError(f"initial state {name!r} is not a valid {decl.type!r}: {exc}") from exc
    form = _json_form(name, given)
    if decl.json_schema is not None:
        _unknown_fields(name, decl.json_schema, form)
        _check_schema(name, decl.json_schema, form)
    return form


def _unknown_fields(name: str, schema: Any, given: Any) -> None:
    """Refuse an initial state (a JSON object) naming fields its type does not have: pydantic
    ignores them (``extra="ignore"``, its default), so a misspelt field was dropped without a
    word (a newcomer's ``--state 'counter={"m": 7}'``). A type that takes other fields
    (``additionalProperties`` in its schema: ``extra="allow"``/``"forbid"``) decides itself."""
    if not isinstance(schema, Mapping) or not isinstance(given, Mapping) or "additionalProperties" in schema:
        return
    fields = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(fields, Mapping):
        return
    unknown = sorted(str(k) for k in given if k not in fields)
    if unknown:
        shown = ", ".join(redact_text(k)[:40] for k in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise ToolfleetError(f"initial state {name!r} has no field {shown}; its fields: "
                             f"{', '.join(sorted(fields)) or '(none)'}")


def _json_form(name: str, given: Any) -> Any:
    try:
        if hasattr(given, "model_dump") and hasattr(type(given), "model_fields"):
            return given.model_dump(mode="json", round_trip=True)
        writer = json_writer(type(given) if dataclasses.is_dataclass(given) and not isinstance(given, type) else Any)
        if writer is None:
            raise TypeError(f"pydantic has no JSON form of {type(given).__name__}")
        return writer.dump_python((given,), mode="json", round_trip=True, warnings=False)[0]
    except Exception as exc:
        raise ToolfleetError(
            f"initial state {name!r}: this dispatcher knows the state only from the workers' catalog and cannot "
            f"make the JSON form of the {type(given).__name__} given ({validation_text(exc)}); pass its JSON form, "
            "or give the Dispatcher the tools' registry (Dispatcher(settings, default_registry([\"your.tools\"])))"
        ) from exc


def _check_schema(name: str, schema: Mapping[str, Any], form: Any) -> None:
    import jsonschema

    found = []
    for error in jsonschema.Draft202012Validator(_lenient(schema)).iter_errors(form):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = redact_text(error.message)  # it quotes the value: masked, then cut
        found.append(f"at {path}: {message if len(message) <= 160 else message[:160] + '...'}")
    if found:
        found.sort()
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise ToolfleetError(f"initial state {name!r} does not match the JSON Schema the workers publish for it: "
                             f"{'; '.join(found[:3])}{more}")


def _lenient(schema: Any) -> Any:
    """``schema`` without ``uniqueItems`` (pydantic's mark of a set, whose input may repeat items)."""
    if isinstance(schema, Mapping):
        return {k: _lenient(v) for k, v in schema.items() if not (k == "uniqueItems" and isinstance(v, bool))}
    if isinstance(schema, list):
        return [_lenient(v) for v in schema]
    return schema
