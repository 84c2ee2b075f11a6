"""Issue 11, case 5: Redis blips shorter than a call's deadline are ridden out, and the codes
tell the truth. A chain of 8 conflicting writes (each appends a line to tally.txt when it starts:
one line per execution) while a private redis-server is restarted or paused:

- restarted for 1 s, with its data (append-only file): every call ok, each run once;
- restarted for 1 s, without its data: calls not sent yet are sent when Redis is back (never
  "waited in the queue") and run once; a call lost with the old queues is the only loss;
- paused 25 s (SIGSTOP/SIGCONT): every call ok, each run once, no finished call WORKER_LOST.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import pytest

from toolfleet import Dispatcher, ErrorCode, Settings

from .conftest import FLEET_KEY, make_registry
from .faults import call, wait_started

CHAIN = 8
STEP_S = 0.4  # each write of the chain waits this long after writing its line


@pytest.fixture
def private_settings(private_redis, namespace):
    def make(persistent: bool = True) -> tuple[Settings, object]:
        server = private_redis(persistent=persistent)
        return Settings(redis_url=server.url, namespace=namespace, cancel_grace_s=0.5, kill_grace_s=1.0,
                        heartbeat_s=0.5, fleet_key=FLEET_KEY), server

    return make


def chain_calls():
    return [call(f"w{i}", "tally", text="x", seconds=STEP_S) for i in range(CHAIN)]


def lines(workspace) -> int:
    path = workspace / "tally.txt"
    return len(path.read_text().split()) if path.exists() else 0


def run_with_fault(settings, start_worker, workspace, fault, bound_s: float):
    start_worker(settings=settings, concurrency=2)
    dispatcher = Dispatcher(settings, make_registry())
    began = time.monotonic()
    turn = dispatcher.submit(chain_calls(), workspace=str(workspace))
    wait_started(dispatcher, turn.turn_id, "w1")
    injector = threading.Thread(target=fault)
    injector.start()
    try:
        results = turn.results(timeout_s=bound_s)
    finally:
        injector.join()
    elapsed = time.monotonic() - began
    codes = Counter(r.code.value if r.code else "ok" for r in results)
    print(f"\n{CHAIN} chained writes: {dict(codes)}; executions {lines(workspace)}; turn {elapsed:.1f} s "
          f"(bound {bound_s:g} s); attempts {[r.attempts for r in results]}")
    return dispatcher, results, elapsed


def test_redis_restarted_for_1_s_with_its_data(private_settings, start_worker, workspace):
    settings, server = private_settings(persistent=True)

    def restart():
        server.kill()
        time.sleep(1.0)  # the outage itself: nothing to join on
        server.start()

    dispatcher, results, _ = run_with_fault(settings, start_worker, workspace, restart, bound_s=60)
    assert all(r.ok for r in results), [(r.call_id, r.content) for r in results if not r.ok]
    assert lines(workspace) == CHAIN
    assert all(r.attempts == 1 for r in results)


def test_redis_restarted_for_1_s_without_its_data(private_settings, start_worker, workspace):
    settings, server = private_settings(persistent=False)

    def restart():
        server.kill()
        time.sleep(1.0)
        server.start()

    dispatcher, results, _ = run_with_fault(settings, start_worker, workspace, restart, bound_s=60)
    lost = [r for r in results if not r.ok]
    # at most the call whose message was in the old queues (or whose claim died with them) is lost;
    # no call sent after the restart is reported as having waited in the lost queue
    assert len(lost) <= 2, [(r.call_id, r.content) for r in lost]
    for r in lost:
        assert r.code in (ErrorCode.TOOL_UNAVAILABLE, ErrorCode.WORKER_LOST, ErrorCode.OUTCOME_UNKNOWN), r.content
    later = [r for r in results if r.call_id in {f"w{i}" for i in range(3, CHAIN)}]
    assert all(r.ok for r in later), [(r.call_id, r.content) for r in later if not r.ok]
    assert lines(workspace) <= CHAIN + 1


@pytest.mark.slow
def test_redis_paused_25_s(private_settings, start_worker, workspace):
    settings, server = private_settings(persistent=True)

    def pause():
        os.kill(server.proc.pid, signal.SIGSTOP)
        time.sleep(25.0)
        os.kill(server.proc.pid, signal.SIGCONT)

    bound_s = CHAIN * STEP_S + 25 + 30
    dispatcher, results, elapsed = run_with_fault(settings, start_worker, workspace, pause, bound_s=bound_s)
    assert all(r.ok for r in results), [(r.call_id, r.content) for r in results if not r.ok]
    assert lines(workspace) == CHAIN
    assert elapsed < bound_s


def test_a_heartbeat_lost_in_a_blip_is_waited_for_not_refused(settings, workspace):
    """A tool this dispatcher saw served whose worker's catalog is missing (a heartbeat Redis could
    not take): its call waits (queued) and is sent when the heartbeat is back; if none comes, the
    call gets TOOL_UNAVAILABLE after the grace (three heartbeats + 1 s), not at once and not never."""
    import json

    from toolfleet.dispatcher.sending import unserved_grace_s
    from toolfleet.keys import Keys

    from .faults import wait_until

    settings = settings.model_copy(update={"heartbeat_s": 0.5})
    keys = Keys(settings.namespace)
    with Dispatcher(settings, make_registry()) as dispatcher:
        client = dispatcher.ledger.redis

        def beat() -> None:  # a worker's catalog entry, as worker/catalog.py publishes it
            client.set(keys.catalog("ghost"), json.dumps({"worker": "ghost", "tools": [{"name": "tally"}]}),
                       px=int(settings.heartbeat_s * 3000))
            client.sadd(keys.workers, "ghost")

        beat()
        assert "tally" in dispatcher.availability.served_tools(fresh=True)
        client.delete(keys.catalog("ghost"))  # its heartbeats stopped reaching Redis
        assert "tally" not in dispatcher.availability.served_tools(fresh=True)
        turn = dispatcher.submit([call("t", "tally", text="x")], workspace=str(workspace))
        assert turn.result("t") is None and "t" not in turn._sender.sent_at  # waiting, not refused
        beat()  # the worker's next heartbeat
        wait_until(lambda: "t" in turn._sender.sent_at, unserved_grace_s(settings), "the call being sent")
        turn.cancel()
        client.delete(keys.catalog("ghost"))
        assert "tally" not in dispatcher.availability.served_tools(fresh=True)
        began = time.monotonic()
        gone = dispatcher.submit([call("u", "tally", text="y")], workspace=str(workspace))
        result = gone.results(timeout_s=15)[0]
        waited = time.monotonic() - began
        print(f"\nno heartbeat for a tool seen served: TOOL_UNAVAILABLE after {waited:.2f} s "
              f"(grace {unserved_grace_s(settings):g} s)")
        assert result.code is ErrorCode.TOOL_UNAVAILABLE and "no live worker" in result.content
        assert unserved_grace_s(settings) - 0.5 <= waited <= unserved_grace_s(settings) + 3


@pytest.mark.slow
def test_redis_restarted_1_s_mid_chain_10_times(private_settings, start_worker, workspace):
    """The 1 s restart (with its data) ten times in a row, one worker and one Redis throughout:
    every call one result, every write run exactly once, no turn past its bound."""
    settings, server = private_settings(persistent=True)
    start_worker(settings=settings, concurrency=2)
    dispatcher = Dispatcher(settings, make_registry())
    codes: Counter[str] = Counter()
    longest = 0.0
    bound_s = 60.0
    for rep in range(10):
        before = lines(workspace)
        began = time.monotonic()
        turn = dispatcher.submit([call(f"r{rep}w{i}", "tally", text=f"r{rep}", seconds=STEP_S) for i in range(CHAIN)],
                                 workspace=str(workspace))
        wait_started(dispatcher, turn.turn_id, f"r{rep}w1")

        def restart():
            server.kill()
            time.sleep(1.0)  # the outage itself
            server.start()

        injector = threading.Thread(target=restart)
        injector.start()
        results = turn.results(timeout_s=bound_s)
        injector.join()
        longest = max(longest, time.monotonic() - began)
        codes.update(r.code.value if r.code else "ok" for r in results)
        assert len(results) == CHAIN and lines(workspace) - before == CHAIN
    print(f"\nRedis restarted 1 s mid-chain, 10 repetitions of {CHAIN} chained writes: results {dict(codes)}; "
          f"executions {lines(workspace)} for {10 * CHAIN} calls; longest turn {longest:.1f} s (bound {bound_s:g} s)")
    assert codes == {"ok": 10 * CHAIN}
