"""One schema violation in words a model can act on: where, what was given, what is wanted, a fix.

:func:`violations` runs a compiled JSON Schema validator (Draft 2020-12, ``jsonschema``) over a
call's arguments and turns every error into :class:`Violation` objects:

- ``pointer``: where, as an RFC 6901 JSON pointer into the arguments (``/limit``, ``/items/0``;
  ``""`` is the arguments object itself);
- ``given``: the value as quoted back (secrets masked, shortened: :mod:`.redact`), or ``nothing``;
  a value under a secret-named parameter or a parameter the tool declares ``sensitive`` is shown
  only as its kind and size, and the call's secret values are masked wherever else they appear;
- ``wants``: what the schema wants there, in words (``an integer from 1 to 10000``);
- ``fix``: one line saying what to send instead.

No value is coerced: ``"10"`` for an integer is a violation whose fix says to drop the quotes.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from .redact import is_secret_name, kind_of, redact_text, redact_value, secret_values, shorten, show_given

ENUM_SHOWN = 12
PLACEHOLDER = '"…"'  # an example that says nothing: left out of fixes
NAMES_SHOWN = 20
_ARTICLE = {"integer": "an integer", "object": "an object", "array": "an array", "null": "null"}
_PLURAL = {"string": "strings", "integer": "integers", "number": "numbers", "boolean": "booleans",
           "object": "objects", "array": "arrays", "null": "nulls"}


@dataclass(frozen=True)
class Violation:
    """One problem with one place in the arguments (see the module docstring for the fields)."""

    pointer: str
    keyword: str
    given: str
    wants: str
    fix: str

    def line(self) -> str:
        where = self.pointer or "(the arguments object)"
        return f"{where}: given {self.given}; wants {self.wants}. Fix: {self.fix}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class _Secrets:
    """What of a call is secret: the tool's declared ``sensitive`` parameters (hidden whole, as
    secret-named ones are) and the secret values the arguments hold (masked wherever they appear)."""

    sensitive: frozenset[str] = frozenset()
    known: tuple[str, ...] = ()

    def hidden(self, path: list[Any]) -> bool:
        return bool(path) and path[0] in self.sensitive or any(is_secret_name(p) for p in path)

    def given(self, value: Any, path: list[Any]) -> str:
        """:func:`~.redact.show_given` that also hides a ``sensitive`` parameter and masks ``known``."""
        if value is not None and not isinstance(value, bool) and self.hidden(path):
            size = f" of {len(value)} chars" if isinstance(value, str) else ""
            return f"<hidden: {kind_of(value)}{size}>"
        if not self.known:
            return show_given(value, path)
        try:
            text = json.dumps(redact_value(value, self.known), ensure_ascii=False, default=str)
        except (TypeError, ValueError, RecursionError):
            text = f"<{kind_of(value)}>"
        return shorten(redact_text(text, self.known))

    def mask(self, text: str) -> str:
        return redact_text(text, self.known)

    def where(self, path: Iterable[Any]) -> str:
        """The JSON pointer of ``path``, each key masked before it is escaped (a key is the model's
        text: ``~1`` in place of ``/`` would hide a URL's credential from the masking)."""
        return pointer(self.mask(p) if isinstance(p, str) else p for p in path)


def violations(validator: Validator, arguments: Any, sensitive: Iterable[str] = ()) -> list[Violation]:
    """Every violation of ``arguments`` against the validator's schema, at once, ordered by
    pointer; one per place and keyword. ``sensitive``: the tool's declared sensitive parameters,
    whose values are never quoted (nor, masked, anywhere else the text would show them)."""
    root = validator.schema
    errors = list(validator.iter_errors(arguments))
    if not errors:
        return []  # the common case: no secret values to collect
    sensitive = frozenset(sensitive)
    secrets = _Secrets(sensitive, tuple(sorted(secret_values(arguments, sensitive), key=len, reverse=True)))
    found: dict[tuple[str, str], Violation] = {}
    for error in errors:
        for violation in _describe(error, root, secrets):
            found.setdefault((violation.pointer, violation.keyword), violation)
    return sorted(found.values(), key=lambda v: v.pointer)


def pointer(parts: Iterable[Any]) -> str:
    """RFC 6901 pointer of a path (``~`` and ``/`` escaped); ``""`` for the root."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _describe(error: ValidationError, root: Mapping[str, Any], secrets: _Secrets) -> list[Violation]:
    path = list(error.absolute_path)
    where = secrets.where(path)
    kind = str(error.validator)
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    instance = error.instance
    name = _name(path, secrets)
    if kind == "required":
        return _missing(error, path, schema, root, secrets)
    if kind in ("additionalProperties", "unevaluatedProperties"):
        return _unknown(path, schema, instance, kind, secrets)
    hidden = secrets.hidden(path)
    given = secrets.given(instance, path)
    given_kind = given if given.startswith("<hidden") else f"{given} ({kind_of(instance)})"
    wants = describe_schema(schema, root)
    if kind == "type":
        return [Violation(where, kind, given_kind, wants, _type_fix(name, instance, schema, root, hidden, secrets))]
    if kind == "enum":
        close = None if hidden else _close(instance, schema.get("enum") or [])
        fix = f"use {close}" if close else f"use one of the allowed values for {name}"
        return [Violation(where, kind, given, wants, fix + ".")]
    if kind in ("anyOf", "oneOf"):
        fix = f"send {name} as {wants}"
        if kind == "oneOf" and not list(error.context or []):
            fix = f"make {name} match exactly one of the alternatives: {wants}"
        return [Violation(where, kind, given_kind, wants, fix + ".")]
    if kind == "const":
        return [Violation(where, kind, given, wants, f"send {name} as {_dump(schema.get('const'))}.")]
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                "minLength", "maxLength", "pattern", "format", "minItems", "maxItems", "uniqueItems",
                "minProperties", "maxProperties", "contains", "minContains", "maxContains"):
        return [Violation(where, kind, given, wants, f"change {name} to {wants}.")]
    if hidden:  # jsonschema's message quotes the value (as Python's repr: not what ``known`` holds)
        return [Violation(where, kind, given, wants, f"change {name} to satisfy the '{kind}' rule.")]
    detail = shorten(secrets.mask(error.message), 160)
    return [Violation(where, kind, given, f"{wants} ({detail})", f"change {name} to satisfy the '{kind}' rule.")]


def _missing(error: ValidationError, path: list[Any], schema: Mapping[str, Any],
             root: Mapping[str, Any], secrets: _Secrets) -> list[Violation]:
    instance = error.instance if isinstance(error.instance, Mapping) else {}
    properties = _resolve(schema, root).get("properties") or {}
    out = []
    for missing in error.validator_value or ():
        if missing in instance:
            continue
        prop = _resolve(properties.get(missing, {}), root)
        wants = describe_schema(prop, root)
        about = prop.get("description") if isinstance(prop, Mapping) else None
        text = f"{wants} ({shorten(str(about), 100)})" if about else wants
        example = _example(prop, root, secret=secrets.hidden([*path, missing]))
        eg = f", e.g. {_dump(missing)}: {example}" if example != PLACEHOLDER else ""
        out.append(Violation(secrets.where([*path, missing]), "required", "nothing", text,
                             f"add the required parameter {_dump(missing)}{eg}."))
    return out


def _unknown(path: list[Any], schema: Mapping[str, Any], instance: Any, kind: str,
             secrets: _Secrets) -> list[Violation]:
    if not isinstance(instance, Mapping):
        return []
    allowed = list((schema.get("properties") or {}).keys())
    patterns = list((schema.get("patternProperties") or {}).keys())
    missing = [r for r in schema.get("required") or () if r not in instance]
    extras = [key for key in instance if key not in allowed and not _matches_any(key, patterns)]
    known = secrets.known
    shown = ", ".join(_dump(a) for a in allowed[:NAMES_SHOWN]) + (" …" if len(allowed) > NAMES_SHOWN else "")
    wants = f"no parameter by this name; the parameters are {shown}" if allowed else "no parameters here"
    out = []
    for extra in extras:
        close = difflib.get_close_matches(str(extra), [a for a in allowed if a not in instance], n=1, cutoff=0.6)
        if close:
            fix = f"rename {_dump(extra, known)} to {_dump(close[0])}."
        elif len(missing) == 1 and len(extras) == 1:
            fix = f"rename {_dump(extra, known)} to the required {_dump(missing[0])}, or remove it."
        else:
            fix = f"remove {_dump(extra, known)}."
        at = [*path, extra]
        out.append(Violation(secrets.where(at), kind, secrets.given(instance[extra], at), wants, fix))
    return out


def _type_fix(name: str, instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any],
              hidden: bool = False, secrets: _Secrets | None = None) -> str:
    wanted = _types(schema)
    if isinstance(instance, str) and wanted:
        try:
            inner = json.loads(instance)
        except ValueError:
            inner = None
        if inner is not None and _json_type(inner) in wanted or (
            "number" in wanted and isinstance(inner, int) and not isinstance(inner, bool)
        ):
            if hidden:  # the value is a secret: say what to do, not what it is
                return f"send {name} without the quotes around its value."
            return f"send {name} as {_dump(inner, secrets.known if secrets else ())}, without the quotes around it."
    return f"send {name} as {describe_schema(schema, root)}{_eg(_example(schema, root))}."


def describe_schema(schema: Any, root: Mapping[str, Any], depth: int = 0) -> str:
    """What ``schema`` wants, in words: ``an integer from 1 to 10000``, ``a string or null``,
    ``one of "a", "b"``, ``an array of strings``."""
    schema = _resolve(schema, root)
    if schema is True or schema == {}:
        return "any value"
    if schema is False:
        return "nothing (no value is allowed here)"
    if not isinstance(schema, Mapping):
        return "a value"
    if "const" in schema:
        return f"exactly {_dump(schema['const'])}"
    if "enum" in schema:
        values = list(schema["enum"])
        shown = ", ".join(_dump(v) for v in values[:ENUM_SHOWN]) + (" …" if len(values) > ENUM_SHOWN else "")
        return f"one of {shown}"
    for key in ("anyOf", "oneOf"):
        if key in schema and depth < 4:
            options = [describe_schema(s, root, depth + 1) for s in schema[key]]
            return " or ".join(dict.fromkeys(options))
    if "allOf" in schema and depth < 4:
        return " and ".join(dict.fromkeys(describe_schema(s, root, depth + 1) for s in schema["allOf"]))
    types = _types(schema)
    if not types:
        types = ["object"] if "properties" in schema else ["array"] if "items" in schema else []
    if not types:
        return "a value"
    return " or ".join(_with_limits(t, schema, root, depth) for t in types)


def _with_limits(kind: str, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
    text = _ARTICLE.get(kind, f"a {kind}")
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            text += f" from {low} to {high}"
        else:
            bounds = [f"{sign} {schema[key]}" for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                                 ("maximum", "≤"), ("exclusiveMaximum", "<"))
                      if schema.get(key) is not None]
            text += (" " + " and ".join(bounds)) if bounds else ""
        if schema.get("multipleOf") is not None:
            text += f", a multiple of {schema['multipleOf']}"
    elif kind == "string":
        low, high = schema.get("minLength"), schema.get("maxLength")
        if low is not None or high is not None:
            text += f" of {low or 0} to {high} characters" if high is not None else f" of at least {low} characters"
        if schema.get("pattern"):
            text += f" matching /{schema['pattern']}/"
        if schema.get("format"):
            text += f" in {schema['format']} format"
    elif kind == "array":
        items = schema.get("items")
        if isinstance(items, Mapping) and items and depth < 3:
            inner = describe_schema(items, root, depth + 1)
            plural = _PLURAL.get(inner.removeprefix("an ").removeprefix("a "))
            text += f" of {plural}" if plural else f" whose items are each {inner}"
        if schema.get("minItems") is not None:
            text += f" with at least {schema['minItems']} items"
        if schema.get("maxItems") is not None:
            text += f" with at most {schema['maxItems']} items"
        if schema.get("uniqueItems"):
            text += " with no duplicates"
    elif kind == "object":
        required = list(schema.get("required") or ())
        if required:
            text += " with " + ", ".join(_dump(r) for r in required[:NAMES_SHOWN])
    return text


def _example(schema: Any, root: Mapping[str, Any], secret: bool = False) -> str:
    schema = _resolve(schema, root)
    if not isinstance(schema, Mapping):
        return PLACEHOLDER
    for key in ("default", "const"):
        if key in schema and schema[key] is not None and not secret:
            return _dump(schema[key])
    if schema.get("examples") and not secret:
        return _dump(schema["examples"][0])
    if schema.get("enum"):
        return _dump(schema["enum"][0])
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return _example(schema[key][0], root, secret)
    kind = (_types(schema) or ["string"])[0]
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        if low is None and schema.get("exclusiveMinimum") is not None:
            low = schema["exclusiveMinimum"] + 1
        if low is None:
            low = 1
        return str(int(low)) if kind == "integer" else str(low)
    return {"boolean": "true", "array": "[]", "object": "{}", "null": "null"}.get(kind, PLACEHOLDER)


def _eg(example: str) -> str:
    return "" if example == PLACEHOLDER else f", e.g. {example}"


def _resolve(schema: Any, root: Mapping[str, Any]) -> Any:
    """Follow local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) a few levels deep."""
    for _ in range(8):
        if not isinstance(schema, Mapping) or not isinstance(schema.get("$ref"), str):
            return schema
        ref = schema["$ref"]
        if not ref.startswith("#"):
            return schema
        target: Any = root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, Mapping) else None
        if target is None:
            return schema
        merged = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **merged} if isinstance(target, Mapping) else target
    return schema


def _types(schema: Any) -> list[str]:
    if not isinstance(schema, Mapping):
        return []
    kind = schema.get("type")
    return [kind] if isinstance(kind, str) else [str(k) for k in kind] if isinstance(kind, list) else []


def _json_type(value: Any) -> str:
    return kind_of(value).removeprefix("an ").removeprefix("a ")


def _name(path: list[Any], secrets: _Secrets | None = None) -> str:
    """How a fix names the place: ``"limit"`` for a parameter, ``"filters/0/name"`` deeper down."""
    if not path:
        return "the arguments"
    secrets = secrets or _Secrets()
    return _dump(path[0], secrets.known) if len(path) == 1 else _dump(secrets.where(path)[1:], secrets.known)


def _close(value: Any, options: list[Any]) -> str | None:
    if not isinstance(value, str):
        return None
    strings = {str(o): o for o in options if isinstance(o, str)}
    lowered = {s.lower(): s for s in strings}
    if value.lower() in lowered:
        return _dump(lowered[value.lower()])
    match = difflib.get_close_matches(value, list(strings), n=1, cutoff=0.6)
    return _dump(match[0]) if match else None


def _matches_any(key: str, patterns: list[str]) -> bool:
    return any(re.search(p, key) for p in patterns)


def _dump(value: Any, known: tuple[str, ...] = ()) -> str:
    """``value`` as JSON, secrets masked (it may be the model's: a parameter name, a value), then shortened."""
    return shorten(redact_text(json.dumps(redact_value(value, known), ensure_ascii=False, default=str), known), 60)
