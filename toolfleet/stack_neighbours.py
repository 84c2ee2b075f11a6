"""What the local stack (:mod:`.stack`) reads of the workers of its namespace on a Redis it shares:
the catalog entry of the worker it started, and which other live workers share its queues (any:
calls may run on either) or hold another fleet key (each drops the other's calls it takes)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from .errors import shown_url
from .keys import Keys

if TYPE_CHECKING:
    from rich.console import Console


def _catalog_entry(client: Any, keys: Keys) -> dict[str, Any] | None:
    """The catalog entry of the worker that `up` started (the first name on workers:ready, a list
    `up` emptied before starting it), or None while it has not published one."""
    name = client.lindex(keys.workers_ready, 0)
    raw = client.get(keys.catalog(name)) if name else None
    return json.loads(raw) if raw else None


def _warn_shared(client: Any, keys: Keys, namespace: str, url: str, console: Console) -> None:
    """Say which live workers already serve ``namespace`` on a reused Redis: the stack's workers
    will share their queues (calls may run on either) (issue 15, point 12)."""
    names = sorted(client.smembers(keys.workers))
    live = [n for n, raw in zip(names, client.mget([keys.catalog(n) for n in names]) if names else [],
                                strict=True) if raw]
    if live:
        console.print("[yellow]warning:[/] " + escape(
                      f"namespace {namespace!r} at {shown_url(url)} already has {len(live)} live "
                      f"worker(s): {', '.join(live)}; this stack's workers share their queues (calls may run on "
                      "either). If they are yours (a worker started by hand, or a stack of another TOOLFLEET_HOME "
                      "such as the demo's), stop them or leave them be; for a fleet of your own pass --namespace "
                      "NAME (or set TOOLFLEET_NAMESPACE)."))


def _warn_other_keys(client: Any, keys: Keys, mine: dict[str, Any], namespace: str, console: Console) -> None:
    """Say which other live workers of ``namespace`` hold another fleet key than the stack's worker
    (catalog ``key_ids``): they share its queues, and each drops, unrun, the calls of the other that it
    takes (a newcomer's trap: a worker started by hand before `toolfleet down` and `up`, which make a
    new key; or a demo with a home of its own on the same namespace)."""
    ours = set(mine.get("key_ids") or ())
    if not ours:
        return
    names = sorted(n for n in client.smembers(keys.workers) if n != mine.get("worker"))
    others = []
    for name, raw in zip(names, client.mget([keys.catalog(n) for n in names]) if names else [], strict=True):
        try:
            entry = json.loads(raw) if raw else None
        except ValueError:
            continue
        ids = entry.get("key_ids", ()) if isinstance(entry, dict) else None
        if isinstance(ids, list) and not ours & set(ids):
            others.append(name)
    if others:

        from .worker.catalog import other_key_warning

        console.print("[yellow]warning:[/] " + escape(other_key_warning(
            others, namespace, "Stop them (a worker started by hand before `toolfleet down` and `up` holds the old "
            "key: start it again), or give this stack a namespace of its own (--namespace).")))
