"""Tools only the tests register (workers load them with ``--tools tests.tools_for_tests``)."""

from __future__ import annotations

import time

from toolfleet import ToolContext, tool
from toolfleet.tools.resources import path_resource


@tool(access="read", resources=lambda a: [f"key:{a['label']}"], timeout_s=30)
def wait_read(ctx: ToolContext, label: str, seconds: float = 0.0) -> str:
    """Wait (cooperatively) then return the label; a read of resource key:<label>.

    Args:
        label: Echoed back; also the resource it reads.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"read {label}"


@tool(access="write", resources=lambda a: [f"key:{a['label']}"], timeout_s=30)
def wait_write(ctx: ToolContext, label: str, seconds: float = 0.0) -> str:
    """Wait (cooperatively) then return the label; a write of resource key:<label>.

    Args:
        label: Echoed back; also the resource it writes.
        seconds: How long to wait.
    """
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"wrote {label}"


@tool(access="read", resources=lambda a: [], timeout_s=30)
def stubborn_sleep(seconds: float) -> str:
    """Sleep without looking at the cancel signal (stopped only by the worker's interrupt).

    Args:
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return "slept"


@tool(access="write", resources=lambda a: [f"key:{a['label']}"], timeout_s=1)
def slow_write(label: str, seconds: float) -> str:
    """A write that sleeps (its soft time limit of 1 s stops it part-way).

    Args:
        label: the resource it writes (key:<label>).
        seconds: How long to sleep.
    """
    time.sleep(seconds)
    return label


@tool(access="read", resources=lambda a: [], timeout_s=1)
def swallowing_sleep(seconds: float) -> str:
    """Sleep and swallow every Exception (so only the hard time limit stops it).

    Args:
        seconds: How long to sleep.
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except Exception:  # noqa: BLE001 - the point of this tool
            pass
    return "slept"


@tool(access="read", resources=lambda a: [], timeout_s=30)
def unstoppable_sleep(seconds: float) -> str:
    """Sleep and swallow everything, the cancel interrupt included (only a kill stops it).

    Args:
        seconds: How long to sleep.
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.05)
        except BaseException:  # noqa: BLE001 - the point of this tool
            pass
    return "slept"


@tool(access="read", resources=lambda a: [])
def boom(message: str) -> str:
    """Raise a RuntimeError with the message.

    Args:
        message: The error message.
    """
    raise RuntimeError(message)


@tool(access="read", resources=lambda a: [])
def structured(n: int) -> dict:
    """Return structured data.

    Args:
        n: How many items.
    """
    return {"items": list(range(n))}


@tool(access="write", resources=lambda a: [path_resource(a["path"])], timeout_s=10)
def append_line(ctx: ToolContext, path: str, line: str, seconds: float = 0.0) -> str:
    """Append one line to a workspace file (read-modify-write, to expose interleaving).

    Args:
        path: File path relative to the workspace.
        line: The line to append.
        seconds: How long to wait (cooperatively) first.
    """
    from toolfleet.tools.workspace import resolve_path

    if seconds:
        ctx.cancelled.wait(seconds)
        ctx.check_cancelled()
    target = resolve_path(ctx, path)
    before = target.read_text() if target.exists() else ""
    time.sleep(0.01)
    target.write_text(before + line + "\n")
    return f"appended {line}"


@tool(access="read", resources=lambda a: [f"job:{a['job']}"], timeout_s=10, pollable=True, poll_interval_s=0.05)
def job_status(ctx: ToolContext, job: str) -> str:
    """Report a (pretend) job's status; takes 0.1 s, like a real status check.

    Args:
        job: The job id.
    """
    ctx.cancelled.wait(0.1)
    return f"job {job}: running"


@tool(access="write", resources=lambda a: [f"api:{a['endpoint']}"], sensitive=("api_token",), timeout_s=10)
def call_api(endpoint: str, api_token: str, payload: str = "") -> str:
    """Pretend to call an API with a token (a declared sensitive parameter).

    Args:
        endpoint: The endpoint.
        api_token: The secret token.
        payload: What to send.
    """
    return f"called {endpoint} with a token of {len(api_token)} characters"


# --- side effects: the refund demo (tests/refund_store.py is its domain store) ---

def _refund_key(arguments) -> str:
    return f"order-{arguments['order_id']}"


def _paid(ctx: ToolContext, order_id: str, amount_cents: int) -> str:
    return f"refunded {amount_cents} cents for order {order_id}"


def refund_probe(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float = 0.0, post_s: float = 0.0):
    """Look the refund up in the store: what the handler returned if it was paid, else None."""
    from tests import refund_store

    found = refund_store.find(ctx.workspace, _refund_key({"order_id": order_id}))
    return None if found is None else _paid(ctx, order_id, found[1])


