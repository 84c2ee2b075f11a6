"""Each tool has its own queue by default, so a call only reaches workers that serve its tool,
even when workers with different tool sets share a namespace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from toolfleet import ToolCall
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for

from .conftest import ROOT


def test_a_call_only_reaches_workers_that_serve_its_tool(settings, start_worker, dispatcher):
    with_tools = start_worker(name="custom")
    plain = subprocess.Popen(  # built-in tools only
        [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url, "--namespace",
         settings.namespace, "--concurrency", "2", "--hostname", f"plain@{settings.namespace}",
         "--loglevel", "WARNING"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, start_new_session=True,
    )
    try:
        ready = client_for(settings.ledger, socket_timeout=70)  # where workers announce themselves
        assert ready.blpop([Keys(settings.namespace).workers_ready], timeout=60)
        calls = [ToolCall(id=f"c{i}", name="wait_read", arguments=json.dumps({"label": str(i)})) for i in range(8)]
        results = dispatcher.run(calls, timeout_s=60)
        assert [r.status for r in results] == ["ok"] * 8
        assert {r.worker for r in results} == {with_tools.name}
    finally:
        plain.send_signal(signal.SIGTERM)
        plain.wait(timeout=30)
