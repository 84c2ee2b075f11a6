"""Signed call envelopes: workers run only what a dispatcher of the fleet signed (issue 18; docs/signing.md).

The dispatcher signs every call message with HMAC-SHA256 under the fleet key; a worker checks the
signature before it claims the call (before any ledger write, before any handler) and drops a
message that does not verify. What is signed is the canonical JSON (keys sorted, no spaces) of::

    {"v": 1, "task": <task name>, "task_id": <Celery task id>, "queue": <queue it was sent to>,
     "limits": [<soft time limit s>, <hard time limit s>], "envelope": <the envelope minus "signature">}

so the arguments, the tool, the turn and call ids, the workspace, the session, the time limits (the
envelope's and the message headers the worker enforces), ``submitted_at``, ``expires_at`` and the key
id are bound together: changing any of them, or moving the message to another queue, breaks it.
``expires_at`` (unix s, dispatcher clock) bounds a replay in time even where the ledger could be
rewritten (an attacker with write access to Redis); the ledger's claim refuses replays before then.

Keys: a fleet key is a string of at least :data:`MIN_KEY_CHARS` characters (``toolfleet keygen`` or
:func:`generate_key`: 32 random bytes, URL-safe base64). Its key id is derived from it
(:func:`key_id`, a 12-hex-digit fingerprint that reveals nothing of the key), so rotation needs no
naming: the dispatcher signs with the current key; a worker accepts the current key and every
previous key it is given. Keys never reach a log, a message, Flower or ``repr(settings)``
(``SecretStr``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

MIN_KEY_CHARS = 32
SIGNATURE_VERSION = 1
ALGORITHM = "HMAC-SHA256"

# reasons a message is dropped (the counter's fields; docs/signing.md)
UNSIGNED = "unsigned"
MALFORMED = "malformed"
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"
EXPIRED = "expired"
REASONS = (UNSIGNED, MALFORMED, UNKNOWN_KEY, BAD_SIGNATURE, EXPIRED)


def generate_key() -> str:
    """A new random fleet key: 32 bytes from the OS's CSPRNG, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def key_id(key: str) -> str:
    """The public id of ``key``: 12 hex digits of SHA-256 over a label and the key."""
    return hashlib.sha256(b"toolfleet fleet key id\0" + key.encode()).hexdigest()[:12]


def check_key(key: str, what: str = "fleet key") -> str:
    """``key`` stripped, or :class:`ConfigurationError` if it is shorter than :data:`MIN_KEY_CHARS`
    (the message says how to make one, never the key)."""
    key = key.strip()
    if len(key) < MIN_KEY_CHARS:
        raise ConfigurationError(
            f"the {what} is too short ({len(key)} characters; at least {MIN_KEY_CHARS}): make one with "
            "`toolfleet keygen` (32 random bytes)")
    return key


def read_key_file(path: str | Path) -> tuple[str, list[str]]:
    """The keys of a key file: the first non-empty line that is not a ``#`` comment is the current
    key, the following ones are previous keys (still accepted by workers). Raises
    :class:`ConfigurationError` naming the file if it cannot be read or holds no key."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the fleet key file {path}: {exc.strerror or exc}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ConfigurationError(f"the fleet key file {path} holds no key")
    return keys[0], keys[1:]


@dataclass(frozen=True)
class FleetKeys:
    """The current key (signs) and every key a worker accepts (current + previous), by key id."""

    current_id: str
    _by_id: Mapping[str, bytes]

    def __repr__(self) -> str:  # never the keys
        return f"FleetKeys(current={self.current_id!r}, accepted={sorted(self._by_id)!r})"

    @classmethod
    def of(cls, current: str, previous: Iterable[str] = ()) -> FleetKeys:
        current = check_key(current)
        by_id = {key_id(current): current.encode()}
        for old in previous:
            old = check_key(old, "previous fleet key")
            by_id.setdefault(key_id(old), old.encode())
        return cls(key_id(current), by_id)

    @property
    def accepted_ids(self) -> list[str]:
        return sorted(self._by_id)

    def key(self, kid: str) -> bytes | None:
        return self._by_id.get(kid)


def canonical(task: str, task_id: str, queue: str, limits: Any, envelope: Mapping[str, Any]) -> bytes:
    """The bytes that are signed (see the module docstring)."""
    body = {k: v for k, v in envelope.items() if k != "signature"}
    soft, hard = (list(limits) + [None, None])[:2] if isinstance(limits, (list, tuple)) else (None, None)
    doc = {"v": SIGNATURE_VERSION, "task": task, "task_id": task_id, "queue": queue,
           "limits": [soft, hard], "envelope": body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def _mac(key: bytes, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(key, data, hashlib.sha256).digest()).decode().rstrip("=")


def sign(keys: FleetKeys, *, task: str, task_id: str, queue: str, limits: Any,
         envelope: Mapping[str, Any]) -> str:
    """The signature of ``envelope`` (which must already hold ``key_id`` = ``keys.current_id``)."""
    key = keys.key(keys.current_id)
    assert key is not None
    return _mac(key, canonical(task, task_id, queue, limits, envelope))


def signed_fields(keys: FleetKeys, *, task: str, task_id: str, queue: str, fields: Mapping[str, Any],
                  ttl_s: float) -> dict[str, Any]:
    """``fields`` plus ``expires_at`` (now + ``ttl_s``), ``key_id`` and ``signature``: the kwarg of a
    small task that carries no envelope (the tool health check), signed like an envelope without
    header time limits."""
    doc = {**fields, "expires_at": time.time() + ttl_s, "key_id": keys.current_id}
    doc["signature"] = sign(keys, task=task, task_id=task_id, queue=queue, limits=None, envelope=doc)
    return doc


def verify(keys: FleetKeys, *, task: str, task_id: str | None, queue: str | None, limits: Any,
           envelope: Any, now: float | None = None, skew_s: float = 0.0) -> str | None:
    """``None`` if ``envelope`` (the raw dict from the message) carries a valid signature of this
    fleet for this task id, queue and limits and has not expired (``expires_at`` + ``skew_s``,
    unix s); else the reason it is refused (one of :data:`REASONS`). Constant-time comparison."""
    if not isinstance(envelope, Mapping):
        return MALFORMED
    signature, kid, expires_at = envelope.get("signature"), envelope.get("key_id"), envelope.get("expires_at")
    if signature is None and kid is None:
        return UNSIGNED
    if not isinstance(signature, str) or not isinstance(kid, str) or not isinstance(task_id, str) \
            or not isinstance(queue, str) or isinstance(expires_at, bool) \
            or not isinstance(expires_at, (int, float)):
        return MALFORMED
    key = keys.key(kid)
    if key is None:
        return UNKNOWN_KEY
    try:
        expected = _mac(key, canonical(task, task_id, queue, limits, envelope))
    except (TypeError, ValueError):  # not JSON-able (NaN, odd types): nothing a dispatcher signs
        return MALFORMED
    # bytes, not str: compare_digest raises TypeError for a str that is not ASCII, and a forged
    # "é" must be a bad signature, not an exception in the worker's main process
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "surrogatepass")):
        return BAD_SIGNATURE
    try:
        if (time.time() if now is None else now) > float(expires_at) + skew_s:
            return EXPIRED
    except (OverflowError, ValueError):  # a signed 10**400 or NaN: nothing a dispatcher signs
        return MALFORMED
    return None
