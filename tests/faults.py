"""Helpers of the fault-injection tests: waiting on ledger events, killing the right process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from toolfleet import Dispatcher, ToolCall
from toolfleet.keys import STARTED, Keys, run_field


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def wait_started(dispatcher: Dispatcher, turn_id: str, call_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Block on the turn's event stream until ``call_id`` has started; returns its started record
    (worker, pid, started_at)."""
    deadline = time.monotonic() + timeout_s
    last = "0-0"
    while time.monotonic() < deadline:
        for event in dispatcher.ledger.events(turn_id, after=last, block_ms=200):
            last = event.stream_id
            if event.type == "started" and event.call_id == call_id:
                return json.loads(event.data)
            if event.type == "result" and event.call_id == call_id:  # answered without starting: say why
                raise AssertionError(f"call {call_id} of turn {turn_id} never started: {event.result().content}")
    raise TimeoutError(f"call {call_id} of turn {turn_id} did not start within {timeout_s} s")


def started_record(dispatcher: Dispatcher, turn_id: str, call_id: str) -> dict[str, Any] | None:
    key = Keys(dispatcher.settings.namespace).turn_runs(turn_id)
    raw = dispatcher.ledger.redis.hget(key, run_field(STARTED, call_id))
    return None if raw is None else json.loads(raw)


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_until(check, timeout_s: float, what: str, every_s: float = 0.02) -> None:
    """Wait for a condition of another process's state (a file, a database row) that has no event
    to join on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s} s")


def freeze(worker) -> None:
    """SIGSTOP a whole worker (main process and pool, its process group): a long GC pause, a VM
    stall, a partition. Nothing of it runs until :func:`thaw`."""
    os.killpg(worker.proc.pid, signal.SIGSTOP)


def thaw(worker) -> None:
    os.killpg(worker.proc.pid, signal.SIGCONT)


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state ``T`` in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def pool_stopped_at(worker, marker: Path, where: str, timeout_s: float = 30) -> int:
    """The pid of ``worker``'s one pool process once it wrote ``marker`` and stopped itself there
    (a test tool's SIGSTOP at a chosen step; ``where`` names the step in a timeout's message)."""
    wait_until(marker.exists, timeout_s, f"the pool process to reach {where}")
    [pid] = worker.children()
    wait_until(lambda: stopped(pid), 10, f"the pool process stopped {where}")
    return pid
