"""Live sessions on a worker: the shells it holds, its own queue, and who holds which session.

The shells of live sessions (:mod:`.live_shell`) live in the worker's **main process**, which
outlives its pool processes: a :class:`SessionHost` there listens on a Unix socket (in a private
directory under ``/tmp``, which every sandbox covers with a tmpfs of its own, so no sandboxed command
can reach it) and runs commands for the pool process whose task is the call
(:mod:`toolfleet.tools.shell_session` is the client). Every ``bwrap`` is started by one thread that
lives as long as the worker, so ``--die-with-parent`` ends the shells only when the worker ends.

Redis keys (:class:`toolfleet.keys.Keys`):

- ``live_holder(session)``: the worker that holds the session's shell, with a time to live of the
  idle TTL (renewed by each call). The first call of a session goes to the tool's queue; the worker
  that takes it writes this key (``SET NX``) and becomes the holder.
- ``live_worker(worker)``: set while the worker is alive, renewed every ``heartbeat_s / 2``, expiring
  after ``2 * heartbeat_s``: the liveness bound of a live session.
- ``live_workers``: set of the workers that have a queue of their own (for the rescue below).

Each worker also consumes the queue ``<namespace>.w.<hostname>``; the dispatcher sends a session's
calls there while its holder is alive (:mod:`toolfleet.dispatcher.affinity`).

Choice: **SESSION_LOST**, not a silent restart. When the holder is gone (killed, stopped, or it
came back without the shell), the next call of the session gets ``SESSION_LOST`` and the holder key
is dropped, so the call after it starts a new shell. A shell holds more than cwd and environment
(background processes, shell functions, files under its private ``/tmp``), so restarting it quietly
would let the model believe in state that no longer exists. A call already sent to the queue of a
holder that died is answered ``SESSION_LOST`` by another live worker (it drains that queue:
:mod:`.live_rescue`).

Close and expiry: :func:`toolfleet.dispatcher.affinity.close_live_session` drops the holder key;
the holder's housekeeping (every ``heartbeat_s / 2``, at most 1 s) then ends the shell. A shell idle
past ``TOOLFLEET_LIVE_SESSION_TTL_S`` (default 1800 s) is ended the same way. A warm shutdown ends
every shell; a killed worker takes its shells with it (``--die-with-parent``, PID namespaces); a
frozen one, or one cut off from Redis, loses them to their lease before its liveness lapses
(:mod:`.sandbox_lease`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.signals import celeryd_after_setup, worker_shutdown

from ..errors import ToolFailure
from ..keys import Keys
from ..redis_client import client_for
from .catalog import mget
from .holder_keys import _RENEW_IF, _delete_if, _s, lost_reply
from .live_shell import Shell
from .sandbox_lease import LeaseFile, private_dir
from .sandbox_lease import margin_s as lease_margin_s
from .shell_outcome import LeaseLapsed, ShellEnded
from .shell_start import _Spawner

log = logging.getLogger(__name__)
LIVE_TOOLS = frozenset({"shell"})
"""Tools whose calls go to the worker that holds their session's process."""
END_LOCK_WAIT_S = 30.0  # how long an ended session's closer waits for the call using its shell (s)
LOCK_POLL_S = 0.05  # how often a call waiting for its session's lock looks at its cancel and deadline (s)
_host: SessionHost | None = None  # in the main process; its socket path is inherited by pool processes
socket_path: str | None = None


def idle_ttl_s() -> float:
    """Seconds a live session may stay idle before its shell is ended (``TOOLFLEET_LIVE_SESSION_TTL_S``)."""
    try:
        return max(float(os.environ.get("TOOLFLEET_LIVE_SESSION_TTL_S", "1800")), 1.0)
    except ValueError:
        return 1800.0


def worker_queue(keys: Keys, worker: str) -> str:
    """The queue only ``worker`` consumes: ``<namespace>.w.<worker>``."""
    return keys.queue(f"w.{worker}")


class _Session:
    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.lock = threading.Lock()
        self.used_at = time.monotonic()
        self.running: threading.Event | None = None  # the cancel signal of the command running now
        self.closed = False


