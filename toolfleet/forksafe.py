"""Locks that a forked child gets unlocked.

A worker's pool processes are forked from its main process (Celery's prefork pool, billiard's
``os.fork``) while the main process's own threads run: the ledger steps (worker/main_steps.py),
the catalog heartbeat, the live-session host. ``fork`` copies a lock as it is at that instant, and
only the forking thread goes on in the child, so a lock another thread held then stays held in
the child for ever: the child's first call that takes it hangs before its claim until the hard
time limit kills it (seen: a pool process forked to replace one killed at its hard limit, while
the steps thread recording that kill held ``Runtime._lock``).

:func:`lock` makes a ``threading.Lock`` that every child forked later gets unlocked: one
``os.register_at_fork(after_in_child=...)`` hook re-creates the state of each lock made here that
is still alive, as CPython's ``logging`` does for its handlers' locks (``Lib/logging/__init__.py``,
``_register_at_fork_reinit_lock``). Meant for the locks of objects that live in a worker's main
process and are used in its pool processes; the state such a lock guards is the caller's to reset
in the child (a child starts its own threads and connections, see worker/runtime.py).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

_locks: weakref.WeakSet[Any] = weakref.WeakSet()


def lock() -> threading.Lock:
    """A new ``threading.Lock``, unlocked in every child forked after this call returns."""
    made = threading.Lock()
    _locks.add(made)
    return made


def _reinit_in_child() -> None:
    for each in list(_locks):
        each._at_fork_reinit()  # CPython 3.9+: what logging and threading use for the same purpose


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_in_child)
