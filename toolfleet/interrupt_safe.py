"""redis-py connections that survive an exception raised between a command's send and its read.

A pool process's main thread gets exceptions from signal handlers at any point: Celery's soft
time limit (SIGUSR1, ``SoftTimeLimitExceeded``) and the cancel watcher's interrupt (SIGUSR2,
``CallCancelled``). redis-py disconnects a connection whose *read* is interrupted, but one
interrupted after ``send_command`` returned and before ``read_response`` began goes back to its
pool with the reply still on the way: the next command sent on it reads that reply instead of its
own, and every command after it the one before (seen in a fencing trial: an ``HMGET`` reply parsed
as a fencing token). A reply already in the socket is caught by the pool's ``can_read`` check; one
still in flight is not.

:func:`make_interrupt_safe` gives a client's pool connections that count the replies they owe
(one per command sent, one per command of a pipeline) and disconnect before sending when any is
still owed, so the stale reply is dropped with the socket. A Redis error reply counts as read.
"""

from __future__ import annotations

from typing import Any

import redis


class _InterruptSafe:
    """Mixin over a redis-py ``Connection`` class: see the module text."""

    _owed = 0  # replies sent for and not read yet
    _packed = 0  # commands in the last pack_commands (a pipeline), sent next
    _connecting = False  # in redis-py's own handshake (HELLO, AUTH, SELECT, CLIENT SETINFO ...)

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        return self._handshake(super().connect, *args, **kwargs)  # type: ignore[misc]

    def connect_check_health(self, *args: Any, **kwargs: Any) -> Any:  # redis-py >= 6
        return self._handshake(super().connect_check_health, *args, **kwargs)  # type: ignore[misc]

    def _handshake(self, connect: Any, *args: Any, **kwargs: Any) -> Any:
        """redis-py >= 8.2 pipelines its handshake (sends several commands, then reads their
        replies): those sends are its own, not counted (counting them disconnected the socket
        it was setting up, for ever)."""
        outer, self._connecting = self._connecting, True
        try:
            return connect(*args, **kwargs)
        finally:
            self._connecting = outer

    def pack_commands(self, commands: Any) -> Any:
        packed = super().pack_commands(commands)  # type: ignore[misc]
        self._packed = len(commands)
        return packed

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._connecting:  # the handshake's own commands: read by it before connect returns
            return super().send_packed_command(command, check_health=check_health)  # type: ignore[misc]
        count, self._packed = self._packed or 1, 0
        if self._owed > 0:  # an interrupted command's reply may still arrive: start clean
            self.disconnect()  # type: ignore[attr-defined]
        # connect (HELLO, AUTH, SELECT) and check health first: their own commands balance out
        if not self._sock:  # type: ignore[attr-defined]
            if hasattr(super(), "connect_check_health"):  # redis-py >= 6; connect() before
                self.connect_check_health(check_health=False)
            else:
                self.connect()
        if check_health:
            self.check_health()  # type: ignore[attr-defined]
        self._owed += count  # before sending: an interrupt right after the send is still counted
        super().send_packed_command(command, check_health=False)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            response = super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ResponseError:  # an error reply: read all the same
            self._owed = max(self._owed - 1, 0)
            raise
        self._owed = max(self._owed - 1, 0)
        return response

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._owed = 0
        self._packed = 0
        super().disconnect(*args, **kwargs)  # type: ignore[misc]


_classes: dict[type, type] = {}


def make_interrupt_safe(client: redis.Redis) -> redis.Redis:
    """Give ``client``'s connection pool interrupt-safe connections (before it made any).
    Returns ``client``. A client without a plain connection pool (a cluster client) is left as
    it is."""
    pool = getattr(client, "connection_pool", None)
    base = getattr(pool, "connection_class", None)
    if pool is None or not isinstance(base, type) or issubclass(base, _InterruptSafe):
        return client
    safe = _classes.get(base)
    if safe is None:
        safe = _classes[base] = type(f"InterruptSafe{base.__name__}", (_InterruptSafe, base), {})
    pool.connection_class = safe
    return client
