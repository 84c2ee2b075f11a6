"""A command interrupted between its send and its read (a soft time limit or a cancel raised by a
signal in a pool process) must not leave its reply for the next command on the connection
(toolfleet/interrupt_safe.py). Real Redis: a script that takes a moment keeps the reply in flight
when the interrupt lands, as a claim on a loaded Redis does."""

from __future__ import annotations

import uuid

import pytest
import redis

from toolfleet.interrupt_safe import make_interrupt_safe


class Interrupted(Exception):
    """Stands for SoftTimeLimitExceeded / CallCancelled raised by a signal handler."""


def _interrupt_after_send(client: redis.Redis, *args) -> None:
    """Send a command and raise before its reply is read, as redis-py does when an exception
    lands right after ``send_command`` returned; the connection goes back to the pool."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command(*args)
        raise Interrupted()
    finally:
        pool.release(conn)


SLOW_SCRIPT = "local t = redis.call('TIME') local s = tonumber(t[1]) * 1e6 + tonumber(t[2]) " \
              "repeat local n = redis.call('TIME') until tonumber(n[1]) * 1e6 + tonumber(n[2]) - s > 50000 " \
              "return 'slow reply'"


@pytest.mark.parametrize("safe", [False, True], ids=["plain", "interrupt-safe"])
def test_a_reply_in_flight_is_not_read_by_the_next_command(settings, safe):
    client = redis.Redis.from_url(settings.redis_url, db=15)
    if safe:
        make_interrupt_safe(client)
    key = f"interrupt-safe:{uuid.uuid4().hex}"
    client.set(key, "the value")
    with pytest.raises(Interrupted):
        _interrupt_after_send(client, "EVAL", SLOW_SCRIPT, 0)
    got = client.get(key)
    if safe:
        assert got == b"the value"
        pipe = client.pipeline(transaction=True)
        pipe.get(key).incr(f"{key}:n")
        assert pipe.execute() == [b"the value", 1]
    else:  # what the pool process saw before: the slow script's reply as the GET's
        assert got == b"slow reply"
    client.delete(key, f"{key}:n")


@pytest.mark.parametrize("options", [{}, {"client_name": "toolfleet-test"}, {"protocol": 3},
                                     {"health_check_interval": 1, "client_name": "x"}],
                         ids=["plain", "client-name", "resp3", "health-check"])
def test_an_interrupt_safe_client_connects_with_every_handshake(settings, options):
    """redis-py 8.2 pipelines its handshake (HELLO, CLIENT SETNAME, CLIENT SETINFO, SELECT sent, then
    read): counting those sends as owed replies made each one disconnect the socket being set up,
    recursing until RecursionError on the first command of every ledger client (a fresh install
    picked 8.2 up). The handshake's own commands are redis-py's, not counted."""
    client = make_interrupt_safe(redis.Redis.from_url(settings.redis_url, db=15, **options))
    assert client.ping() is True
    key = f"interrupt-safe:{uuid.uuid4().hex}"
    assert client.pipeline().set(key, 1).get(key).execute() == [True, b"1"]
    client.connection_pool.disconnect()  # and again after a reconnect
    assert client.delete(key) == 1
