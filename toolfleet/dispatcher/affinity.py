"""Dispatcher side of live sessions: route a session's calls to the worker that holds its process,
and close a session (:mod:`toolfleet.worker.affinity` is the worker side).

A call of a live tool (:data:`~toolfleet.worker.affinity.LIVE_TOOLS`) in a session goes to
``<namespace>.w.<holder>`` while the holder key names a worker whose liveness key is set; else to
the tool's queue, where the worker that takes it either becomes the holder (no holder yet) or
answers ``SESSION_LOST`` (the holder is gone). Two Redis reads per live call, none for other tools.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from ..keys import Keys
from ..redis_client import client_for
from ..settings import Settings
from ..worker.affinity import LIVE_TOOLS, worker_queue

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def _client(url: str) -> redis.Redis:
    with _lock:
        if url not in _clients:
            _clients[url] = client_for(url, socket_connect_timeout=3, socket_timeout=5)
        return _clients[url]


def live_queue(settings: Settings, spec: Any, session_id: str | None) -> str | None:
    """The holder's own queue for a call of a live tool in ``session_id`` whose holder is alive,
    else ``None`` (the tool's queue). A Redis error gives ``None``: the worker decides then."""
    if spec.name not in LIVE_TOOLS or not session_id:
        return None
    keys = Keys(settings.namespace)
    client = _client(settings.ledger)
    try:
        holder = client.get(keys.live_holder(session_id))
        if holder is None:
            return None
        worker = holder.decode()
        return worker_queue(keys, worker) if client.exists(keys.live_worker(worker)) else None
    except redis.RedisError:
        return None


def live_holder(settings: Settings, session_id: str) -> str | None:
    """The worker that holds ``session_id``'s shell, or ``None``. Raises ``redis.RedisError``."""
    raw = _client(settings.ledger).get(Keys(settings.namespace).live_holder(session_id))
    return None if raw is None else raw.decode()


LIST_SCAN_COUNT = 500
"""Keys a ``SCAN`` step of :func:`live_sessions` asks for (Redis's COUNT hint)."""


def live_sessions(settings: Settings) -> dict[str, dict[str, Any]]:
    """The live shells held now: ``{session_id: {"worker": str, "worker_alive": bool,
    "idle_expires_in_s": int}}`` (``idle_expires_in_s``: seconds until the shell's idle TTL ends
    it, ``-1`` when Redis says none). Found by ``SCAN`` of ``<ns>:live:holder:*`` (every master of a
    cluster), ``LIST_SCAN_COUNT`` keys a step: time linear in the ledger's keys, no index to keep.
    Raises ``redis.RedisError`` when Redis does not answer."""
    keys = Keys(settings.namespace)
    client = _client(settings.ledger)
    prefix = len(keys.live_holders_pattern) - 1
    found = {}
    for raw in client.scan_iter(match=keys.live_holders_pattern, count=LIST_SCAN_COUNT):
        key = raw.decode() if isinstance(raw, bytes) else raw
        holder, ttl_ms = client.get(key), client.pttl(key)
        if holder is None:  # ended between the SCAN and the read
            continue
        worker = holder.decode()
        found[key[prefix:]] = {"worker": worker, "worker_alive": bool(client.exists(keys.live_worker(worker))),
                               "idle_expires_in_s": -1 if ttl_ms < 0 else round(ttl_ms / 1000)}
    return found


def close_live_session(settings: Settings, session_id: str) -> str | None:
    """Close ``session_id``'s live shell: its holder ends it (and every process of its sandbox) at
    its next housekeeping, within ``min(heartbeat_s / 2, 1 s)`` (docs/guarantees.md). Returns the
    worker that held it, or ``None`` if none did. Raises ``redis.RedisError`` when Redis does not answer."""
    client = _client(settings.ledger)
    key = Keys(settings.namespace).live_holder(session_id)
    with client.pipeline(transaction=True) as pipe:  # one key: MULTI on a cluster too
        pipe.get(key)
        pipe.delete(key)
        holder, _ = pipe.execute()
    return None if holder is None else holder.decode()
