"""Availability: a tool no live worker serves is refused at once; a tool's circuit opens after
consecutive failures and closes only after a side-effect-free health check passes."""

from __future__ import annotations

import time

import pytest

from toolfleet import Dispatcher, ErrorCode, tool
from toolfleet.keys import Keys

from .conftest import make_registry
from .faults import call, wait_until

AT_ONCE_S = 2.0  # product promise: TOOL_UNAVAILABLE at once, not after a queue wait


@tool(access="read", resources=lambda a: [], queue="ghosts")
def ghost(x: int) -> str:
    """A tool no worker serves.

    Args:
        x: Anything.
    """
    return "boo"


def test_tool_no_live_worker_serves_is_unavailable_at_once(settings, worker, workspace):
    registry = make_registry()
    registry.add(ghost)
    with Dispatcher(settings, registry) as dispatcher:
        began = time.monotonic()
        results = dispatcher.run([call("g1", "ghost", x=1), call("r1", "wait_read", label="a")],
                                 workspace=str(workspace), timeout_s=30)
        assert time.monotonic() - began < AT_ONCE_S
    assert results[0].code is ErrorCode.TOOL_UNAVAILABLE, results[0].content
    assert "no live worker serves the tool 'ghost'" in results[0].content
    assert results[1].ok


def test_no_worker_at_all(dispatcher, workspace):
    began = time.monotonic()
    result = dispatcher.run([call("r1", "wait_read", label="a")], workspace=str(workspace), timeout_s=30)[0]
    assert time.monotonic() - began < AT_ONCE_S
    assert result.code is ErrorCode.TOOL_UNAVAILABLE


def test_fleet_scaling_from_zero_can_queue_instead(settings, start_worker, workspace):
    relaxed = settings.model_copy(update={"require_live_worker": False})
    with Dispatcher(relaxed, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("r1", "wait_read", label="a")], workspace=str(workspace))
        start_worker()
        assert turn.results(timeout_s=60)[0].ok


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"breaker_cooldown_s": 1.0})


def _breaker_state(dispatcher, tool_name: str) -> str:
    raw = dispatcher.ledger.redis.hget(Keys(dispatcher.settings.namespace).breaker(tool_name), "state")
    return (raw or b"closed").decode()


def test_circuit_opens_after_consecutive_failures_and_closes_after_a_health_check(
        dispatcher, start_worker, workspace, tmp_path, monkeypatch):
    health_down = tmp_path / "backend-down"
    health_down.write_text("down")
    monkeypatch.setenv("FLAKY_HEALTH_FILE", str(health_down))
    start_worker()
    ws = str(workspace)
    failures = dispatcher.settings.breaker_failures
    for i in range(failures):  # one at a time: consecutive failures
        result = dispatcher.run([call(f"f{i}", "flaky", fail=True)], workspace=ws, timeout_s=30)[0]
        assert result.code is ErrorCode.EXECUTION_ERROR, result.content
    refused = dispatcher.run([call("x1", "flaky", fail=False)], workspace=ws, timeout_s=30)[0]
    assert refused.code is ErrorCode.TOOL_UNAVAILABLE and "circuit" in refused.content, refused.content
    assert "retry in about" in refused.content, refused.content

    # Cooldown over: the next call is still refused, and triggers a health check, which fails. Its
    # hint says the check was just sent (it said to wait a whole cool-down more: a newcomer's find)
    wait_until(lambda: _cooled_down(dispatcher), 10, "the cooldown")
    probing = dispatcher.run([call("x2", "flaky", fail=False)], workspace=ws, timeout_s=30)[0]
    assert probing.code is ErrorCode.TOOL_UNAVAILABLE
    assert "health check of the tool was sent just now" in probing.content, probing.content
    wait_until(lambda: _breaker_state(dispatcher, "flaky") == "open", 15, "the failed health check")

    # The backend recovers: after the next cooldown a health check passes and the circuit closes.
    health_down.unlink()
    wait_until(lambda: _cooled_down(dispatcher), 10, "the cooldown")
    dispatcher.run([call("x3", "flaky", fail=False)], workspace=ws, timeout_s=30)
    wait_until(lambda: _breaker_state(dispatcher, "flaky") == "closed", 15, "the passing health check")
    assert dispatcher.run([call("x4", "flaky", fail=False)], workspace=ws, timeout_s=30)[0].ok


def _cooled_down(dispatcher) -> bool:
    key = Keys(dispatcher.settings.namespace).breaker("flaky")
    opened_at = int(dispatcher.ledger.redis.hget(key, "opened_at") or 0)
    now_s, now_us = dispatcher.ledger.redis.time()
    return now_s * 1000 + now_us // 1000 >= opened_at + dispatcher.settings.breaker_cooldown_s * 1000


def test_failures_the_tool_reports_on_purpose_do_not_open_the_circuit(dispatcher, worker, workspace):
    ws = str(workspace)
    for i in range(dispatcher.settings.breaker_failures + 2):
        result = dispatcher.run([call(f"m{i}", "read_file", path="missing.txt")], workspace=ws, timeout_s=30)[0]
        assert result.code is ErrorCode.EXECUTION_ERROR and "file not found" in result.content
    assert dispatcher.run([call("ok", "read_file", path="README.md")], workspace=ws, timeout_s=30)[0].ok
    assert _breaker_state(dispatcher, "read_file") == "closed"


