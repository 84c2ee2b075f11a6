"""How ``write_file`` / ``edit_file`` replace a file (toolfleet/tools/writes.py), as a breaker found
them: the temporary file is 0600 until its content and mode are complete (another local user read a
0600 ``.env``'s content from it); set-user-ID and set-group-ID bits are never carried to the new file;
a new file gets 0666 less the umask; a name of multi-byte characters up to NAME_MAX bytes can be
written (its temporary name was over 255 bytes); a path whose last part is ``.`` or ``..`` names a
folder and is refused (``newdir/.`` became a file ``newdir``)."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet import ToolContext, ToolFailure
from toolfleet.tools.files import edit_file, write_file


def ctx_for(workspace) -> ToolContext:
    return ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=workspace)


@pytest.fixture
def modes_at_fchmod(monkeypatch):
    """The temporary file's mode and size each time writes.py sets its final mode."""
    seen: list[tuple[int, int]] = []
    real = os.fchmod

    def spy(fd: int, mode: int) -> None:
        st_ = os.fstat(fd)
        seen.append((stat.S_IMODE(st_.st_mode), st_.st_size))
        real(fd, mode)

    monkeypatch.setattr(os, "fchmod", spy)
    return seen


def test_the_temporary_file_is_private_until_its_mode_is_set(tmp_path, modes_at_fchmod):
    secret = tmp_path / ".env"
    secret.write_text("DB_PASSWORD=hunter2\nX=1\n")
    secret.chmod(0o600)
    ctx = ctx_for(tmp_path)
    edit_file(path=".env", old_string="X=1", new_string="X=2", ctx=ctx)
    write_file(path="fresh.txt", content="hello\n", ctx=ctx)
    # both temporary files were 0600, content complete, when their final mode was set
    assert modes_at_fchmod == [(0o600, len("DB_PASSWORD=hunter2\nX=2\n")), (0o600, len("hello\n"))]
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env", "fresh.txt"]  # no temporary file left


def test_set_id_bits_are_not_carried_to_the_new_file(tmp_path):
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o6755)
    write_file(path="tool.sh", content="#!/bin/sh\necho changed\n", ctx=ctx_for(tmp_path))
    assert stat.S_IMODE(tool.stat().st_mode) == 0o755


@given(st.text(alphabet=st.characters(min_codepoint=0xA0, max_codepoint=0x2FFF, exclude_categories=("Cs",)),
               min_size=1, max_size=40)
       .flatmap(lambda short: st.sampled_from([short, short * 10])))  # long names: up to 255 bytes once cut
@settings(max_examples=40, deadline=None)
def test_a_name_up_to_name_max_bytes_can_be_written_and_edited(tmp_path_factory, stem):
    workspace = tmp_path_factory.mktemp("ws")
    name = stem.encode()[:255].decode(errors="ignore").replace("/", "_") or "x"
    ctx = ctx_for(workspace)
    write_file(path=name, content="one\n", ctx=ctx)
    edit_file(path=name, old_string="one", new_string="two", ctx=ctx)
    assert [p.name for p in workspace.iterdir()] == [name]
    assert (workspace / name).read_text() == "two\n"


def test_a_long_name_of_two_byte_characters(tmp_path):
    name = "é" * 120  # 240 bytes: a valid name; its temporary name was 266 bytes
    (tmp_path / name).write_text("hello\n")
    write_file(path=name, content="new\n", ctx=ctx_for(tmp_path))
    assert (tmp_path / name).read_text() == "new\n"


@pytest.mark.parametrize("path", ["newdir/.", "newdir/..", "a/b/..", ".", "..", "docs/."])
def test_a_path_ending_in_a_dot_part_names_a_folder(tmp_path, path):
    (tmp_path / "docs").mkdir()
    with pytest.raises(ToolFailure):
        write_file(path=path, content="x", ctx=ctx_for(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs"] and not any((tmp_path / "docs").iterdir())
