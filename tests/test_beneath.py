"""The kernel-beneath resolution on its own (toolfleet.tools.beneath): openat2 and the O_NOFOLLOW
walk give the same answers for the same trees; the walk is forced with TOOLFLEET_BENEATH=walk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from toolfleet import ToolContext
from toolfleet.tools import beneath
from toolfleet.tools.beneath import have_openat2, open_beneath, openat2, walk
from toolfleet.tools.files import edit_file, grep, list_dir, read_file, write_file
from toolfleet.tools.resources import canonical_path_resource, paths, resolve

MODES = ["openat2", "walk"]


@pytest.fixture(params=MODES)
def mode(request, monkeypatch) -> str:
    if request.param == "walk":
        monkeypatch.setenv("TOOLFLEET_BENEATH", "walk")
        assert not have_openat2()
    else:
        monkeypatch.delenv("TOOLFLEET_BENEATH", raising=False)
        if not have_openat2():
            pytest.skip("this kernel has no openat2")
    return request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """ws/ with files, an inner link to a folder and to a file, links out (absolute, relative,
    absolute pointing back inside), a loop, a dangling inner link; outside/ beside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("CANARY\n")
    ws = tmp_path / "ws"
    (ws / "sub" / "deep").mkdir(parents=True)
    (ws / "sub" / "x.txt").write_text("x\n")
    (ws / "sub" / "deep" / "y.txt").write_text("y\n")
    (ws / "alias").symlink_to("sub")
    (ws / "sub" / "up").symlink_to("..")  # inside: sub/up -> ws
    (ws / "file_link").symlink_to("sub/x.txt")
    (ws / "out_abs").symlink_to(outside)
    (ws / "out_rel").symlink_to("../outside")
    (ws / "sub" / "out_deep").symlink_to("../../outside/secret.txt")
    (ws / "abs_inside").symlink_to(ws / "sub")
    (ws / "loop_a").symlink_to("loop_b")
    (ws / "loop_b").symlink_to("loop_a")
    (ws / "dangling").symlink_to("sub/new_dir/new.txt")
    return ws


def _read(root: int, path: str) -> str:
    fd = open_beneath(root, path, os.O_RDONLY)
    with os.fdopen(fd) as handle:
        return handle.read()


def _errno(root: int, path: str, flags: int = os.O_RDONLY, **kw) -> int:
    with pytest.raises(OSError) as info:
        os.close(open_beneath(root, path, flags, **kw))
    return info.value.errno


def test_inside_paths_and_links_resolve(mode, tree):
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _read(root, "sub/x.txt") == "x\n"
        assert _read(root, "alias/x.txt") == "x\n"
        assert _read(root, "alias/deep/../x.txt") == "x\n"
        assert _read(root, "file_link") == "x\n"
        assert _read(root, "sub/up/sub/deep/y.txt") == "y\n"
        assert _read(root, "./sub//deep/./y.txt") == "y\n"
        fd = open_beneath(root, "", os.O_RDONLY | os.O_DIRECTORY)  # "" is the root itself
        assert os.path.samestat(os.fstat(fd), os.fstat(root))
        os.close(fd)
    finally:
        os.close(root)


def test_everything_that_leaves_is_exdev(mode, tree):
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for path in ("..", "../outside/secret.txt", "sub/../../outside/secret.txt", "/etc/passwd",
                     "out_abs/secret.txt", "out_rel/secret.txt", "sub/out_deep", "abs_inside/x.txt",
                     "sub/up/.."):
            assert _errno(root, path) == errno.EXDEV, path
        assert _errno(root, "out_abs/new.txt", os.O_WRONLY | os.O_CREAT) == errno.EXDEV
        assert not (tree.parent / "outside" / "new.txt").exists()
        assert _errno(root, "loop_a") == errno.ELOOP
        assert _errno(root, "sub/x.txt/nope") == errno.ENOTDIR
        assert _errno(root, "sub/missing") == errno.ENOENT
        assert _errno(root, "file_link", follow=False) == errno.ELOOP  # a link as last component
    finally:
        os.close(root)


def test_create_through_an_inner_dangling_link_lands_inside(mode, tree):
    (tree / "sub" / "new_dir").mkdir()
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.close(open_beneath(root, "dangling", os.O_WRONLY | os.O_CREAT, 0o644))
    finally:
        os.close(root)
    assert (tree / "sub" / "new_dir" / "new.txt").exists()


def test_walk_gives_canonical_names_and_the_deepest_existing_parent(tree):
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd, names = walk(root, "alias/deep/../x.txt")
        os.close(fd)
        assert names == ["sub", "x.txt"]
        assert walk(root, "alias/new/a/../b.txt", partial=True) == (None, ["sub", "new", "b.txt"])
        assert walk(root, "dangling", partial=True) == (None, ["sub", "new_dir", "new.txt"])
        fd, names = walk(root, "file_link", os.O_PATH, follow=False)  # the link itself
        assert names == ["file_link"] and os.readlink("", dir_fd=fd) == "sub/x.txt"
        os.close(fd)
        with pytest.raises(OSError) as info:
            walk(root, "out_rel/anything/new.txt", partial=True)
        assert info.value.errno == errno.EXDEV
    finally:
        os.close(root)


