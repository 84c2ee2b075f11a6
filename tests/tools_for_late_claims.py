"""Tools for tests/test_late_claims.py: a write whose pool process stops itself (SIGSTOP) right
after its claim, before its handler starts: the moment a frozen worker's claim reply is in
flight or just read (a GC pause, a VM stall). Only in a worker started with
``TOOLFLEET_TEST_LATE_DIR`` set (a folder: the claim leaves ``claimed-<call id>`` there, the
handler ``wrote-<label>``). ``late_pay``: a journaled payment whose call can wait for another
execution holding its idempotency key (``Journal.begin`` leaves ``busy-<call id>`` then)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from toolfleet.ledger_claims import ClaimSteps
from toolfleet.tools.context import ToolContext
from toolfleet.tools.spec import tool
from toolfleet.worker.journal import Journal

_claim_start = ClaimSteps.claim_start


def _claim_then_stop(self, turn_id, call_id, worker, **kwargs):  # type: ignore[no-untyped-def]
    claim = _claim_start(self, turn_id, call_id, worker, **kwargs)
    folder = os.environ.get("TOOLFLEET_TEST_LATE_DIR")
    if folder and str(kwargs.get("tool")).startswith("late_write"):
        (Path(folder) / f"claimed-{call_id}").touch()
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test's SIGCONT
    return claim


ClaimSteps.claim_start = _claim_then_stop  # type: ignore[method-assign]
_begin = Journal.begin


def _begin_and_tell(self, key, token, owner, *args, **kwargs):  # type: ignore[no-untyped-def]
    """``Journal.begin``, leaving ``busy-<call id>`` in the test's folder when another execution
    holds the key (the call waits for it)."""
    begun = _begin(self, key, token, owner, *args, **kwargs)
    folder = os.environ.get("TOOLFLEET_TEST_LATE_DIR")
    if folder and begun.verdict == "busy":
        (Path(folder) / f"busy-{owner.rsplit(':', 1)[-1]}").touch()
    return begun


Journal.begin = _begin_and_tell  # type: ignore[method-assign]


@tool(access="write", resources=lambda a: [f"late:{a['label']}"], timeout_s=30)
def late_write(label: str) -> str:
    """Leave ``wrote-<label>`` in the test's folder (a write that is not idempotent nor journaled).

    Args:
        label: the file's suffix.
    """
    return _write(label)


def _write(label: str) -> str:
    (Path(os.environ["TOOLFLEET_TEST_LATE_DIR"]) / f"wrote-{label}").touch()
    return f"wrote {label}"


@tool(access="read", timeout_s=30)
def late_echo(text: str) -> str:
    """Return ``text`` (a call to join on: the pool took it after the one before).

    Args:
        text: echoed back.
    """
    return text


@tool(access="write", resources=lambda a: [f"late:{a['label']}"], timeout_s=4)
def late_write_short(label: str) -> str:
    """``late_write`` with a 4 s time limit (its soft limit can land before the handler starts).

    Args:
        label: the file's suffix.
    """
    return _write(label)


@tool(access="write", resources=lambda a: [f"late:{a['label']}"], timeout_s=45)
def late_write_long(label: str) -> str:
    """``late_write`` with a 45 s time limit (outlasts a worker's 30 s of retries on Redis).

    Args:
        label: the file's suffix.
    """
    return _write(label)


def _folder() -> Path:
    return Path(os.environ["TOOLFLEET_TEST_LATE_DIR"])


def _paid(ctx: ToolContext, label: str, key: str, hold: bool = False) -> str | None:
    """The probe: ``paid`` if a payment under ``key`` was made, else None (run the handler)."""
    return "paid" if (_folder() / f"paid-{key}").exists() else None


@tool(access="write", resources=lambda a: [f"pay:{a['label']}"], timeout_s=30,
      idempotency_key=lambda a: a["key"], probe=_paid)
def late_pay(ctx: ToolContext, label: str, key: str, hold: bool = False) -> str:
    """A payment journaled under ``key`` (a probe looks it up). ``hold``: hold the key, leave
    ``holding-<label>``, wait for ``go`` in the test's folder, then fail without paying.

    Args:
        label: the call's resource, and the suffix of ``wrote-<label>``.
        key: the idempotency key.
        hold: hold the key until ``go``, then fail.
    """
    if hold:
        (_folder() / f"holding-{label}").touch()
        while not (_folder() / "go").exists() and ctx.remaining_s > 0:
            ctx.cancelled.wait(0.02)
        raise RuntimeError("gave up without paying")
    (_folder() / f"paid-{key}").touch()
    return _write(label)


@tool(access="write", resources=lambda a: [f"late:{a['label']}"], timeout_s=45)
def late_step(ctx: ToolContext, label: str) -> str:
    """Leave ``stepping-<label>``, wait for ``step`` in the test's folder, check the fence, then
    leave ``wrote-<label>`` (a write whose one step comes after a wait).

    Args:
        label: the files' suffix.
    """
    (_folder() / f"stepping-{label}").touch()
    while not (_folder() / "step").exists() and ctx.remaining_s > 0:
        ctx.cancelled.wait(0.02)
    ctx.check_fence()
    return _write(label)
