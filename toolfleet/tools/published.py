"""Tool specs as the workers publish them, and a dispatcher's registry built from them.

One source of truth for tools (issue 15, point 3): each worker publishes the full spec of every
tool it serves in its catalog (:mod:`toolfleet.worker.catalog`), :func:`describe`; a dispatcher
can build its registry from the live catalog (:func:`catalog_registry`, also
``Registry.from_catalog``) without importing any tool code.

What a description holds (``describe(spec)``): ``name``, ``description``, ``parameters`` (the
JSON Schema the dispatcher validates against), ``access`` (``read``/``write``; ``write`` when the
access is a function of the arguments: ``access_per_call: "code"``), ``resources`` (below),
``queue``, ``timeout_s``, ``timeout_arg``, ``max_timeout_s``, ``max_output_chars``,
``cancellable``, ``idempotent``, ``journal``, ``idempotency_key`` (``"code"`` or ``None``),
``risk``, ``sensitive``, ``command_arg``, ``pollable``, ``poll_interval_s``, ``loop_check``,
``state`` (name, or ``None``), ``state_initial`` (its initial JSON value), ``state_schema`` (the
JSON Schema of the state's type, pydantic's serialization mode, or ``None`` when pydantic cannot
make one; a catalog without it, from an older worker, is read as ``None``) and ``version``. A
dispatcher that knows a state only from here validates a JSON-form initial value against
``state_schema`` when a session is opened (:mod:`toolfleet.dispatcher.sessions`).

Resources, the planning rule, are published declaratively where they can be:

- ``"*"``: everything (no resource function: the safe default of :func:`resources.resolve`);
- ``{"paths": [ARG, ...], "default": "."}``: :func:`toolfleet.tools.resources.paths`;
- ``{"fixed": [RESOURCE, ...]}``: :func:`toolfleet.tools.resources.fixed` (``resources=[...]``;
  ``[]``: the calls touch nothing);
- ``"code"``: a Python function the dispatcher cannot run. A spec built from the catalog then
  plans the call as touching everything (``"*"``), the conservative fallback: it waits for every
  write before it and every write after it waits for it (a read stays a read: reads never
  conflict with reads).

``version`` is a digest of the published description (without ``version``) and of the handler's
source: two workers whose specs or code differ publish different versions. The dispatcher
refuses a call of a tool whose live workers publish two versions (``TOOL_UNAVAILABLE``, naming
the workers; :func:`version_conflicts`), and ``toolfleet tools`` shows them: calls are never
silently mixed between versions.

Which spec wins (:func:`catalog_registry`): a live tool whose version equals the local spec's (the
built-ins, ``--tools`` modules) uses the local spec (same code, exact resource functions);
one whose version differs uses the published spec (the workers run that one); local tools no
live worker serves stay (their calls get ``TOOL_UNAVAILABLE``, not ``UNKNOWN_TOOL``). A
registry passed explicitly to :class:`~toolfleet.dispatcher.Dispatcher` is used as it is: it
wins, and the worker validates each call again against its own spec anyway.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import BrokerUnavailable, ConfigurationError
from .registry import Registry
from .resources import fixed, paths
from .spec import ToolSpec, tool_from_schema

REFRESH_MIN_S = 0.1  # a registry re-reads the catalog for an unknown name at most this often (two
# round trips; a worker that became ready after the last read is found by the next call that names it)


def resources_form(fn: Any) -> Any:
    """The published form of a resource function: ``"*"``, ``{"paths": [...], "default": ...}`` or
    ``"code"`` (module docstring)."""
    if fn is None:
        return "*"
    declared = getattr(fn, "paths_declared", None)
    if declared is not None:
        return {"paths": list(declared[0]), "default": declared[1]}
    constant = getattr(fn, "fixed_declared", None)
    if constant is not None:
        return {"fixed": list(constant)}
    return "code"


def resources_from_form(form: Any) -> Any:
    """The resource function of a published form; ``None`` (everything) for ``"*"``, ``"code"`` or
    anything unknown (conservative)."""
    if isinstance(form, Mapping) and isinstance(form.get("paths"), list):
        return paths(*(str(p) for p in form["paths"]), default=str(form.get("default", ".")))
    if isinstance(form, Mapping) and isinstance(form.get("fixed"), list):
        return fixed(*(str(r) for r in form["fixed"]))
    return None


def _state_initial(state: Any) -> Any:
    try:
        return state.adapter.dump_python(state.initial(), mode="json")
    except Exception:  # a default that cannot be dumped: the dispatcher starts from nothing
        return None


def _state_schema(state: Any) -> Any:
    try:
        schema = state.adapter.json_schema(mode="serialization")
        json.dumps(schema)
        return schema
    except Exception:  # a type pydantic has no schema for: the dispatcher checks nothing at open
        return None


def _readable_schema(schema: Any) -> Any:
    """A published state schema this dispatcher can use, else ``None`` (no check at open)."""
    if not isinstance(schema, Mapping):
        return None
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return dict(schema)


def describe(spec: ToolSpec) -> dict[str, Any]:
    """The full published description of ``spec`` (module docstring), ``version`` included."""
    cached = spec.__dict__.get("_published")
    if cached is not None:
        return dict(cached)
    entry = {
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "access": spec.access,
        "access_per_call": None if spec.access_fn is None else "code",
        "resources": resources_form(spec.resources),
        "queue": spec.queue,
        "timeout_s": spec.timeout_s,
        "timeout_arg": spec.timeout_arg,
        "max_timeout_s": spec.max_timeout_s,
        "max_output_chars": spec.max_output_chars,
        "cancellable": spec.cancellable,
        "idempotent": spec.idempotent,
        "journal": spec.journal,
        "idempotency_key": None if spec.idempotency_key is None else "code",
        "risk": spec.risk,
        "sensitive": list(spec.sensitive),
        "command_arg": spec.command_arg,
        "pollable": spec.pollable,
        "poll_interval_s": spec.poll_interval_s,
        "loop_check": spec.loop_check,
        "state": None if spec.state is None else spec.state.name,
        "state_initial": None if spec.state is None else _state_initial(spec.state),
        "state_schema": None if spec.state is None else _state_schema(spec.state),
    }
    entry["version"] = spec.__dict__.get("_published_version") or _version(entry, spec)
    object.__setattr__(spec, "_published", entry)  # frozen dataclass: cache beside the fields
    return dict(entry)


def _version(entry: Mapping[str, Any], spec: ToolSpec) -> str:
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode())
    digest.update(_code_text(spec.handler).encode())
    for fn in (spec.resources, spec.access_fn, spec.idempotency_key):
        if fn is not None and resources_form(fn) == "code":
            digest.update(_code_text(fn).encode())
    return digest.hexdigest()[:12]


def _code_text(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        return repr(code.co_code) if code is not None else getattr(fn, "__qualname__", type(fn).__name__)


def spec_from_description(entry: Mapping[str, Any]) -> ToolSpec:
    """A dispatcher-side spec (no handler: a call run here fails saying so) from a published
    description. Raises :class:`ConfigurationError` for a description that is not usable (bad
    name, parameters that are not a JSON Schema, missing fields)."""
    for key in ("timeout_s", "max_timeout_s", "poll_interval_s", "max_output_chars"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < 1e9):  # NaN fails both comparisons
            raise ConfigurationError(f"published tool {entry.get('name')!r} cannot be read: {key} {value!r} is not "
                                     "a positive number below 1e9")
    for key in ("queue", "risk", "command_arg", "timeout_arg"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise ConfigurationError(f"published tool {entry.get('name')!r} cannot be read: {key} is not text")
    try:
        options: dict[str, Any] = {
            key: entry[key] for key in ("queue", "timeout_s", "max_output_chars", "cancellable", "idempotent",
                                        "journal", "risk", "command_arg", "pollable", "loop_check")
            if key in entry
        }
        for key in ("timeout_arg", "max_timeout_s", "poll_interval_s"):
            if entry.get(key) is not None:
                options[key] = entry[key]
        options["sensitive"] = tuple(entry.get("sensitive") or ())
        if entry.get("state"):
            from .state import SessionState

            initial = entry.get("state_initial")
            # type `object`: any JSON, checked at open against the published schema (if any); the worker
            # validates the stored value against the real type on load
            options["state"] = SessionState(str(entry["state"]), object, default=lambda: copy.deepcopy(initial),
                                            json_schema=_readable_schema(entry.get("state_schema")))
        access = "write" if entry.get("access_per_call") else entry.get("access", "write")
        spec = tool_from_schema(str(entry["name"]), entry["parameters"], description=str(entry.get("description", "")),
                                access=access, resources=resources_from_form(entry.get("resources", "*")), **options)
    except ConfigurationError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise ConfigurationError(f"published tool {entry.get('name')!r} cannot be read: {exc}") from exc
    if entry.get("version"):
        object.__setattr__(spec, "_published_version", str(entry["version"]))
    return spec


def version_conflicts(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Tools that live workers publish in more than one version: ``{tool: {version: [worker, ...]}}``
    (only tools with two versions or more)."""
    seen: dict[str, dict[str, list[str]]] = {}
    for entry in entries:
        for tool in readable_tools(entry):
            seen.setdefault(tool["name"], {}).setdefault(str(tool.get("version")), []).append(str(entry.get("worker")))
    return {name: versions for name, versions in seen.items() if len(versions) > 1}


