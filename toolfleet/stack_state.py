"""The local stack's state: the file ``toolfleet up`` writes (``$TOOLFLEET_HOME/stack.json``, default
``~/.toolfleet``: URLs, process ids, log files, the fleet key file) and what other programs on this
machine read of a running stack from it (its Redis URL, its fleet key: :func:`with_local_fleet_key`).

Starting and stopping the stack is :mod:`toolfleet.stack`'s (which re-exports these names); this module
imports nothing beyond the standard library's basics, so a dispatcher finding the local stack pays
for no more.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def home() -> Path:
    return Path(os.environ.get("TOOLFLEET_HOME") or Path.home() / ".toolfleet")


def _state_file() -> Path:
    return home() / "stack.json"


def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write(state: dict[str, Any]) -> None:
    path = _state_file()
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)  # it holds the Redis URL, password included: its owner's eyes only
    path.write_text(json.dumps(state, indent=2))


def _alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not reaped yet, does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def running_redis_url() -> str | None:
    """The Redis URL of a running local stack, if any."""
    state = read_state()
    if state and _alive(state.get("worker_pid")):
        return state["redis_url"]
    return None


def running_fleet_key_file() -> str | None:
    """The fleet key file of a running local stack, if it made one (``toolfleet up`` without
    ``TOOLFLEET_FLEET_KEY``/``TOOLFLEET_FLEET_KEY_FILE`` in its environment)."""
    state = read_state()
    if state and _alive(state.get("worker_pid")) and state.get("fleet_key_file"):
        return str(state["fleet_key_file"])
    return None


def with_local_fleet_key(environ: dict[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: the process's), plus ``TOOLFLEET_FLEET_KEY_FILE`` of the running local
    stack when it names no fleet key: what a dispatcher on this machine passes to
    :meth:`toolfleet.Settings.from_env` to talk to the stack ``toolfleet up`` started."""
    env = dict(os.environ if environ is None else environ)
    if not env.get("TOOLFLEET_FLEET_KEY") and not env.get("TOOLFLEET_FLEET_KEY_FILE") \
            and (key_file := running_fleet_key_file()):
        env["TOOLFLEET_FLEET_KEY_FILE"] = key_file
    return env


def _fleet_key_env(state: dict[str, Any]) -> dict[str, str] | None:
    """The environment that gives the stack's workers their fleet key: the caller's key if it set
    one, else a new random key in ``$TOOLFLEET_HOME/fleet.key`` (mode 0600), made per stack."""
    if os.environ.get("TOOLFLEET_FLEET_KEY") or os.environ.get("TOOLFLEET_FLEET_KEY_FILE"):
        return None
    from .signing import generate_key

    path = home() / "fleet.key"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"# fleet key of the local stack (toolfleet up); removed by toolfleet down\n{generate_key()}\n")
    state["fleet_key_file"] = str(path)
    return {"TOOLFLEET_FLEET_KEY_FILE": str(path)}
