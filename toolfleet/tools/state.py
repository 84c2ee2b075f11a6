"""Stored session state: an object a group of tools shares across the calls and turns of one
session, loaded by the worker before the handler and saved after it (issue 13, item 1).

Declare it with :class:`SessionState` (a name and a type) on ``@tool(state=...)`` or through
:func:`toolfleet.tools.from_class.tools_from_class`. Where it lives and how it is kept:

- **Redis, beside the ledger, never in the workspace**: hash ``<ns>:session:<id>:state:<name>``
  with ``data`` (JSON) and ``version`` (an integer, 1 after the session is opened with it).
  Nothing a tool does reaches it: file tools and commands see the workspace only, and a result
  is written to the ledger, never here. The only writers are :meth:`SessionStore.open` (the
  caller, :meth:`Dispatcher.open_session`) and the worker's save after a *write* call.
- **JSON, never pickle** (docs/design.md, "Not negotiable"): the state is dumped and validated by a
  pydantic ``TypeAdapter`` of the declared type (pydantic models, dataclasses, TypedDicts, dicts,
  lists, sets, tuples, datetimes, ... round-trip; NaN and infinities as the constants ``NaN``,
  ``Infinity``). A random generator is kept as :data:`JsonRandom` (``random.Random.getstate()``
  as JSON lists). Loading validates against the declared type, so a value that is not a valid
  state is refused, and no loaded value runs code. Cyclic object graphs are not supported (keep
  ids instead of references).
- **Never stored unless it loads back**: before storing, the JSON is validated back and compared
  with the value (:mod:`toolfleet.tools.state_json`); a value that would not load, or would load
  as something else (a set in an untyped field comes back a list), fails the call (or the open)
  with ``EXECUTION_ERROR`` naming the path, and the previous state is kept.
- **Size limit**: ``max_bytes`` of JSON (default 256 KiB); a write call that grows the state past
  it keeps nothing and fails with ``EXECUTION_ERROR`` saying the size.
- **Versioned saves**: a save is a compare-and-set on the version it loaded (one Lua script), so a
  stale execution (a frozen worker that wakes up late) never overwrites a newer state: its call
  fails with ``EXECUTION_ERROR`` and nothing is saved. The plan orders calls on one state
  (resource ``session:<id>:<name>``, :func:`state_resource`), so this does not happen in normal runs.
- **Reads do not save**: a call whose access (per call, ``access=`` may be a function of the
  arguments) is ``read`` loads the state and never writes it back; a write call saves after the
  handler, also when the handler raised (the object keeps what it changed before it raised), not
  when the worker was killed under it or the execution no longer holds its call
  (``ctx.check_fence()``: stale, or its turn cancelled); then the state stays as before the call.
- **Lifetime**: every key of a session expires ``ttl_s`` after it was opened or last saved (sliding; default
  the settings' ``result_ttl_s``): a save of one state renews the keys of all the session's states,
  so they expire together; :meth:`SessionStore.close` deletes them at once. A call on a session
  that is not open (never opened, closed or expired, also a listed state whose key is gone) fails
  with ``EXECUTION_ERROR`` before the handler runs, never with a fresh default.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis
from pydantic import PlainSerializer, PlainValidator, TypeAdapter

from ..errors import BrokerUnavailable, ToolFailure, ToolfleetError
from ..keys import Keys, hash_tag_problem
from . import state_scripts
from .state_json import difference, json_writer, to_json, validation_text

DEFAULT_MAX_BYTES = 256 * 1024
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def _random_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _random_from(value: Any) -> random.Random:
    if isinstance(value, random.Random):
        return value
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[1], list)):
        raise ValueError("a random generator's state is [version, [625 ints], gauss_next]")
    rng = random.Random()
    rng.setstate((int(value[0]), tuple(int(x) for x in value[1]), value[2]))
    return rng


JsonRandom = Annotated[random.Random, PlainValidator(_random_from), PlainSerializer(_random_state)]
"""A ``random.Random`` field of a state: stored as its ``getstate()`` in JSON lists, so the next
call draws exactly what the same generator would have drawn in one process."""


@dataclass(frozen=True)
class SessionState:
    """A declared piece of session state: ``name`` (letters, digits, ``_-.``; the resource and key
    name), ``type`` (anything pydantic can dump to JSON and validate back), ``default`` (a
    function making the state of a session opened without one; default: ``type()``),
    ``max_bytes`` (limit of its JSON), ``json_schema`` (for a state a dispatcher knows only from
    the workers' catalog, type ``object``: the JSON Schema they publish for it, or ``None``).
    Raises :class:`ConfigurationError` when the type has no JSON form."""

    name: str
    type: Any
    default: Any = None
    max_bytes: int = DEFAULT_MAX_BYTES
    json_schema: Any = field(default=None, compare=False)  # a state known from the catalog: its published schema
    adapter: TypeAdapter = field(init=False, repr=False, compare=False)  # type: ignore[type-arg]
    writer: TypeAdapter | None = field(init=False, repr=False, compare=False)  # type: ignore[type-arg]

    def __post_init__(self) -> None:
        from ..errors import ConfigurationError

        if not self.name or not set(self.name) <= _NAME_CHARS:
            raise ConfigurationError(f"session state name {self.name!r}: use letters, digits, _ - .")
        try:
            object.__setattr__(self, "adapter", TypeAdapter(self.type))
        except Exception as exc:
            raise ConfigurationError(f"session state {self.name}: {self.type!r} has no JSON form: {exc}") from exc
        object.__setattr__(self, "writer", json_writer(self.type))

    def initial(self) -> Any:
        """A fresh state: ``default()`` or ``type()``."""
        return (self.default or self.type)()

    def dump(self, value: Any) -> bytes:
        """The JSON of ``value`` (bytes; NaN and infinities as ``NaN``/``Infinity``), checked to load
        back as ``value`` (:mod:`toolfleet.tools.state_json`). Raises :class:`ToolFailure` when it
        cannot be dumped, is over ``max_bytes``, or would not load back as it is (nothing is stored)."""
        try:
            raw = to_json(self.adapter, self.writer, value)
        except Exception as exc:
            raise ToolFailure(f"the session state {self.name!r} cannot be stored as JSON: {validation_text(exc)}; "
                              "it was not stored", "keep the state to JSON-able fields (see toolfleet.tools.state)"
                              ) from exc
        if len(raw) > self.max_bytes:
            raise ToolFailure(
                f"the session state {self.name!r} grew to {len(raw)} bytes, over its limit of {self.max_bytes}; "
                "the changes of this call were not kept", "make the state smaller (delete what is not needed)")
        try:
            problem = difference(value, self.adapter.validate_json(raw))
        except Exception as exc:
            problem = f"its JSON does not validate as {self.type!r}: {validation_text(exc)}"
        if problem:
            raise ToolFailure(f"the session state {self.name!r} would not load back as it is ({problem}); it was "
                              "not stored, the state stays as before",
                              "give the field a type that round-trips through JSON (a set[...], a datetime, ...)")
        return raw

    def load(self, raw: bytes | str) -> Any:
        """The state from its JSON; raises :class:`ToolFailure` if it is not a valid state."""
        try:
            return self.adapter.validate_json(raw)
        except Exception as exc:
            raise ToolFailure(f"the stored session state {self.name!r} is not a valid {self.type!r}: {exc}",
                              "close the session and open it again") from exc


def state_resource(session_id: str | None, state: SessionState) -> str:
    """The plan resource of one session's state: ``session:<id>:<name>``."""
    return f"session:{session_id or ''}:{state.name}"


def session_resources(spec: Any, session_id: str | None) -> frozenset[str]:
    """What a call of ``spec`` touches besides its own resources: its session state, if any."""
    state = getattr(spec, "state", None)
    return frozenset() if state is None else frozenset({state_resource(session_id, state)})


def loop_epochs(store: SessionStore | None, session_id: str | None, calls: list[tuple[Any, Any]]) -> list[str]:
    """For loop detection (:mod:`toolfleet.policy.loops`): per ``(spec, arguments)`` of one batch
    (model order), ``"<version>+<writes before it in the batch>"`` of its session state, ``""``
    for a tool without state. One round trip for the versions."""
    names = sorted({spec.state.name for spec, _ in calls if getattr(spec, "state", None) is not None})
    if not names or not session_id or store is None:
        return [""] * len(calls)
    versions = store.versions(session_id, names)
    writes: dict[str, int] = dict.fromkeys(names, 0)
    out = []
    for spec, arguments in calls:
        if getattr(spec, "state", None) is None:
            out.append("")
            continue
        out.append(f"{versions[spec.state.name]}+{writes[spec.state.name]}")
        if spec.access_for(arguments) == "write":
            writes[spec.state.name] += 1
    return out


def _listed(raw: bytes | str | None) -> list[str]:
    """The state names of a session record's ``states`` (JSON list); unreadable entries skipped."""
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n and set(n) <= _NAME_CHARS]