def test_a_tool_served_only_in_another_namespace_is_named_in_the_log_not_in_the_result(settings, worker, workspace,
                                                                                       caplog):
    """Newcomer trial: a dispatcher in the wrong namespace got TOOL_UNAVAILABLE, the queue name its
    only clue. The log names the namespace whose live workers serve the tool; the result the model
    reads does not (another namespace's name is none of its business)."""
    import logging

    elsewhere = settings.model_copy(update={"namespace": f"{settings.namespace}-other"})
    with caplog.at_level(logging.WARNING, logger="toolfleet.dispatcher.availability"), \
            Dispatcher(elsewhere, make_registry()) as dispatcher:
        [result] = dispatcher.run([call("c", "wait_read", label="x")], workspace=str(workspace), timeout_s=30)
        assert result.code == ErrorCode.TOOL_UNAVAILABLE
        assert settings.namespace not in result.content.replace(elsewhere.namespace, "")

        def said() -> list[str]:  # the look runs in a thread of its own: wait for its line
            return [r.getMessage() for r in caplog.records if "namespace(s)" in r.getMessage()]

        wait_until(lambda: bool(said()), 30, "the log line naming the other namespace")
    named = said()[0].split("namespace(s) ", 1)[1].split(" do:", 1)[0].split(", ")
    assert settings.namespace in named, said()  # (other tests' fleets on this Redis may be named too)


def test_a_call_that_worked_resets_failures_counted_while_it_ran(dispatcher, worker, workspace):
    """The claim reads the tool's failure count at the start; failures counted while the call runs
    reach its pool process on the breaker's channel (worker/breaker_notices.py), so its success still
    ends the run of failures: one more failure then leaves the circuit closed."""
    from toolfleet.breaker import Breakers

    keys = Keys(dispatcher.settings.namespace)
    breakers = Breakers(dispatcher.settings, dispatcher.ledger.redis)
    turn = dispatcher.submit([call("long", "wait_read", label="a", seconds=1.5)], workspace=str(workspace))
    wait_until(lambda: dispatcher.ledger.fence_of(turn.turn_id, "long") is not None, 30, "the call's start")
    for _ in range(dispatcher.settings.breaker_failures - 1):
        assert breakers.observe("wait_read", ok=False) == "closed"
    assert turn.results(timeout_s=30)[0].ok
    assert not dispatcher.ledger.redis.exists(keys.breaker_failures("wait_read")), "the success reset the count"
    assert breakers.observe("wait_read", ok=False) == "closed"


def test_a_failed_read_before_a_send_leaves_each_check_to_read_for_itself(dispatcher, worker, workspace,
                                                                          monkeypatch):
    """The one round trip before a group is sent (its audit entry, the turn-armed check, the breaker
    reads: ``Sender._first_reads``) failing costs the turn nothing: the checks read on their own,
    the audit entry is written on its own, and every call of a chain of writes runs. Redis refusing
    it is simulated on that pipeline alone (the one that asks EXISTS); every other command goes to
    the real Redis."""
    import redis

    client = dispatcher.ledger.redis
    real_pipeline = client.pipeline
    refused = []

    class RefusedOnce:
        def __init__(self, pipe):
            self._pipe, self._exists = pipe, False

        def exists(self, *args):
            self._exists = True
            return self._pipe.exists(*args)

        def execute(self, *args, **kwargs):
            if self._exists:
                self._pipe.reset()
                refused.append(1)
                raise redis.ConnectionError("refused on purpose (test)")
            return self._pipe.execute(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._pipe, name)

    monkeypatch.setattr(client, "pipeline", lambda *a, **k: RefusedOnce(real_pipeline(*a, **k)))
    chain = [call(f"w{i}", "wait_write", label="x", seconds=0.05) for i in range(3)]
    turn = dispatcher.submit(chain, workspace=str(workspace))
    results = turn.results(timeout_s=30)
    assert [r.ok for r in results] == [True, True, True], [r.content for r in results]
    assert len(refused) >= 2  # at least the sends of w1 and w2 (w0 went before the turn was armed)
    # the audit entry of each refused round trip was written on its own: every call has its `submitted`
    submitted = [e.call_id for e in dispatcher.ledger.audit.read(turn.turn_id) if e.type == "submitted"]
    assert sorted(submitted) == ["w0", "w1", "w2"], submitted


def test_an_error_reply_in_the_read_before_a_send_is_logged_and_the_checks_go_on(dispatcher, worker, workspace,
                                                                                caplog):
    """A Redis error reply to the audit write of that round trip (here WRONGTYPE: the audit key is
    made a string first, as an ACL refusing XADD would answer an error too) is logged; the turn-armed
    and breaker replies after it are still read in their places, and the chain runs."""
    turn_id = "audit-key-taken"
    dispatcher.ledger.redis.set(Keys(dispatcher.settings.namespace).turn_audit(turn_id), "not a stream")
    chain = [call(f"w{i}", "wait_write", label="y", seconds=0.05) for i in range(3)]
    with caplog.at_level("WARNING", logger="toolfleet.dispatcher.sending"):
        results = dispatcher.run(chain, workspace=str(workspace), turn_id=turn_id, timeout_s=30)
    assert [r.ok for r in results] == [True, True, True], [r.content for r in results]
    logged = [r.getMessage() for r in caplog.records if "could not append the `submitted` entry" in r.getMessage()]
    assert len(logged) >= 2 and all("WRONGTYPE" in m for m in logged), logged