def readable_tools(entry: Any) -> list[Mapping[str, Any]]:
    """The readable tool descriptions of one catalog entry (objects with a string ``name``); a
    worker of another version may publish what this one cannot read: skipped, never a crash."""
    tools = entry.get("tools") if isinstance(entry, Mapping) else None
    if not isinstance(tools, list):
        return []
    return [t for t in tools if isinstance(t, Mapping) and isinstance(t.get("name"), str)]


class CatalogRegistry(Registry):
    """A registry built from the live catalog (:func:`catalog_registry`). ``sources`` says where
    each tool's spec came from (``"local"``, ``"live"``, or ``"seen"``: served by no live worker now,
    known from ``<ns>:tools:seen``, :mod:`toolfleet.worker.catalog`); ``conflicts`` as
    :func:`version_conflicts` at the last read. A name it does not know makes it read the catalog
    again (at most every ``REFRESH_MIN_S``), so a worker started after the dispatcher is found."""

    def __init__(self, settings: Any, local: Registry | None, client: Any = None) -> None:
        super().__init__()
        self._settings, self._local, self._client = settings, local or Registry(), client
        self._lock = threading.Lock()
        self._read_at = 0.0
        self.sources: dict[str, str] = {}
        self.conflicts: dict[str, dict[str, list[str]]] = {}
        for spec in self._local:
            self.add(spec)
            self.sources[spec.name] = "local"

    def refresh(self) -> None:
        """Read the live catalog again and take its tools (rules in the module docstring). Raises
        :class:`BrokerUnavailable` if Redis does not answer."""
        import redis

        from ..worker.catalog import live_catalog, seen_tools

        try:
            entries = live_catalog(self._settings, self._client)
            seen = seen_tools(self._settings, self._client)
        except redis.RedisError as exc:
            raise BrokerUnavailable(self._settings.redis_url, str(exc)) from exc
        with self._lock:
            self._read_at = time.monotonic()
            self.conflicts = version_conflicts(entries)
            tools, sources = dict(self._tools), dict(self.sources)
            for entry in entries:
                for description in readable_tools(entry):
                    self._take(tools, sources, description)
            for description in seen:  # served before, by no live worker now: its calls TOOL_UNAVAILABLE
                if description["name"] not in tools:
                    self._take(tools, sources, description, source="seen")
            # swapped whole: a thread iterating the registry meanwhile keeps the dict it started with
            self._tools, self.sources = tools, sources

    def _take(self, tools: dict[str, ToolSpec], sources: dict[str, str], description: Mapping[str, Any],
              source: str = "live") -> None:
        name = description.get("name")
        if not isinstance(name, str):
            return
        current = tools.get(name)
        if current is not None and describe(current)["version"] == description.get("version"):
            return
        local = self._local.get(name)
        if local is not None and describe(local)["version"] == description.get("version"):
            tools[name], sources[name] = local, "local"
            return
        try:
            spec = spec_from_description(description)
        except ConfigurationError:
            return  # a description this version cannot read: its calls get UNKNOWN_TOOL
        tools[name], sources[name] = spec, source

    def get(self, name: str) -> ToolSpec | None:
        spec = self._tools.get(name)
        if spec is None and time.monotonic() - self._read_at >= REFRESH_MIN_S:
            try:
                self.refresh()
            except BrokerUnavailable:
                return None
            spec = self._tools.get(name)
        return spec


def catalog_registry(settings: Any, local: Registry | None = None, client: Any = None) -> CatalogRegistry:
    """The registry of the tools the live workers of ``settings.namespace`` serve, from their
    published specs, over ``local`` (default: the built-in tools; which wins: module docstring).
    ``client``: a Redis client to read with (default: one for ``settings.redis_url``). Raises
    :class:`BrokerUnavailable` if Redis does not answer."""
    if local is None:
        from .registry import default_registry

        local = default_registry()
    registry = CatalogRegistry(settings, local, client)
    registry.refresh()
    return registry