class SessionHost:
    """The live sessions of one worker (main process)."""

    def __init__(self, runtime: Any, worker: str) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.keys = Keys(self.settings.namespace)
        self.worker = worker
        self.redis = client_for(self.settings.ledger, socket_connect_timeout=3, socket_timeout=10)
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()
        self.create_lock = threading.Lock()
        self.stop = threading.Event()
        self.spawner = _Spawner()
        self.spawner.start()
        self.dir = private_dir("live")
        self.path = os.path.join(self.dir, "host.sock")
        self.lease = LeaseFile(os.path.join(self.dir, "lease"))  # the shells' watchdogs read it (.sandbox_lease)
        host = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                host._serve(self.connection, self.rfile, self.wfile)

        self.server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="toolfleet-live-host", daemon=True).start()
        self.beat()
        threading.Thread(target=self._beats, name="toolfleet-live-beat", daemon=True).start()
        threading.Thread(target=self._housekeeping, name="toolfleet-live-housekeeping", daemon=True).start()

    # ---- requests from pool processes ----
    def _serve(self, conn: socket.socket, rfile: Any, wfile: Any) -> None:
        try:
            request = json.loads(rfile.readline())
            reply = self._run(request, conn, rfile)
        except ToolFailure as exc:  # e.g. the workspace cannot be confined (PERMISSION_DENIED)
            reply = {"code": exc.code, "message": exc.message, "hint": exc.hint}
        except Exception as exc:  # noqa: BLE001 - a bad request is an answer, never a dead host
            reply = {"code": "EXECUTION_ERROR", "message": f"the live session host failed: {type(exc).__name__}: {exc}"}
        try:
            wfile.write(json.dumps(reply).encode() + b"\n")
            wfile.flush()
        except OSError:
            pass

    def _run(self, request: dict[str, Any], conn: socket.socket, rfile: Any) -> dict[str, Any]:
        sid, workspace = str(request["session"]), Path(request["workspace"])
        session, refusal = self._session_for(sid, workspace)
        if session is None:
            return refusal or {}
        if session.shell.workspace != workspace:
            return {"code": "INVALID_ARGUMENT",
                    "message": f"this session's shell runs in the workspace {str(session.shell.workspace)!r}, "
                               f"not {str(workspace)!r}",
                    "hint": "use the session's first workspace, or another session id"}
        deadline = time.monotonic() + max(float(request["timeout_s"]), 0.001)
        cancelled = threading.Event()
        threading.Thread(target=_watch_cancel, args=(rfile, cancelled), daemon=True).start()
        while not session.lock.acquire(timeout=LOCK_POLL_S):  # the call's cancel and deadline hold meanwhile
            if session.closed:
                return lost_reply(self.worker, closed=True)
            if cancelled.is_set():
                return {"output": "", "status": None, "stopped": "cancelled", "restarted": False,
                        "note": "[the command was not run: cancelled while another call of this session ran]",
                        "unsandboxed": session.shell.unsandboxed}
            if time.monotonic() >= deadline:
                return {"code": "TIMEOUT", "message": "another call of this session ran for the whole time limit; "
                                                      "this command was not run"}
        try:
            if session.closed:
                return lost_reply(self.worker, closed=True)
            session.running = cancelled
            try:
                outcome = session.shell.run(str(request["command"]), deadline, cancelled)  # what is left of its time
            except LeaseLapsed as exc:  # never a quiet new shell: the session's processes are gone
                return self._lapsed(sid, ran=exc.ran)
            except ShellEnded as exc:
                return lost_reply(self.worker, closed=True, ran=exc.ran)
            if session.shell.lease_lapsed:
                return self._lapsed(sid, ran=True)
            if session.closed and not outcome.completed:  # closed while its command ran: stopped with the
                return lost_reply(self.worker, closed=True, ran=True)  # shell, not "exited with status 137"
        finally:
            session.running = None
            session.used_at = time.monotonic()
            session.lock.release()
        # renewed only while still ours: a close (or a loss declared) during the call is not undone
        self.redis.eval(_RENEW_IF, 1, self.keys.live_holder(sid), self.worker, int(idle_ttl_s() * 1000))
        return {"output": outcome.output, "status": outcome.status, "stopped": outcome.stopped,
                "restarted": outcome.restarted, "note": outcome.note, "unsandboxed": session.shell.unsandboxed}

    def _session_for(self, sid: str, workspace: Path) -> tuple[_Session | None, dict[str, Any] | None]:
        """The session's shell here, a new one if nobody holds the session, or why not. One
        session is made at a time here, so two first calls of one session do not race."""
        with self.lock:
            session = self.sessions.get(sid)
        if session is not None:
            if self.redis.eval(_RENEW_IF, 1, self.keys.live_holder(sid), self.worker, int(idle_ttl_s() * 1000)):
                return session, None
            # the holder key is gone (the session was closed) or another's: this shell is no longer the
            # session's. Without this check a call right after a close ran in the old shell, its cwd and
            # exported variables kept, until the next housekeeping ended it (up to 1 s)
            self.end(sid)
        with self.create_lock:
            with self.lock:
                session = self.sessions.get(sid)
            if session is not None:
                return session, None
            return self._new_session(sid, workspace)

    def _new_session(self, sid: str, workspace: Path) -> tuple[_Session | None, dict[str, Any] | None]:
        key = self.keys.live_holder(sid)
        ttl_ms = int(idle_ttl_s() * 1000)
        if not self.redis.set(key, self.worker, nx=True, px=ttl_ms):
            holder = _s(self.redis.get(key))
            if holder and holder != self.worker and self.redis.exists(self.keys.live_worker(holder)):
                return None, {"code": "EXECUTION_ERROR",
                              "message": f"this session's shell is held by the live worker {holder}",
                              "hint": "ask again: the call will be routed there"}
            if holder:
                _delete_if(self.redis, key, holder)
                return None, lost_reply(holder)
            if not self.redis.set(key, self.worker, nx=True, px=ttl_ms):
                return None, {"code": "EXECUTION_ERROR", "message": "two calls started this session at once",
                              "hint": "ask again"}
        if self.lease.deadline - time.monotonic() < self.settings.heartbeat_s / 2:
            self.beat()  # back from a lapse (Redis was away): a new shell never starts under a lapsed lease
        try:
            session = _Session(Shell(workspace, self.spawner, self.lease))
        except BaseException:
            _delete_if(self.redis, key, self.worker)
            raise
        with self.lock:
            self.sessions[sid] = session
        return session, None

    def _lapsed(self, sid: str, ran: bool) -> dict[str, Any]:
        """The session's shell was ended by its lease (this worker lost its liveness for a while):
        drop the session, so the call after this one starts a new shell, and say ``SESSION_LOST``."""
        _delete_if(self.redis, self.keys.live_holder(sid), self.worker)
        self.end(sid)
        return lost_reply(self.worker, lapsed=True, ran=ran)

    # ---- liveness, close, expiry, rescue ----
    def beat(self) -> None:
        """Renew this worker's liveness key (``2 * heartbeat_s``), then its shells' lease: until
        ``margin_s`` before the earliest time the renewed key can lapse (timed from before the renewal
        was sent). A beat that fails renews nothing: the shells end before the key lapses."""
        heartbeat_s = self.settings.heartbeat_s
        sent_at = time.monotonic()
        pipe = self.redis.pipeline()
        pipe.set(self.keys.live_worker(self.worker), "1", px=int(heartbeat_s * 2000))
        pipe.sadd(self.keys.live_workers, self.worker)
        pipe.execute()
        self.lease.renew(sent_at + 2 * heartbeat_s - lease_margin_s(heartbeat_s))

    def _beats(self) -> None:
        """Beat every half heartbeat (at most 1 s), in a thread of its own: a slow housekeeping (a
        rescue reading a dead holder's queue) never delays the lease, so a healthy holder's shells
        are not ended by it."""
        period = min(self.settings.heartbeat_s / 2, 1.0)
        while not self.stop.wait(period):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - Redis away: the key and the shells' lease lapse
                log.warning("live sessions: heartbeat failed (%s)", exc)

    def _housekeeping(self) -> None:
        period = min(self.settings.heartbeat_s / 2, 1.0)
        while not self.stop.wait(period):
            try:
                self._end_unheld()
                live_rescue.rescue_lost_calls(self)
            except Exception as exc:  # noqa: BLE001 - Redis away: the next round tries again
                log.warning("live sessions: housekeeping failed (%s)", exc)

    def _end_unheld(self) -> None:
        """End the shells closed by a dispatcher (holder key gone or another's) or idle past the TTL."""
        with self.lock:
            sids = list(self.sessions)
        if not sids:
            return
        holders = mget(self.redis, [self.keys.live_holder(s) for s in sids])
        ttl = idle_ttl_s()
        for sid, holder in zip(sids, holders, strict=True):
            session = self.sessions.get(sid)
            if session is not None and session.running is not None and _s(holder) == self.worker:
                session.used_at = time.monotonic()  # a long command keeps its session (and its key) alive
                self.redis.eval(_RENEW_IF, 1, self.keys.live_holder(sid), self.worker, int(ttl * 1000))
                continue
            idle = session is not None and time.monotonic() - session.used_at > ttl and not session.lock.locked()
            if _s(holder) != self.worker or idle:
                if idle:  # first, so a call arriving meanwhile starts a new shell (not SESSION_LOST)
                    _delete_if(self.redis, self.keys.live_holder(sid), self.worker)
                self.end(sid)

    def end(self, sid: str) -> threading.Thread | None:
        """End the session's shell. Never waits for the session's lock (the housekeeping thread
        calls this): the command running is cancelled and the sandbox killed at once; a thread then
        takes the lock (at most ``END_LOCK_WAIT_S``) and closes the shell. Returns that thread."""
        with self.lock:
            session = self.sessions.pop(sid, None)
        if session is None:
            return None
        session.closed = True
        running = session.running
        if running is not None:
            running.set()
        session.shell.end()
        closer = threading.Thread(target=_close_shell, args=(session,), name="toolfleet-live-end", daemon=True)
        closer.start()
        return closer

    def close(self) -> None:
        """Worker shutdown: end every shell; the holder keys stay, so the next call says SESSION_LOST."""
        self.stop.set()
        with self.lock:
            sids = list(self.sessions)
        closers = [self.end(sid) for sid in sids]
        for closer in closers:
            if closer is not None:
                closer.join(END_LOCK_WAIT_S + 20)
        try:
            self.redis.delete(self.keys.live_worker(self.worker))
        except redis.RedisError:
            pass
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _close_shell(session: _Session) -> None:
    """Close an ended session's shell once its call let go of it (or after ``END_LOCK_WAIT_S``: the
    sandbox was killed already; closing reaps it)."""
    got = session.lock.acquire(timeout=END_LOCK_WAIT_S)
    try:
        session.shell.close()
    except Exception as exc:  # noqa: BLE001 - a daemon thread: said, not raised
        log.warning("live sessions: closing a shell failed (%s)", exc)
    finally:
        if got:
            session.lock.release()