@dataclass
class Loaded:
    """A state as one call loaded it: the object, the version it had, and the ``epoch`` of the
    session then (a new one at each open: a save after the session was closed and opened again
    under the same id is refused, though the version may match again)."""

    value: Any
    version: int
    epoch: str = ""


class SessionStore:
    """Sessions and their states in Redis (keys under ``<ns>:session:<id>``, index ``<ns>:sessions``)."""

    def __init__(self, client: redis.Redis, keys: Keys, *, url: str = "", default_ttl_s: int = 24 * 3600) -> None:
        self.redis = client
        self.keys = keys
        self.url = url
        self.default_ttl_s = default_ttl_s
        self._save = client.register_script(state_scripts.SAVE)
        self._open = client.register_script(state_scripts.OPEN)
        self._close = client.register_script(state_scripts.CLOSE)

    def meta_key(self, session_id: str) -> str:
        return f"{self.keys.ns}:session:{{{session_id}}}:meta"

    def state_key(self, session_id: str, name: str) -> str:
        return f"{self.keys.ns}:session:{{{session_id}}}:state:{name}"

    @property
    def index_key(self) -> str:
        return f"{self.keys.ns}:sessions"

    def _broker(self, exc: redis.RedisError) -> BrokerUnavailable:
        return BrokerUnavailable(self.url, str(exc))

    def open(self, session_id: str, states: dict[SessionState, Any], *, ttl_s: int | None = None,
             replace: bool = False) -> None:
        """Open ``session_id`` with the initial value of each declared state (``None``: the
        state's ``initial()``). Raises :class:`ToolfleetError` if it is open already (unless
        ``replace``) or a value is not a valid state, :class:`BrokerUnavailable` if Redis does not answer."""
        problem = hash_tag_problem("session id", session_id)
        if problem:
            raise ToolfleetError(problem)
        if ttl_s is not None and not ttl_s > 0:  # EXPIRE with 0 or less deletes the key: "open" and gone
            raise ToolfleetError(f"ttl_s must be a positive number of seconds, not {ttl_s!r}")
        ttl = math.ceil(ttl_s) if ttl_s is not None else int(self.default_ttl_s)
        dumped = {}
        for state, value in states.items():
            try:
                dumped[state.name] = state.dump(state.initial() if value is None else value)
            except ToolFailure as exc:
                raise ToolfleetError(exc.message) from exc
        now = time.time()
        pairs = [x for name, raw in sorted(dumped.items()) for x in (name, raw)]
        try:  # one script: a replaced session's old states deleted and the new ones stored in one step
            opened = self._open(keys=[self.meta_key(session_id)],
                                args=[self.state_key(session_id, ""), "1" if replace else "0", now, ttl,
                                      uuid.uuid4().hex, json.dumps(sorted(dumped)), *pairs])
            if not int(opened):
                raise ToolfleetError(f"session {session_id!r} is open already; close it first or pass replace=True")
            self.redis.zadd(self.index_key, {session_id: now})
        except redis.RedisError as exc:
            raise self._broker(exc) from exc

    def close(self, session_id: str) -> bool:
        """Delete the session and its states; True if it was open."""
        try:  # one script: the states the record lists, read and deleted with it in one step
            was_open = int(self._close(keys=[self.meta_key(session_id)], args=[self.state_key(session_id, "")]))
            self.redis.zrem(self.index_key, session_id)
            return bool(was_open)
        except redis.RedisError as exc:
            raise self._broker(exc) from exc

    def _state_names(self, session_id: str) -> list[str]:
        """The states the session record lists (no key scan: ids may hold any character)."""
        return _listed(self.redis.hget(self.meta_key(session_id), "states"))

    def sessions(self) -> list[dict[str, Any]]:
        """The open sessions: ``[{"session_id", "opened_at", "touched_at", "ttl_s", "expires_in_s",
        "states": {name: {"version", "size_bytes"}}}]``, oldest first; expired ones are dropped
        from the index on the way."""
        try:
            ids = [i.decode() if isinstance(i, bytes) else i for i in self.redis.zrange(self.index_key, 0, -1)]
            out, gone = [], []
            for sid in ids:
                pipe = self.redis.pipeline()
                pipe.hgetall(self.meta_key(sid))
                pipe.ttl(self.meta_key(sid))
                meta, ttl = pipe.execute()
                if not meta:
                    gone.append(sid)
                    continue
                meta = {k.decode(): v.decode() for k, v in meta.items()}
                names = json.loads(meta.get("states") or "[]")
                states = {}
                for name in names:
                    version, size = self.redis.hmget(self.state_key(sid, name), "version"), \
                        self.redis.hstrlen(self.state_key(sid, name), "data")
                    states[name] = {"version": int(version[0] or 0), "size_bytes": int(size)}
                out.append({"session_id": sid, "opened_at": float(meta["opened_at"]),
                            "touched_at": float(meta.get("touched_at", meta["opened_at"])),
                            "ttl_s": int(meta.get("ttl_s", 0)), "expires_in_s": int(ttl), "states": states})
            if gone:
                self.redis.zrem(self.index_key, *gone)
            return out
        except redis.RedisError as exc:
            raise self._broker(exc) from exc

    def versions(self, session_id: str, names: list[str]) -> dict[str, int]:
        """The current version of each named state (0 when absent), one round trip."""
        if not names:
            return {}
        pipe = self.redis.pipeline()
        for name in names:
            pipe.hget(self.state_key(session_id, name), "version")
        try:
            return {n: int(v or 0) for n, v in zip(names, pipe.execute(), strict=True)}
        except redis.RedisError as exc:
            raise self._broker(exc) from exc

    def load(self, state: SessionState, session_id: str | None) -> Loaded:
        """The state of ``session_id`` (its ``initial()`` at version 0 if the session was opened
        without it and never saved it). Raises :class:`ToolFailure` when there is no session id,
        the session is not open, a state the session lists has expired (its key is gone), or Redis
        fails the read."""
        if not session_id:
            raise ToolFailure(f"this tool keeps session state ({state.name!r}) and the turn has no session id; "
                              "it did not run",
                              "open a session (Dispatcher.open_session; CLI: `toolfleet sessions --open ID --tools "
                              "MODULE`) and pass its id (session_id; CLI: `toolfleet run --session ID`)")
        pipe = self.redis.pipeline(transaction=False)  # one round trip
        pipe.hmget(self.meta_key(session_id), "opened_at", "states", "epoch")
        pipe.hmget(self.state_key(session_id, state.name), "data", "version")
        try:
            (opened, names, epoch), (raw, version) = pipe.execute()
        except redis.RedisError as exc:  # connection lost, timeout, READONLY: nothing ran yet
            raise ToolFailure(f"the session state {state.name!r} could not be read from Redis "
                              f"({type(exc).__name__}: {exc}); the call did not run",
                              "try the call again; Redis may answer again") from exc
        epoch = epoch.decode() if isinstance(epoch, bytes) else (epoch or "")
        if opened is None:
            raise ToolFailure(f"session {session_id!r} is not open (never opened, closed, or expired); the call did "
                              "not run",
                              "open it with Dispatcher.open_session (CLI: `toolfleet sessions --open ID --tools "
                              "MODULE`)")
        if raw is None:
            if state.name in _listed(names):  # it was stored, and its key is gone: never a fresh default
                raise ToolFailure(f"session {session_id!r} is not open: its state {state.name!r} expired; the call "
                                  "did not run", "close the session and open it again")
            return Loaded(state.initial(), 0, epoch)
        return Loaded(state.load(raw), int(version or 0), epoch)

    def save(self, state: SessionState, session_id: str, loaded: Loaded, value: Any) -> int:
        """Store ``value`` if the state is still at ``loaded.version`` (one round trip: a Lua
        script); returns the new version.
        Raises :class:`ToolFailure` when it is too big, the session is gone, or another
        execution saved in between (nothing is stored then), or Redis fails the save."""
        raw = state.dump(value)
        try:
            result = int(self._save(keys=[self.state_key(session_id, state.name), self.meta_key(session_id)],
                                    args=[loaded.version, raw, self.default_ttl_s, time.time(), state.name,
                                          self.state_key(session_id, ""), loaded.epoch]))
        except redis.RedisError as exc:
            # refused (READONLY, OOM): nothing stored; the connection lost or timed out: the script may
            # have run before the answer was lost
            kept = "were not kept" if isinstance(exc, redis.ResponseError) else "may not have been kept"
            raise ToolFailure(f"the call ran, but saving the session state {state.name!r} failed on Redis "
                              f"({type(exc).__name__}: {exc}); its changes to {state.name!r} {kept}",
                              "check the state (and any other effect of the call) before repeating it") from exc
        if result == -1:
            raise ToolFailure(f"session {session_id!r} was closed or expired (or opened again) while the call ran; "
                              f"its changes to {state.name!r} were not kept", "open the session again")
        if result == -2:
            raise ToolFailure(f"the session state {state.name!r} was changed by another execution while this call "
                              "ran; this call's changes were not kept", "check the state before repeating the call")
        return result
