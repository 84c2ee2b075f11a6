"""Issue 15, "a turn you can look at": `toolfleet trace TURN --html FILE` of a real turn (real Redis,
real prefork worker: parallel reads, a serialized write pair, an error, a refusal, a cancel), loaded
in a real headless Chromium (Debian's `chromium`): one node per call, an edge per wait, a cancel
marker; model-controlled text (a `<script>` call id, an `<img onerror>` tool name, a message with
markup) stays text. The screenshot is kept in docs/trace.png when TOOLFLEET_UPDATE_DOCS=1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from toolfleet import ToolCall

from .conftest import ROOT

WAIT_S = 60
BROWSER_S = 120
SCRIPT_ID = "<script>document.body.setAttribute('data-pwned','id')</script>"
IMG_TOOL = "<img src=x onerror=\"document.body.setAttribute('data-pwned','tool')\">"
MESSAGE = "<script>document.body.setAttribute('data-pwned','message')</script> backend down"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium on PATH: `apt-get install -y chromium` (.ci/run installs it) to test the trace page")


def browse(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=BROWSER_S)


class Elements(HTMLParser):
    """Every element of the dumped DOM: (tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    def with_class(self, name: str) -> list[dict[str, str]]:
        return [a for _tag, a in self.found if name in a.get("class", "").split()]


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


def test_trace_page_in_headless_chromium(settings, start_worker, dispatcher, workspace, tmp_path):
    browser = chromium()
    start_worker(concurrency=4)
    calls = [
        call("read_a", "wait_read", 0, label="a", seconds=0.3),  # reads side by side
        call("read_b", "wait_read", 1, label="b", seconds=0.3),
        call("write_1", "wait_write", 2, label="k", seconds=0.2),  # a write pair on one resource: in order
        call("write_2", "wait_write", 3, label="k", seconds=0.1),
        call(SCRIPT_ID, "boom", 4, message=MESSAGE),  # an error, its id and message model-controlled
        call("unknown", IMG_TOOL, 5),  # refused before it ran
        call("long_count", "count_until_cancelled", 6, seconds=30),  # running when the turn is cancelled
        call("hold_c", "wait_write", 7, label="c", seconds=30),
        call("after_c", "wait_read", 8, label="c"),  # waits for hold_c: never starts
    ]
    turn = dispatcher.submit(calls, workspace=str(workspace))
    short = {"read_a", "read_b", "write_1", "write_2", SCRIPT_ID, "unknown"}
    for result in turn.as_completed(WAIT_S):
        short.discard(result.call_id)
        if not short:
            break
    turn.cancel("user closed the tab")
    results = {r.call_id: r for r in turn.results(WAIT_S)}
    assert results["write_2"].ok and not results[SCRIPT_ID].ok
    assert results["after_c"].code.value == "NOT_EXECUTED" and results["long_count"].code.value == "CANCELLED"

    page = tmp_path / "turn.html"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cli = subprocess.run([sys.executable, "-m", "toolfleet", "trace", turn.turn_id, "--html", str(page),
                          "--redis-url", settings.redis_url, "--namespace", settings.namespace],
                         env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    source = page.read_text(encoding="utf-8")
    assert not re.search(r"<script|<img|https?://(?!www\.w3\.org/2000/svg)", source, re.I)  # no code, no network

    dumped = browse(page, tmp_path / "profile", "--dump-dom")
    assert dumped.returncode == 0 and "</html>" in dumped.stdout, (browser, dumped.stderr[-2000:])
    dom = Elements()
    dom.feed(dumped.stdout)
    nodes = dom.with_class("call-node")
    assert sorted(n["data-call-id"] for n in nodes) == sorted(c.id for c in calls)  # one node per call
    edges = {(a["data-from"], a["data-to"]) for a in dom.with_class("wait-edge")}
    assert {("write_1", "write_2"), ("hold_c", "after_c")} <= edges  # who waits for whom
    assert ("read_a", "read_b") not in edges and ("read_b", "read_a") not in edges  # the reads run side by side
    assert len(dom.with_class("cancel-marker")) == 1
    assert len(dom.with_class("lane")) == len(calls) and dom.with_class("worker-lane")
    assert dom.with_class("seg-run-ok") and dom.with_class("seg-run-error") and dom.with_class("refused-marker")
    # model-controlled text is text: no script or img element, nothing ran
    assert not [tag for tag, _ in dom.found if tag in ("script", "img", "iframe")]
    assert not [a for tag, a in dom.found if tag == "body" and "data-pwned" in a]
    assert "&lt;script&gt;document.body.setAttribute" in dumped.stdout

    shot = tmp_path / "trace.png"
    taken = browse(page, tmp_path / "profile2", f"--screenshot={shot}", "--window-size=1280,1500",
                   "--hide-scrollbars")
    assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
    if os.environ.get("TOOLFLEET_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, ROOT / "docs" / "trace.png")