def _refund(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float, post_s: float) -> str:
    import os

    from tests import refund_store

    key = _refund_key({"order_id": order_id})
    refund_store.record_run(ctx.workspace, key, os.getpid())
    time.sleep(pre_s)  # talking to the payment provider...
    ctx.check_fence()  # the last moment: a stale (frozen, overtaken) execution pays nothing
    refund_store.pay(ctx.workspace, key, order_id, amount_cents)
    time.sleep(post_s)  # ...and its reply taking long, or never coming back
    return _paid(ctx, order_id, amount_cents)


@tool(access="write", resources=lambda a: [f"order:{a['order_id']}"], timeout_s=3,
      idempotency_key=_refund_key, probe=refund_probe)
def refund(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float = 0.0, post_s: float = 0.0) -> str:
    """Refund an order (journaled under the order id; a probe looks the refund up in the store).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund.
        pre_s: Seconds spent before the money moves.
        post_s: Seconds spent after the money moved (a slow or lost reply).
    """
    return _refund(ctx, order_id, amount_cents, pre_s, post_s)


@tool(access="write", resources=lambda a: [f"order:{a['order_id']}"], timeout_s=3, idempotency_key=_refund_key)
def refund_blind(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float = 0.0, post_s: float = 0.0) -> str:
    """Refund an order, journaled, without a probe (an abandoned execution is OUTCOME_UNKNOWN).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund.
        pre_s: Seconds spent before the money moves.
        post_s: Seconds spent after the money moved.
    """
    return _refund(ctx, order_id, amount_cents, pre_s, post_s)


@tool(access="write", resources=lambda a: [f"note:{a['text']}"], timeout_s=5, journal=False)
def add_note(ctx: ToolContext, text: str, seconds: float = 0.0) -> str:
    """Add a note to the store: a write neither idempotent nor journaled.

    Args:
        text: The note.
        seconds: Seconds spent before writing it.
    """
    from tests import refund_store

    time.sleep(seconds)
    ctx.check_fence()
    refund_store.add_note(ctx.workspace, text)
    return f"noted {text}"


@tool(access="read", resources=lambda a: [], timeout_s=5, health_check=lambda: _flaky_health())
def flaky(ctx: ToolContext, fail: bool) -> str:
    """Fail with an unexpected exception when asked to (for the circuit breaker).

    Args:
        fail: Whether to crash.
    """
    if fail:
        raise ConnectionError("backend refused the connection")
    return "fine"


def _flaky_health() -> None:
    import os

    if os.path.exists(os.environ.get("FLAKY_HEALTH_FILE", "/nonexistent")):
        raise ConnectionError("backend still down")


@tool(access="read", resources=lambda a: [], timeout_s=10)
def count_until_cancelled(ctx: ToolContext, seconds: float, cleanup_s: float = 0.0) -> str:
    """Count every 0.1 s until cancelled (cooperatively), then clean up and keep what it counted.

    Args:
        seconds: How long to count at most.
        cleanup_s: Seconds its clean-up takes once cancelled (within the grace period).
    """
    from toolfleet import CallCancelled

    counted = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if ctx.cancelled.wait(0.1):
            time.sleep(cleanup_s)
            counted.append("cleaned up")
            raise CallCancelled(ctx.cancel_reason, output="\n".join(counted))
        counted.append(f"tick {len(counted) + 1}")
    return "\n".join(counted)


@tool(access="write", resources=lambda a: [f"note:{a['text']}"], timeout_s=10, cancellable=False, journal=False)
def settle_note(ctx: ToolContext, text: str, seconds: float = 0.0) -> str:
    """Add a note after a while; declared not cancellable, so a cancel lets it finish.

    Args:
        text: The note.
        seconds: Seconds before writing it.
    """
    from tests import refund_store

    time.sleep(seconds)
    ctx.check_fence()
    refund_store.add_note(ctx.workspace, text)
    return f"noted {text}"


PNG_1PX = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082")


