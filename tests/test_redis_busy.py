"""Redis answering but refusing for a while (out of memory at maxmemory, a read-only replica during a
failover, a script holding the server): a worker waits it out like an outage, within its retry budget,
and the call keeps the result its handler produced. A private redis-server per test."""

from __future__ import annotations

import threading

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.base import BaseParser

from toolfleet import BrokerBusy, BrokerUnavailable, Dispatcher, Settings
from toolfleet.ledger import Ledger
from toolfleet.redis_client import busy, unavailable

from . import refund_store
from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started, wait_until


def _failed_scripts(client) -> int:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("failed_calls", 0)) + int(stats.get("rejected_calls", 0))


def test_out_of_memory_while_a_result_is_recorded(private_redis, namespace, start_worker, workspace):
    """Redis at maxmemory refuses every write (``-OOM``) from before a handler returns until after
    the worker has tried to record its result several times: the worker retries as for an outage,
    the call gets the handler's own result once memory is back, and the handler ran once."""
    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    dispatcher = Dispatcher(settings, make_registry())
    admin = redis.Redis.from_url(server.url)
    turn = dispatcher.submit([call("n1", "add_note", text="kept", seconds=1.0)], workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "n1")
    admin.config_set("maxmemory", 1)  # every write refused: -OOM (policy noeviction)
    try:
        wait_until(lambda: refund_store.notes(workspace) == ["kept"], 20, "the handler's note")
        refused = _failed_scripts(admin)
        wait_until(lambda: _failed_scripts(admin) >= refused + 3, 20, "three refused scripts after the handler")
    finally:
        admin.config_set("maxmemory", 0)
    results = turn.results(timeout_s=30)
    assert results[0].ok and results[0].content == "noted kept", results[0]
    assert refund_store.notes(workspace) == ["kept"]


BUSY_CODES = {"OOM", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS"}


@given(code=st.sampled_from(sorted(BUSY_CODES | {"ERR", "WRONGTYPE", "NOSCRIPT", "NOPERM", "EXECABORT", "LOADING",
                                                  "CROSSSLOT", "busy", "OOMX"})),
       text=st.text(max_size=40))
def test_busy_is_told_by_the_reply_code(code, text):
    """Property: a Redis error reply, as redis-py's own parser turns it into an exception, is
    :func:`busy` exactly when its code is one of the refusals that end by themselves; ``LOADING``
    (a restart reading its data) is redis-py's BusyLoadingError, a connection error: unavailable,
    not busy; ACL refusals and bugs are neither."""
    exc = BaseParser.parse_error(f"{code} {text}")
    assert busy(exc) is (code in BUSY_CODES)
    assert unavailable(exc) is (code in BUSY_CODES or code == "LOADING")


def test_real_refusals_are_busy_and_waited_out(private_redis):
    """The replies of a real redis-server: OOM at maxmemory, READONLY from a replica, BUSY while a
    script holds the server are :func:`busy`; WRONGTYPE and NOSCRIPT are not. A ledger with a
    retry budget waits an OOM out; one without raises BrokerBusy naming the URL and the reply."""
    primary = private_redis(persistent=False)
    client = redis.Redis.from_url(primary.url)
    client.config_set("maxmemory", 1)
    with pytest.raises(redis.ResponseError) as oom:
        client.set("k", "v")
    client.config_set("maxmemory", 0)
    replica_server = private_redis(persistent=False)
    replica = redis.Redis.from_url(replica_server.url)
    replica.replicaof("127.0.0.1", primary.port)
    with pytest.raises(redis.ResponseError) as readonly:
        replica.set("k", "v")
    replica.replicaof("NO", "ONE")
    client.set("s", "v")
    with pytest.raises(redis.ResponseError) as wrongtype:
        client.lpush("s", "x")
    with pytest.raises(redis.ResponseError) as noscript:
        client.evalsha("0" * 40, 0)
    assert busy(oom.value) and busy(readonly.value)
    assert not busy(wrongtype.value) and not busy(noscript.value)

    client.config_set("busy-reply-threshold", 20)  # ms a script runs before others hear BUSY
    script = threading.Thread(target=redis.Redis.from_url(primary.url).eval, daemon=True, args=(
        "local t = redis.call('TIME'); local stop = t[1] + 1; "
        "while tonumber(redis.call('TIME')[1]) <= stop do end; return 1", 0))
    script.start()
    busy_reply = None
    while busy_reply is None and script.is_alive():
        try:
            client.ping()
        except redis.ResponseError as exc:
            busy_reply = exc
    script.join()
    assert busy_reply is not None and str(busy_reply).startswith("BUSY") and busy(busy_reply), busy_reply

    settings = Settings(redis_url=primary.url, namespace="busy-test")
    tries = []

    def write():
        tries.append(1)
        if len(tries) == 3:
            client.config_set("maxmemory", 0)  # memory back before the third try
        return client.set("k", "v")

    client.config_set("maxmemory", 1)
    assert Ledger(settings, client, retry_s=20).retrying(write) is True
    assert len(tries) == 3
    client.config_set("maxmemory", 1)
    try:
        with pytest.raises(BrokerBusy) as raised:
            Ledger(settings, client, retry_s=0).retrying(lambda: client.set("k", "v"))
    finally:
        client.config_set("maxmemory", 0)
    assert f"127.0.0.1:{primary.port}" in str(raised.value) and "maxmemory" in str(raised.value)


def test_a_submit_to_a_redis_out_of_memory_says_so(private_redis, namespace, start_worker, workspace):
    """A submit while Redis refuses writes raises BrokerBusy (a BrokerUnavailable) naming the URL
    and the reply; nothing of the batch runs; once memory is back, the next submit runs."""
    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        fleet_key=FLEET_KEY)
    start_worker(settings=settings, concurrency=1)
    dispatcher = Dispatcher(settings, make_registry())
    admin = redis.Redis.from_url(server.url)
    admin.config_set("maxmemory", 1)
    try:
        with pytest.raises(BrokerUnavailable) as raised:
            dispatcher.submit([call("n1", "add_note", text="never")], workspace=str(workspace))
    finally:
        admin.config_set("maxmemory", 0)
    assert isinstance(raised.value, BrokerBusy), raised.value
    assert f"127.0.0.1:{server.port}" in str(raised.value)
    after = dispatcher.run([call("n2", "add_note", text="after")], workspace=str(workspace), timeout_s=30)
    assert after[0].ok, after[0].content
    assert refund_store.notes(workspace) == ["after"]
