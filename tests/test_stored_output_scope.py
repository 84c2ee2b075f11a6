"""A stored output is read only where it was made: ``read_output(ref)`` from another workspace or
another session is refused as if the reference did not exist. A hunt's find: the reference was a
bearer token for the whole namespace, so a turn in workspace B (another tenant) given a reference
made in workspace A (quoted in a shared document, a log, a prompt injection) read A's output: the
text of A's files and commands, past the kernel's confinement of B's file tools beneath B. The
normal flow is kept: a later turn of the same workspace and session pages through its own output.
Real Redis, a real worker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import redis

from toolfleet import ToolCall
from toolfleet.keys import Keys
from toolfleet.tools.context import ToolContext
from toolfleet.tools.stored_output import OutputStore, read_output

WAIT_S = 120


def _read(dispatcher, ref: str, workspace: Path, session_id: str | None):
    [result] = dispatcher.run([ToolCall(id="r", name="read_output", arguments=json.dumps({"ref": ref, "limit": 50}))],
                              workspace=str(workspace), session_id=session_id, timeout_s=WAIT_S)
    return result


def test_a_stored_output_is_read_only_from_its_own_workspace_and_session(dispatcher, worker, tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir()
    theirs.mkdir()
    (mine / "secret.txt").write_text("TOP-SECRET-OF-MINE\n" + "x" * 60_000 + "\n")
    [made] = dispatcher.run([ToolCall(id="c", name="run_command", arguments=json.dumps({"command": "cat secret.txt"}))],
                            workspace=str(mine), session_id="s-mine", timeout_s=WAIT_S)
    assert made.ok, made.content
    ref = re.search(r'read_output\(ref="(out_[0-9a-f]+)"', made.content).group(1)

    own = _read(dispatcher, ref, mine, "s-mine")  # a later turn of the same workspace and session
    assert own.ok and own.content.startswith("TOP-SECRET-OF-MINE"), own.content

    for workspace, session_id in ((theirs, "s-mine"), (theirs, "s-theirs"), (theirs, None), (mine, "s-theirs")):
        other = _read(dispatcher, ref, workspace, session_id)
        assert not other.ok and other.error.code == "EXECUTION_ERROR", (workspace, session_id, other.content)
        assert "TOP-SECRET" not in other.content and "another workspace or session" in other.content


def test_the_store_scopes_by_workspace_and_session(settings, tmp_path):
    client = redis.Redis.from_url(settings.redis_url)
    store = OutputStore(client, Keys(settings.namespace), 60)
    ref = store.save("hello world", workspace=str(tmp_path), session_id="s1")
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path)

    def ctx(workspace: Path | None, session_id: str | None) -> ToolContext:
        return ToolContext(call_id="c", turn_id="t", tool_name="read_output", session_id=session_id,
                           workspace=workspace, deadline=1e18, output_store=store)

    assert read_output.handler(ctx(tmp_path, "s1"), ref).startswith("hello world")
    assert read_output.handler(ctx(link, "s1"), ref).startswith("hello world")  # one workspace, two spellings
    for workspace, session_id in ((tmp_path, None), (tmp_path, "s2"), (None, "s1"), (tmp_path / "sub", "s1")):
        try:
            read_output.handler(ctx(workspace, session_id), ref)
        except Exception as exc:  # noqa: BLE001 - ToolFailure
            assert "another workspace or session" in str(getattr(exc, "message", exc))
        else:
            raise AssertionError(f"read from {workspace}, {session_id}")
    client.close()