def odd_value(kind: str):
    """The value :func:`returns` hands back for ``kind`` (also used by the tests to compare)."""
    import dataclasses
    import decimal
    import uuid

    from pydantic import BaseModel

    class Model(BaseModel):
        name: str
        blob: bytes = b""

    @dataclasses.dataclass
    class Point:
        x: float
        y: float
        tags: frozenset = frozenset()

    class Opaque:
        __slots__ = ()

        def __str__(self) -> str:
            return "an opaque object"

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text for you")

    cyclic: list = [1]
    cyclic.append(cyclic)
    return {
        "png": PNG_1PX,
        "big_bytes": b"\x00" * (1024 * 1024 + 1),
        "surrogate": "Launch day \ud83d",
        "pair": "party \ud83c\udf89",
        "model": Model(name="m\ud800", blob=b"\xff\x00"),
        "dataclass": Point(1.5, float("nan"), frozenset({"b", "a"})),
        "dict": {1: "one", (2, 3): {"nested": {4, 5}}, "f": float("inf")},
        "set": {3, 1, 2},
        "tuple": (1, "two", None),
        "opaque": Opaque(),
        "unprintable": Unprintable(),
        "nan": float("nan"),
        "huge_int": 10**5000,
        "big_int": 2**70,
        "none": None,
        "decimal": decimal.Decimal("1.10"),
        "uuid": uuid.UUID(int=1),
        "cycle": cyclic,
        "generator": (i for i in range(2)),
    }[kind]


@tool(access="read", resources=lambda a: [], timeout_s=10)
def returns(kind: str):
    """Return a value of an awkward kind (bytes, a lone surrogate, a model, NaN, ...).

    Args:
        kind: Which value (see odd_value).
    """
    return odd_value(kind)


@tool(access="write", resources=lambda a: [f"tally:{a['text']}"], timeout_s=60, journal=False)
def tally(ctx: ToolContext, text: str, seconds: float = 0.0) -> str:
    """Append ``text`` to tally.txt in the workspace the moment it starts (one line per execution),
    then wait (cooperatively).

    Args:
        text: The line.
        seconds: How long to wait after writing it.
    """
    import os

    with open(os.path.join(str(ctx.workspace), "tally.txt"), "a") as f:
        f.write(text + "\n")
    ctx.cancelled.wait(seconds)
    ctx.check_cancelled()
    return f"tallied {text}"


@tool(access="write", resources=lambda a: [f"tally:{a['text']}"], timeout_s=60, cancellable=False, journal=False)
def tally_through(ctx: ToolContext, text: str, seconds: float = 0.0) -> str:
    """As ``tally`` (a line in tally.txt the moment it starts, one per execution), then wait
    ``seconds`` through any cancel: declared not cancellable, so it is still running while its turn
    is cancelled and taken over.

    Args:
        text: The line.
        seconds: How long to run after writing it.
    """
    import os

    with open(os.path.join(str(ctx.workspace), "tally.txt"), "a") as f:
        f.write(text + "\n")
    time.sleep(seconds)
    return f"tallied {text}"


# --- fencing: short time limits, so freezing a worker past its deadline fits in a test ---

@tool(access="write", resources=lambda a: [f"order:{a['order_id']}"], timeout_s=1,
      idempotency_key=_refund_key, probe=refund_probe)
def quick_refund(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float = 0.0, post_s: float = 0.0) -> str:
    """The refund with a 1 s time limit (journaled, with a probe; checks its fence before paying).

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund.
        pre_s: Seconds spent before the money moves.
        post_s: Seconds spent after the money moved.
    """
    return _refund(ctx, order_id, amount_cents, pre_s, post_s)


@tool(access="write", resources=lambda a: [f"order:{a['order_id']}"], timeout_s=1, idempotency_key=_refund_key)
def quick_refund_blind(ctx: ToolContext, order_id: str, amount_cents: int, pre_s: float = 0.0,
                       post_s: float = 0.0) -> str:
    """The refund with a 1 s time limit, journaled, without a probe.

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund.
        pre_s: Seconds spent before the money moves.
        post_s: Seconds spent after the money moved.
    """
    return _refund(ctx, order_id, amount_cents, pre_s, post_s)


@tool(access="write", resources=lambda a: [path_resource(a["path"])], timeout_s=1)
def fenced_append(ctx: ToolContext, path: str, line: str, seconds: float = 0.0, running_mark: str = "") -> str:
    """Append one line to a workspace file after ``seconds``, checking the fence at the last moment.

    Args:
        path: File path relative to the workspace.
        line: The line to append.
        seconds: Seconds spent before the write.
        running_mark: A workspace file created as the handler begins (a test's sign that it runs).
    """
    from pathlib import Path

    target = Path(ctx.workspace) / path  # tests only: fixed names in the test's workspace
    if running_mark:
        (Path(ctx.workspace) / running_mark).touch()
    time.sleep(seconds)
    ctx.check_fence()
    with open(target, "a") as out:
        out.write(line + "\n")
    return f"appended {line}"


@tool(access="read", resources=lambda a: [], timeout_s=1)
def quick_read(ctx: ToolContext, label: str, seconds: float = 0.0) -> str:
    """A read with a 1 s time limit (idempotent: may run twice).

    Args:
        label: Any text.
        seconds: Seconds it takes.
    """
    ctx.cancelled.wait(seconds)
    return f"read {label}"