def _watch_cancel(rfile: Any, cancelled: threading.Event) -> None:
    """The client writes a line to cancel, or closes the connection (its process died): both stop."""
    try:
        rfile.readline()
    except (OSError, ValueError):
        pass
    cancelled.set()


def connect_affinity(app: Celery, runtime: Any) -> None:
    """Worker side of live sessions (only when its registry serves a tool of :data:`LIVE_TOOLS`):
    consume the worker's own queue and start the :class:`SessionHost` before the pool forks."""
    if not any(spec.name in LIVE_TOOLS for spec in runtime.registry):
        return

    @celeryd_after_setup.connect(weak=False)
    def _setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
        global _host, socket_path
        if getattr(instance, "app", None) is not app:
            return
        try:
            _host = SessionHost(runtime, str(sender))
        except Exception as exc:  # noqa: BLE001 - the worker serves the rest; `shell` calls say why
            log.error("live sessions are not hosted by this worker: %s", exc)
            return
        socket_path = _host.path
        own = worker_queue(runtime.keys, str(sender))
        instance.app.amqp.queues.select_add(own, exchange=own, routing_key=own)  # as the tool queues are

    @worker_shutdown.connect(weak=False)
    def _shutdown(sender: Any = None, **_: Any) -> None:
        if _host is not None and os.getpid() == _main_pid.get("pid", os.getpid()):
            _host.close()

    _main_pid["pid"] = os.getpid()


_main_pid: dict[str, int] = {}

# the rescue of calls stranded in a dead holder's queue (live_rescue.py imports the names above)
from . import live_rescue  # noqa: E402,I001