def test_openat2_wrapper_against_the_kernel(tree):
    if not have_openat2():
        pytest.skip("this kernel has no openat2")
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = openat2(root, "alias/x.txt", os.O_RDONLY)
        assert os.read(fd, 10) == b"x\n"
        assert os.get_inheritable(fd) is False  # O_CLOEXEC always
        os.close(fd)
        with pytest.raises(OSError) as info:
            openat2(root, "out_rel/secret.txt", os.O_RDONLY)
        assert info.value.errno == errno.EXDEV
        with pytest.raises(OSError) as info:  # without RESOLVE_BENEATH the same path is allowed
            os.close(openat2(root, "out_rel/secret.txt", os.O_RDONLY, resolve=0))
            raise OSError(0, "opened")
        assert info.value.errno == 0
        fd = openat2(root, "made.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        assert (tree / "made.txt").stat().st_mode & 0o777 == 0o600
    finally:
        os.close(root)


def test_enosys_falls_back_to_the_walk(tree, monkeypatch):
    """A kernel without openat2 (ENOSYS) or a seccomp filter that refuses it (EPERM): the probe
    says no and every open takes the walk, with the same answers."""
    monkeypatch.delenv("TOOLFLEET_BENEATH", raising=False)

    def enosys(*args):
        ctypes.set_errno(errno.ENOSYS)
        return -1

    import ctypes

    monkeypatch.setattr(beneath, "_syscall", enosys)
    monkeypatch.setattr(beneath, "_available", None)
    assert not have_openat2()
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _read(root, "alias/x.txt") == "x\n"
        assert _errno(root, "out_abs/secret.txt") == errno.EXDEV
    finally:
        os.close(root)
    monkeypatch.setattr(beneath, "_available", None)  # the next test probes again


def test_file_tools_in_both_modes(mode, tree):
    ctx = ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=tree)
    assert read_file(path="alias/x.txt", ctx=ctx) == "x\n"
    write_file(ctx=ctx, path="alias/new/made.txt", content="made\n")
    assert (tree / "sub" / "new" / "made.txt").read_text() == "made\n"
    edit_file(ctx=ctx, path="file_link", old_string="x", new_string="z")  # edits the target
    assert (tree / "sub" / "x.txt").read_text() == "z\n" and (tree / "file_link").is_symlink()
    out = grep(ctx=ctx, pattern=".", path=".")
    assert "CANARY" not in out and "sub/x.txt:1:z" in out
    sub = grep(ctx=ctx, pattern=".", path="sub")
    assert "CANARY" not in sub and "sub/out_deep" in sub  # named among the links not followed
    listing = list_dir(ctx=ctx).splitlines()
    assert "alias -> sub" in listing and "sub/" in listing
    assert any(line.startswith("out_abs -> ") and "not followed" in line for line in listing)


def test_canonical_resources(tree):
    ws = str(tree)
    root = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        spell = {p: canonical_path_resource(p, root, ws) for p in (
            "alias/x.txt", "sub/x.txt", "file_link", "alias/new/../n.txt", str(tree / "alias" / "x.txt"),
            "out_abs/secret.txt", "../x", "/etc/passwd", "loop_a", "sub/x.txt/oops", "a\0b")}
    finally:
        os.close(root)
    assert spell["alias/x.txt"] == spell["sub/x.txt"] == spell["file_link"] == "fs:sub/x.txt"
    assert spell[str(tree / "alias" / "x.txt")] == "fs:sub/x.txt"
    assert spell["alias/new/../n.txt"] == "fs:sub/n.txt"
    for outside in ("out_abs/secret.txt", "../x", "/etc/passwd", "loop_a", "a\0b"):
        assert spell[outside] == "fs:", outside  # the whole workspace: the call is refused anyway
    assert spell["sub/x.txt/oops"] == "fs:sub/x.txt/oops"  # unresolvable for another reason: lexical
    # through resolve(): paths() canonicalises the raw spelling; custom functions their fs: paths
    assert resolve(paths("path"), {"path": "alias/deep/../x.txt"}, ws) == {"fs:sub/x.txt"}
    assert resolve(lambda a: ["fs:alias", "key:k"], {}, ws) == {"fs:sub", "key:k"}
    assert resolve(paths("path"), {"path": "alias/x.txt"}, str(tree / "nowhere")) == {"fs:alias/x.txt"}  # lexical
    assert resolve(paths("path"), {"path": "alias/x.txt"}, None) == {"fs:alias/x.txt"}
