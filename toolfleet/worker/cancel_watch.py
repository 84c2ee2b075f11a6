"""Stopping running calls when their turn is cancelled, inside a worker's pool process.

One thread per pool process listens on the namespace's cancel channels (Redis pub/sub), and on its
breaker-failed channel for :class:`~toolfleet.worker.breaker_notices.FailureNotices`. When a
turn is cancelled, each of its running calls gets its context's cancel signal at once (cooperative:
``run_command`` kills its process group within ~50 ms). A Python handler that is still running
``cancel_grace_s`` later is interrupted by a signal that raises
:class:`~toolfleet.errors.CallCancelled` in it (like Celery's soft time limit). A handler stuck
beyond that is killed by the dispatcher's revoke.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from .. import forksafe
from ..errors import CallCancelled
from ..keys import Keys
from ..tools.context import ToolContext
from .breaker_notices import FailureNotices

log = logging.getLogger(__name__)
INTERRUPT_SIGNAL = signal.SIGUSR2


class CancelWatcher:
    """Per-process registry of running calls, fed by the cancel channel."""

    def __init__(self, keys: Keys, connect: Callable[[], redis.Redis], grace_s: float) -> None:
        self._keys = keys
        self._connect = connect
        self._grace_s = grace_s
        self._lock = forksafe.lock()
        self._running: dict[str, set[int]] = {}
        self._contexts: dict[int, ToolContext] = {}
        self._interruptible: int | None = None  # id(ctx) whose handler runs in the main thread
        self._pid: int | None = None
        self._ready = threading.Event()
        self.failures = FailureNotices()  # what this process heard of its tools' breakers

    def ensure_started(self) -> None:
        """Start the listener of this process (once per process, after fork)."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._running.clear()
        self._contexts.clear()
        self._ready = threading.Event()
        self.failures = FailureNotices()  # a forked child heard nothing yet
        if threading.current_thread() is threading.main_thread():
            signal.signal(INTERRUPT_SIGNAL, self._on_interrupt)
        threading.Thread(target=self._listen, name="toolfleet-cancel", daemon=True).start()
        self._ready.wait(timeout=5.0)

    @contextmanager
    def track(self, ctx: ToolContext) -> Iterator[None]:
        """Register ``ctx`` as running for the duration of the block."""
        self.ensure_started()
        with self._lock:
            self._running.setdefault(ctx.turn_id, set()).add(id(ctx))
            self._contexts[id(ctx)] = ctx
        try:
            yield
        finally:
            with self._lock:
                self._running.get(ctx.turn_id, set()).discard(id(ctx))
                if not self._running.get(ctx.turn_id):
                    self._running.pop(ctx.turn_id, None)
                self._contexts.pop(id(ctx), None)

    @contextmanager
    def interruptible(self, ctx: ToolContext, enabled: bool) -> Iterator[None]:
        """While the block runs, a cancel past the grace period raises CallCancelled in it."""
        if enabled:
            self._interruptible = id(ctx)
        try:
            yield
        finally:
            self._interruptible = None

    def _on_interrupt(self, signum: int, frame: object) -> None:
        key = self._interruptible
        ctx = self._contexts.get(key) if key is not None else None
        if ctx is not None and ctx.cancelled.is_set():
            self._interruptible = None
            raise CallCancelled(ctx.cancel_reason or "the turn was cancelled")

    def _cancel_turn(self, turn_id: str, reason: str) -> None:
        with self._lock:
            contexts = [self._contexts[i] for i in self._running.get(turn_id, ()) if i in self._contexts]
        for ctx in contexts:
            ctx.cancel(reason)
            timer = threading.Timer(self._grace_s, self._interrupt_if_running, args=(ctx,))
            timer.daemon = True
            timer.start()

    def _interrupt_if_running(self, ctx: ToolContext) -> None:
        if self._interruptible == id(ctx):
            signal.pthread_kill(threading.main_thread().ident, INTERRUPT_SIGNAL)  # type: ignore[arg-type]

    def _listen(self) -> None:
        backoff_s = 0.1
        notices = True  # the breaker channel too, until Redis refuses it (an ACL that predates it)
        while True:
            try:
                pubsub = self._connect().pubsub(ignore_subscribe_messages=False)
                pubsub.psubscribe(self._keys.cancel_pattern)
                if notices:
                    pubsub.subscribe(self._keys.breaker_failed_channel)
                self._handshake(pubsub, notices)
                self._ready.set()
                backoff_s = 0.1
                self._recheck_running()
                for message in pubsub.listen():
                    self._on_message(message)
            except Exception as exc:  # reconnect: Redis restarted or the connection dropped
                self.failures.deaf()  # deaf: every call that worked resets its tool's failure count
                if notices and isinstance(exc, redis.exceptions.NoPermissionError):
                    notices = False  # cancels matter; the notices only spare a read per call
                    log.warning("Redis refused this worker's subscription to %s (%s): listening for cancels only; "
                                "grant the channel (docs/deploying.md, ACL)", self._keys.breaker_failed_channel, exc)
                    continue
                log.warning("cancel listener lost its Redis connection (%s); reconnecting", exc)
                self._ready.set()
                time.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    def _handshake(self, pubsub: Any, notices: bool, wait_s: float = 2.0) -> None:
        """Wait (at most ``wait_s``) for Redis to confirm the subscriptions; a cancel or notice
        that arrives meanwhile is handled at once, not dropped."""
        wanted = {"psubscribe", "subscribe"} if notices else {"psubscribe"}
        confirmed: set[str] = set()
        deadline = time.monotonic() + wait_s
        while not wanted <= confirmed and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=max(deadline - time.monotonic(), 0.01))
            if message is None:
                continue
            kind = _s(message.get("type", ""))
            if kind in ("psubscribe", "subscribe"):
                confirmed.add(kind)
            else:
                self._on_message(message)
        if "subscribe" in confirmed:
            self.failures.listening()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = _s(message.get("type", ""))
        if kind == "message":
            self.failures.heard(_s(message.get("data", "")))
        elif kind == "subscribe":
            self.failures.listening()  # confirmed late (a slow Redis): listening from now
        elif kind == "pmessage":
            channel = _s(message["channel"])
            turn_id = channel[len(self._keys.cancel_pattern) - 1 :]
            self._cancel_turn(turn_id, _s(message.get("data", "")) or "cancelled")

    def _recheck_running(self) -> None:
        """After (re)subscribing, catch cancels published while the listener was away."""
        with self._lock:
            turns = list(self._running)
        if not turns:
            return
        client = self._connect()
        for turn_id in turns:
            reason = client.get(self._keys.turn_cancelled(turn_id))
            if reason is not None:
                self._cancel_turn(turn_id, _s(reason))


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
