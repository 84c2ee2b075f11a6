"""The JSON form of a stored session state (:mod:`toolfleet.tools.state`): how it is written, and
the check that what is written loads back as it was before it is stored.

- **NaN and the infinities** are written as the JSON constants ``NaN``, ``Infinity`` and
  ``-Infinity`` (pydantic reads them back; pydantic's default writes ``null``, which a ``float``
  field refuses on load: the state was lost). A pydantic model's own ``ser_json_inf_nan``
  still decides for its untyped (``Any``) fields; the check below catches what that loses.
- **Round-trip check**: the JSON is validated back against the declared type and compared with
  the value saved (:func:`difference`): NaN equals NaN, a random generator compares by its
  state, a set equals a frozenset and a list a tuple, a model or dataclass by type and fields,
  anything else by ``==`` (an object without ``__eq__`` of the same type passes: the JSON
  decides). A value that does not load back, or loads back as something else (a set or datetime
  in an untyped field comes back a list or a string; a field dumped under a
  ``serialization_alias`` comes back as its default; an excluded or computed field), is refused
  with the path and the reason, and nothing is stored.
"""

from __future__ import annotations

import dataclasses
import math
import random
import reprlib
from collections.abc import Mapping
from typing import Any

import pydantic_core
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from .redact import redact_text, redact_value

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 24, 24, 3, 3
SHOWN_CHARS = 24
_CONSTANTS = ConfigDict(ser_json_inf_nan="constants")


def json_writer(type_: Any) -> TypeAdapter | None:  # type: ignore[type-arg]
    """An adapter of ``tuple[type_]`` whose config writes NaN and infinities as constants (a
    dataclass or model refuses a config of its own; wrapped, a stdlib dataclass, TypedDict or
    container takes it). ``None`` when that type cannot be built: then the plain adapter writes."""
    try:
        return TypeAdapter(tuple[type_], config=_CONSTANTS)  # type: ignore[valid-type]
    except Exception:  # noqa: BLE001 - the plain adapter is the fallback
        return None


def to_json(adapter: TypeAdapter, writer: TypeAdapter | None, value: Any) -> bytes:  # type: ignore[type-arg]
    """The JSON bytes of ``value`` (NaN and infinities as constants). Raises what pydantic raises
    for a value without a JSON form."""
    if writer is not None:
        data = writer.dump_python((value,), mode="json", round_trip=True, warnings=False)[0]
    else:
        data = adapter.dump_python(value, mode="json", round_trip=True, warnings=False)
    return pydantic_core.to_json(data, inf_nan_mode="constants")


def difference(saved: Any, loaded: Any, path: str = "$") -> str | None:
    """Where and how ``loaded`` differs from ``saved`` (``"at $.a[2]: a set is loaded back as a
    list"``), or ``None`` when they are equal enough (module docstring)."""
    if saved is loaded:
        return None
    if isinstance(saved, (dict, list, set, frozenset, str, int)) and type(saved) is type(loaded) and saved == loaded:
        return None  # the common case, compared in C (a NaN or a generator inside: walked below)
    if isinstance(saved, float) and isinstance(loaded, float) and math.isnan(saved) and math.isnan(loaded):
        return None
    if isinstance(saved, random.Random):
        same = isinstance(loaded, random.Random) and saved.getstate() == loaded.getstate()
        return None if same else _differs(path, saved, loaded)
    if isinstance(saved, BaseModel) or (dataclasses.is_dataclass(saved) and not isinstance(saved, type)):
        if type(loaded) is not type(saved):
            return _differs(path, saved, loaded)
        names = (list(type(saved).model_fields) if isinstance(saved, BaseModel)
                 else [f.name for f in dataclasses.fields(saved)])
        for name in names:
            found = difference(getattr(saved, name, None), getattr(loaded, name, None), f"{path}.{name}")
            if found:
                return found
        if isinstance(saved, BaseModel):
            return difference(saved.__pydantic_extra__ or {}, loaded.__pydantic_extra__ or {}, path)
        return None
    if isinstance(saved, Mapping):
        if not isinstance(loaded, Mapping):
            return _differs(path, saved, loaded)
        missing = [k for k in saved if k not in loaded] or [k for k in loaded if k not in saved]
        if missing:
            return f"at {path}: the key {_SHORT.repr(missing[0])} is not loaded back as it was saved"
        for key, value in saved.items():
            found = difference(value, loaded[key], f"{path}[{_SHORT.repr(key)}]")
            if found:
                return found
        return None
    if isinstance(saved, (list, tuple)):
        if not isinstance(loaded, (list, tuple)) or len(saved) != len(loaded):
            return _differs(path, saved, loaded)
        for i, (a, b) in enumerate(zip(saved, loaded, strict=True)):
            found = difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(saved, (set, frozenset)):
        return None if isinstance(loaded, (set, frozenset)) and saved == loaded else _differs(path, saved, loaded)
    try:
        if bool(saved == loaded):
            return None
    except Exception:  # noqa: BLE001 - an == that does not answer a bool (arrays): the JSON decides
        return None if type(saved) is type(loaded) else _differs(path, saved, loaded)
    if type(saved) is type(loaded) and type(saved).__eq__ is object.__eq__:
        return None  # no equality of its own: the JSON decides
    return _differs(path, saved, loaded)


def _differs(path: str, saved: Any, loaded: Any) -> str:
    if type(saved) is not type(loaded):
        return f"at {path}: a {type(saved).__name__} is loaded back as {type(loaded).__name__}"
    return f"at {path}: {_shown(saved)} is loaded back as {_shown(loaded)}"


def _shown(value: Any) -> str:
    """A short repr of ``value``, its secrets masked first (:func:`.redact.redact_text`), then cut:
    ``reprlib`` cuts a string to its head and tail, which could leave a token's tail without the
    shape that makes it recognisable."""
    if isinstance(value, str):
        text = redact_text(repr(value))
        return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 1]}…"
    return redact_text(_SHORT.repr(redact_value(value)))


def validation_text(exc: Exception) -> str:
    """The first lines of a validation error, without pydantic's link lines nor the input values it
    quotes cut short (a secret cut in two has no recognisable shape): where and what, masked."""
    if isinstance(exc, ValidationError):
        lines = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
                 for e in exc.errors(include_input=False, include_url=False)]
    else:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip() and "errors.pydantic.dev" not in line]
    return redact_text("; ".join(lines[:4]))
