"""Broker trouble, with a private redis-server per test (the shared one is never stopped):
Redis unreachable at submit, Redis dying in the middle of a submit, Redis restarted mid-batch."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from toolfleet import BrokerUnavailable, Dispatcher, ErrorCode, Settings
from toolfleet.dispatcher.submit import Submitter

from . import refund_store
from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started

TURN_TIMEOUT_S = 60


@pytest.fixture
def private_settings(private_redis, namespace):
    def make(persistent: bool = True) -> tuple[Settings, object]:
        server = private_redis(persistent=persistent)
        settings = Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                            heartbeat_s=0.5, fleet_key=FLEET_KEY)
        return settings, server

    return make


def test_dispatcher_against_a_dead_redis_names_the_url():
    url = "redis://127.0.0.1:1/0"
    with pytest.raises(BrokerUnavailable) as caught:
        Dispatcher(Settings(redis_url=url))
    assert url in str(caught.value) and caught.value.url == url


def test_broker_url_password_is_masked():
    error = BrokerUnavailable("amqp://guest:secret@rabbit:5672//", "refused")
    assert "secret" not in str(error) and "rabbit:5672" in str(error)
    assert "redis-server --port 6399" in str(BrokerUnavailable("redis://127.0.0.1:6399/0"))  # the URL's port
    for url in ("redis://:6390/Zq9+kLmN0pQ=@127.0.0.1:6379/0", "redis://:pa#Sekr1t@h:6379/0",  # a breaker's finds
                "redis://:pa?Sekr1t@h/0", "amqp://u:pw1@h1//;amqp://u:Sekr1t@h2//", " redis://u:Sekr1t@h"):
        shown = str(BrokerUnavailable(url))
        assert "Sekr1t" not in shown and "Zq9" not in shown and "--port 6390" not in shown, shown


@given(st.text(max_size=40), st.sampled_from(["redis://", "rediss://", "redis+cluster://", "amqp://", "unix://", ""]),
       st.text(max_size=20))
def test_an_unavailable_broker_is_described_whatever_its_url(host, scheme, rest):
    """Building the error never raises (kombu's sanitizer raised ValueError for a port that is no
    number, e.g. a list of cluster seeds ``h:7000,h:7001``) and never shows the password."""
    from toolfleet.errors import BrokerBusy, BrokerRefused

    url = f"{scheme}user:pw-Zq81x@{host}:{rest}"
    for error in (BrokerUnavailable(url, "refused"), BrokerBusy(url, "OOM"), BrokerRefused(url, "NOPERM")):
        assert "pw-Zq81x" not in str(error) and "pw-Zq81x" not in error.url


def test_redis_down_at_submit_raises_naming_the_url(private_settings, start_worker, workspace):
    settings, server = private_settings()
    start_worker(settings=settings)
    dispatcher = Dispatcher(settings, make_registry())
    server.kill()
    began = time.monotonic()
    with pytest.raises(BrokerUnavailable) as caught:
        dispatcher.submit([call("c1", "wait_read", label="a")], workspace=str(workspace))
    assert settings.redis_url in str(caught.value)
    assert time.monotonic() - began < 10


class DyingBroker(Submitter):
    """Sends normally, then kills the (private) Redis right after the ``after``-th message: a real
    broker failure in the middle of sending a batch's first group. With ``one_by_one``, each
    message is published at once, as on a broker without transactional batches (RabbitMQ)."""

    def __init__(self, app, settings, server, after: int, one_by_one: bool = False) -> None:
        super().__init__(app, settings)
        self.server, self.after, self.sent, self.one_by_one = server, after, 0, one_by_one

    def batch(self, size: int):
        return contextlib.nullcontext() if self.one_by_one else super().batch(size)

    def send(self, **kwargs):
        tid = super().send(**kwargs)
        self.sent += 1
        if self.sent == self.after:
            self.server.kill()
        return tid


def test_redis_dying_mid_submit_sends_none_of_the_group(private_settings, start_worker, workspace):
    """Redis dies after two of four calls were handed to the broker: the group goes in one MULTI/EXEC,
    so the caller gets BrokerUnavailable and, when Redis comes back with its data, no message of the
    turn is in any queue and nothing ran."""
    settings, server = private_settings(persistent=True)
    start_worker(settings=settings, concurrency=2)
    dispatcher = Dispatcher(settings, make_registry())
    dispatcher.submitter = DyingBroker(dispatcher.app, settings, server, after=2)
    calls = [call(f"n{i}", "add_note", text=f"note {i}") for i in range(4)]
    with pytest.raises(BrokerUnavailable) as caught:
        dispatcher.submit(calls, workspace=str(workspace), turn_id="half-turn")
    assert settings.redis_url in str(caught.value)
    server.start()  # same port, same append-only file
    client = redis.Redis.from_url(settings.redis_url)
    queued = [k for k in client.scan_iter(match=f"{settings.namespace}.add_note*") if client.type(k) == b"list"]
    assert sum(client.llen(k) for k in queued) == 0, queued
    assert client.hlen(f"{settings.namespace}.unacked") == 0  # nor taken by the worker
    assert Dispatcher(settings, make_registry()).ledger.results("half-turn") == {}
    assert refund_store.notes(workspace) == [], "a call of a half-submitted turn ran"


def test_redis_dying_mid_submit_leaves_nothing_half_submitted(private_settings, start_worker, workspace):
    """On a broker that takes messages one by one, two of four calls reached the queue before Redis
    died. The caller gets BrokerUnavailable; when Redis comes back (with its data) the worker gets
    those two messages, but the turn was never armed, so they do not run: each gets NOT_EXECUTED."""
    settings, server = private_settings(persistent=True)
    start_worker(settings=settings, concurrency=2)
    dispatcher = Dispatcher(settings, make_registry())
    dispatcher.submitter = DyingBroker(dispatcher.app, settings, server, after=2, one_by_one=True)
    calls = [call(f"n{i}", "add_note", text=f"note {i}") for i in range(4)]
    with pytest.raises(BrokerUnavailable) as caught:
        dispatcher.submit(calls, workspace=str(workspace), turn_id="half-turn")
    assert settings.redis_url in str(caught.value)
    server.start()  # same port, same append-only file: the two messages are back in the queue
    ledger = Dispatcher(settings, make_registry()).ledger
    deadline = time.monotonic() + 30  # the worker waits up to ARM_WAIT_S (10 s) for the turn to be armed
    results = {}
    last = "0-0"
    while len(results) < 2 and time.monotonic() < deadline:
        for event in ledger.events("half-turn", after=last, block_ms=500):
            last = event.stream_id
            if event.type == "result":
                results[event.call_id] = event.result()
    assert set(results) >= {"n0", "n1"}, results
    assert all(r.code is ErrorCode.NOT_EXECUTED for r in results.values()), results
    assert refund_store.notes(workspace) == [], "a call of a half-submitted turn ran"


def _restart_during_call(settings, server, dispatcher, workspace):
    calls = [call("c1", "wait_read", label="quick"),
             call("c2", "wait_write", label="x", seconds=5),
             call("c3", "wait_read", label="x")]  # waits for c2: sent after the restart
    turn = dispatcher.submit(calls, workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c2")
    first = turn.as_completed(timeout_s=10)
    assert next(first).call_id == "c1"
    restart = threading.Timer(2.0, server.restart)
    restart.start()
    try:
        return turn, turn.results(timeout_s=TURN_TIMEOUT_S)
    finally:
        restart.join()


def test_redis_restarted_2_s_into_a_5_s_call(private_settings, start_worker, workspace):
    """A Redis that keeps its data (append-only file) is restarted 2 s into a 5 s call: every call
    ends with its result within its deadline, the 5 s call was not run twice, the result recorded
    before the restart is still in Redis, and the worker serves the next turn."""
    settings, server = private_settings(persistent=True)
    start_worker(settings=settings, concurrency=2)
    dispatcher = Dispatcher(settings, make_registry())
    turn, results = _restart_during_call(settings, server, dispatcher, workspace)
    assert [r.status for r in results] == ["ok", "ok", "ok"], [r.content for r in results]
    assert results[1].attempts == 1
    assert set(dispatcher.ledger.results(turn.turn_id)) == {"c1", "c2", "c3"}
    after = dispatcher.run([call("d1", "wait_read", label="after")], workspace=str(workspace), timeout_s=30)
    assert after[0].ok, after[0].content


def test_redis_restarted_without_its_data(private_settings, start_worker, workspace):
    """A Redis that keeps nothing is restarted mid-batch: the queued calls are gone with it and get
    a clear TOOL_UNAVAILABLE; the running one still delivers its result and its dependent runs; the
    worker reconnects. (Critical path first: c2 heads the longest chain, so the single process takes
    it before c1 and c4, which wait in the queue.)"""
    settings, server = private_settings(persistent=False)
    start_worker(settings=settings, concurrency=1)
    dispatcher = Dispatcher(settings, make_registry())
    calls = [call("c1", "wait_read", label="quick"),
             call("c2", "wait_write", label="x", seconds=5),
             call("c4", "wait_read", label="queued"),  # behind c2 in the queue of the single process
             call("c3", "wait_read", label="x")]
    turn = dispatcher.submit(calls, workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "c2")
    restart = threading.Timer(2.0, server.restart)
    restart.start()
    results = {r.call_id: r for r in turn.results(timeout_s=TURN_TIMEOUT_S)}
    restart.join()
    assert results["c2"].ok and results["c3"].ok, [r.content for r in results.values()]
    for queued in ("c1", "c4"):
        assert results[queued].code is ErrorCode.TOOL_UNAVAILABLE, results[queued].content
        assert "Redis restarted without its data" in results[queued].content
    after = dispatcher.run([call("d1", "wait_read", label="after")], workspace=str(workspace), timeout_s=30)
    assert after[0].ok, after[0].content
