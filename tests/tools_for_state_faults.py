"""Loaded by a worker (``--tools tests.tools_for_state_faults``) to make its next load or save of a
session state fail on Redis, as a dropped connection does: with ``TOOLFLEET_TEST_STATE_FAULTS`` set
to a folder, a file ``load`` (``save``) there makes the next state read (the save script) raise
``redis.ConnectionError`` once, in whichever process of the worker runs it (the file is removed)."""

from __future__ import annotations

import os

import redis
import redis.client

from toolfleet.tools.spec import tool

FOLDER = os.environ.get("TOOLFLEET_TEST_STATE_FAULTS", "")


def _fault(step: str, args: tuple) -> None:
    if FOLDER and any(":state:" in str(a) for a in args):
        try:
            os.remove(os.path.join(FOLDER, step))
        except FileNotFoundError:
            return
        raise redis.ConnectionError(f"Connection closed by server (test fault: state {step})")


_execute = redis.client.Pipeline.execute
_command = redis.Redis.execute_command


def _pipeline_execute(self, *args, **kwargs):
    _fault("load", tuple(a for c in self.command_stack for a in c[0]))
    return _execute(self, *args, **kwargs)


def _execute_command(self, *args, **kwargs):
    if args and str(args[0]).upper() in ("EVALSHA", "EVAL"):
        _fault("save", args)
    return _command(self, *args, **kwargs)


redis.client.Pipeline.execute = _pipeline_execute
redis.Redis.execute_command = _execute_command



@tool
def state_faults_armed() -> list[str]:
    """The state steps whose next run fails (``load``, ``save``)."""
    return sorted(os.listdir(FOLDER)) if FOLDER else []
