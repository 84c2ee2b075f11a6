"""What a handler returned, as a result's ``content`` (text for the model) and ``data`` (JSON for
programs): every value becomes a result at once (issue 11, case 3).

The rules (README "Return values"):

- ``str``: the text itself. Lone surrogates (``"\\ud83d"``, not valid Unicode, not encodable as
  UTF-8) are replaced by U+FFFD; a valid surrogate pair is joined into its character.
- ``bytes`` / ``bytearray`` / ``memoryview`` up to ``MAX_BYTES``: ``content`` describes them (size,
  kind when the magic number tells: PNG, JPEG, GIF, PDF, ZIP, gzip; SHA-256) and ``data`` is
  ``{"bytes_base64": ..., "size_bytes": n, "media_type": ...}``. Larger ones are refused with
  ``EXECUTION_ERROR`` saying why (a result lives in Redis and in the model's context; store big
  binaries elsewhere and return a reference).
- pydantic models: ``model_dump(mode="json")``; dataclasses: their fields; mappings: objects with
  string keys (other keys through ``str``); lists, tuples, sets, frozensets, other iterables of
  known kinds: arrays (sets sorted when their items sort).
- floats NaN, inf, -inf (not JSON): the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
- ints beyond 64 bits: their decimal text as a string (JSON readers lose precision past 2**53 and
  Python refuses to print more than 4300 digits: then a description with the bit length).
- anything else (objects with no JSON form): ``str(value)``; an object whose ``str`` fails: a
  description naming its type. Cycles become ``"<cycle>"``; nesting past ``MAX_DEPTH`` is cut.

:func:`safe_text` is also applied to every text of an error result before it is recorded.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ..text import safe_text  # noqa: F401 - re-exported: worker code imports it from here

MAX_BYTES = 1024 * 1024  # binary results up to 1 MiB go to data as base64; larger ones are refused
MAX_DEPTH = 64
INT_LIMIT = 2**63
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
)


class BinaryTooLarge(ValueError):
    """A handler returned more bytes than :data:`MAX_BYTES`."""


def to_content_and_data(value: Any) -> tuple[str, Any]:
    """``(content, data)`` of a handler's return ``value``: ``content`` is text (not yet fitted to
    the output budget), ``data`` a JSON-safe value or None. Raises :class:`BinaryTooLarge`."""
    if isinstance(value, str):
        return safe_text(value), None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _binary(bytes(value))
    data = to_json(value)
    if isinstance(data, str):
        return data, data
    return json.dumps(data, ensure_ascii=False), data  # compact: one line (a tool's formatter may differ)


def to_json(value: Any, depth: int = 0, seen: frozenset[int] = frozenset()) -> Any:
    """A JSON-safe copy of ``value`` by the rules of this module (bytes: their description)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else
                                                   ("Infinity" if value > 0 else "-Infinity"))
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _describe_bytes(bytes(value))
    if depth >= MAX_DEPTH:
        return f"<nested deeper than {MAX_DEPTH} levels: cut>"
    if id(value) in seen:
        return "<cycle>"
    seen = seen | {id(value)}
    if isinstance(value, BaseModel):
        try:
            return to_json(value.model_dump(mode="python"), depth + 1, seen)
        except Exception:  # a model whose dump fails: its text
            return _text_of(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name, None), depth + 1, seen) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {_key(k): to_json(v, depth + 1, seen) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items.sort()
        except TypeError:
            pass
        return [to_json(v, depth + 1, seen) for v in items]
    if isinstance(value, (list, tuple)):
        return [to_json(v, depth + 1, seen) for v in value]
    return _text_of(value)


def _int(value: int) -> int | str:
    if -INT_LIMIT <= value < INT_LIMIT:
        return value
    try:
        return str(value)
    except ValueError:  # more digits than Python prints (sys.get_int_max_str_digits)
        return f"<integer of {value.bit_length()} bits, too long to print>"


def _key(key: Any) -> str:
    if isinstance(key, str):
        return safe_text(key)
    converted = to_json(key)
    return converted if isinstance(converted, str) else json.dumps(converted, ensure_ascii=False)


def _text_of(value: Any) -> str:
    try:
        return safe_text(str(value))
    except Exception:
        return f"<{type(value).__name__} object that cannot be shown as text>"


def _media_type(raw: bytes) -> str:
    for magic, media in _MAGIC:
        if raw.startswith(magic):
            return media
    return "application/octet-stream"


def _describe_bytes(raw: bytes) -> str:
    return (f"<{len(raw)} bytes of {_media_type(raw)}, sha256 {hashlib.sha256(raw).hexdigest()[:16]}...>")


def _binary(raw: bytes) -> tuple[str, Any]:
    if len(raw) > MAX_BYTES:
        raise BinaryTooLarge(
            f"the handler returned {len(raw)} bytes of {_media_type(raw)}; binary results are kept only up to "
            f"{MAX_BYTES} bytes (they live in Redis and the model's context)")
    media = _media_type(raw)
    content = (f"binary result: {len(raw)} bytes of {media} (sha256 {hashlib.sha256(raw).hexdigest()}); "
               "the bytes are in the result's data as base64 (data.bytes_base64), not shown here")
    return content, {"bytes_base64": base64.b64encode(raw).decode("ascii"), "size_bytes": len(raw),
                     "media_type": media}
