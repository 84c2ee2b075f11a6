"""Hosted MCP servers (toolfleet/integrations/mcp_host.py) with odd behaviour, driven in-process."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("mcp")

from toolfleet.errors import ToolFailure  # noqa: E402
from toolfleet.integrations import mcp_host  # noqa: E402

from .conftest import ROOT  # noqa: E402
from .leftovers import marker, processes_with, wait_gone  # noqa: E402

ODD = ROOT / "tests" / "mcp_odd_server.py"


def test_a_server_that_hangs_when_started_again_leaves_no_process_per_call(tmp_path, monkeypatch):
    monkeypatch.setattr(mcp_host, "START_TIMEOUT_S", 2.0)
    flag = tmp_path / f"hang-{marker()}"
    server = mcp_host.HostedServer("odd", [sys.executable, str(ODD), str(flag)])
    try:
        assert mcp_host._content(server.call("big", {"n": 2}, 30)) == "xx"
        with pytest.raises(ToolFailure):
            server.call("die", {}, 30)  # the server died: the next call starts it again...
        flag.touch()  # ...and that start hangs before initialize
        for _ in range(3):
            with pytest.raises(ToolFailure) as failed:
                server.call("big", {"n": 2}, 30)
            assert "start" in failed.value.message, failed.value.message  # said plainly, not a bare TimeoutError
        left = wait_gone(flag.name, 5.0)
        assert left == [], left  # each failed start stopped its own server process
        os.unlink(flag)
        assert mcp_host._content(server.call("big", {"n": 3}, 30)) == "xxx"  # and a good start works again
    finally:
        server.close()
        for pid, _ in processes_with(flag.name):
            os.kill(pid, 9)


def test_an_error_result_with_only_structured_content_tells_what_it_says():
    server = mcp_host.HostedServer("odd", [sys.executable, str(ODD)])
    try:
        with pytest.raises(ToolFailure) as failed:
            mcp_host._content(server.call("structured_error", {}, 30))
        assert "quota" in failed.value.message, failed.value.message  # the server's reason reaches the model
        assert mcp_host._content(server.call("picture", {}, 30)) == "[1 non-text block(s): image]"
    finally:
        server.close()
