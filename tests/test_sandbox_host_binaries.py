"""What runs *outside* the sandbox for a call (the deadline's coreutils ``timeout``, bubblewrap) is
found in root's directories first, never in a directory a sandbox can write. A breaker's escape: a
worker started with a workspace's ``.venv/bin`` first on its ``PATH`` (a developer's activated
virtualenv, in the project the agent edits) ran a ``timeout`` one call had planted there, as the
worker, unsandboxed, at the next call. Real prefork worker, real bubblewrap."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from toolfleet.tools import sandbox

from .faults import call


def _plant(directory: Path, marker: Path) -> None:
    """A ``timeout`` that, run on the host, writes ``marker`` then runs the real one."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "timeout"
    fake.write_text(f"#!/bin/sh\necho escaped > {marker}\nexec /usr/bin/timeout \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_host_binaries_come_from_roots_directories_before_path(tmp_path, monkeypatch):
    _plant(tmp_path / "bin", tmp_path / "marker")
    (tmp_path / "bin" / "bwrap").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert sandbox.host_binary("timeout") == "/usr/bin/timeout"
    assert sandbox.host_binary("bwrap") == "/usr/bin/bwrap"
    assert sandbox.host_binary(str(tmp_path / "bin" / "bwrap")) == str(tmp_path / "bin" / "bwrap")  # a path: as given
    assert sandbox.host_binary(str(tmp_path / "nothing")) is None
    assert sandbox.deadline_binary().startswith(("/usr/bin/", "/bin/"))


def test_a_timeout_planted_on_the_workers_path_never_runs_outside_the_sandbox(
        start_worker, dispatcher, workspace, tmp_path, monkeypatch):
    marker = Path("/var/tmp") / f"toolfleet-escape-{os.getpid()}-{tmp_path.name}"  # the sandbox's /tmp is its own
    venv_bin = workspace / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{venv_bin}:{os.environ['PATH']}")
    start_worker(concurrency=1)
    plant = (f"printf '#!/bin/sh\\necho escaped > {marker}\\nexec /usr/bin/timeout \"$@\"\\n' > .venv/bin/timeout"
             " && chmod +x .venv/bin/timeout && echo planted")
    try:
        first, second = dispatcher.run([call("plant", "run_command", command=plant),
                                        call("next", "run_command", command="echo second")],
                                       workspace=str(workspace), timeout_s=60)
        assert "planted" in first.content, first
        assert second.ok and "second" in second.content, second
        [third] = dispatcher.run([call("third", "run_command", command="echo third")], workspace=str(workspace),
                                 timeout_s=60)
        assert third.ok, third
        assert not marker.exists(), "the planted timeout ran on the host"
    finally:
        marker.unlink(missing_ok=True)


KEYS = '''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key, SYS_keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[__import__("os").uname().machine]
SESSION = -3
if sys.argv[1] == "add":
    data = sys.argv[2].encode()
    print("added" if libc.syscall(SYS_add_key, b"user", b"tf-note", data, len(data), ctypes.c_int(SESSION)) > 0
          else "refused")
else:
    found = libc.syscall(SYS_keyctl, 10, ctypes.c_int(SESSION), b"user", sys.argv[2].encode(), 0)
    if found < 0:
        print("absent")
    else:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(SYS_keyctl, 11, found, buf, 256)
        print("found", buf.raw[:n].decode())
'''


def test_sandboxes_do_not_share_the_workers_session_keyring(start_worker, dispatcher, tmp_path):
    """The worker runs in a session keyring of its own (as runc and systemd start services); one
    tenant's command stores a key in ``@s``; another tenant's later command, and the worker, must
    not see it, and no command sees the worker's own session key. Before, all three did."""
    import ctypes

    if os.uname().machine not in ("x86_64", "aarch64"):
        import pytest
        pytest.skip("keyctl numbers known for x86_64 and aarch64 only")
    libc = ctypes.CDLL(None, use_errno=True)
    add_key, keyctl = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    if libc.syscall(keyctl, 1, b"toolfleet-test-session") < 0:  # this test process, and the worker it starts
        import pytest
        pytest.skip("keyctl refused here (a seccomp profile): no keyring to share")
    secret = b"worker-session-secret"
    libc.syscall(add_key, b"user", b"tf-worker", secret, len(secret), ctypes.c_int(-3))
    start_worker(concurrency=1)
    a, b = tmp_path / "tenant-a", tmp_path / "tenant-b"
    for workspace in (a, b):
        workspace.mkdir()
        (workspace / "keys.py").write_text(KEYS)
    [stored] = dispatcher.run([call("a", "run_command", command="/usr/bin/python3 keys.py add tenant-a-was-here; "
                                    "/usr/bin/python3 keys.py find tf-worker")], workspace=str(a), timeout_s=60)
    assert "absent" in stored.content and "worker-session-secret" not in stored.content, stored
    [read] = dispatcher.run([call("b", "run_command", command="/usr/bin/python3 keys.py find tf-note")],
                            workspace=str(b), timeout_s=60)
    assert "absent" in read.content and "tenant-a" not in read.content, read
    assert libc.syscall(keyctl, 10, ctypes.c_int(-3), b"user", b"tf-note", 0) < 0  # nor in the worker's


PLANTED_BASH = {
    # a FIFO: the worker opened it (O_RDONLY) to copy the shell into the sandbox, and waited for a writer
    # forever, holding the lock every new session of the worker takes
    "fifo": "mkfifo .venv/bin/bash && chmod 755 .venv/bin/bash && echo planted",
    # a program of the workspace's: it became the session's shell (the channel's reader, non-dumpable)
    "script": "printf '#!/bin/sh\\necho planted-shell\\n' > .venv/bin/bash && chmod 755 .venv/bin/bash && echo planted",
}


@pytest.mark.parametrize("plant", sorted(PLANTED_BASH))
def test_a_bash_planted_on_the_workers_path_is_never_the_live_shell(start_worker, settings, workspace, monkeypatch,
                                                                    plant):
    """The live shell's ``bash`` is read by the worker, outside the sandbox (copied to an execute-only
    file in it): it comes from root's directories, like the deadline's ``timeout``. Before, the
    worker took the first ``bash`` on its ``PATH``: with a workspace's ``.venv/bin`` there, a FIFO a
    command planted hung the worker's session host (every later session of every tenant), and a
    program planted there became the next session's shell."""
    from toolfleet import Dispatcher
    from toolfleet.tools.registry import default_registry

    from .conftest import TEST_TOOLS

    shell_tools = "toolfleet.tools.shell_session"
    venv_bin = workspace / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    monkeypatch.setenv("PATH", f"{venv_bin}:{os.environ['PATH']}")
    fast = settings.model_copy(update={"heartbeat_s": 1.0})
    start_worker(concurrency=1, args=["--tools", shell_tools], settings=fast)
    with Dispatcher(fast, default_registry([TEST_TOOLS, shell_tools])) as live:
        [planted] = live.run([call("plant", "run_command", command=PLANTED_BASH[plant])], workspace=str(workspace),
                             timeout_s=60)
        assert planted.ok and "planted" in planted.content, planted
        [first] = live.run([call("s", "shell", command="echo from-the-shell", timeout_s=10)],
                           workspace=str(workspace), session_id=f"planted-{plant}", timeout_s=30)
        assert first.ok and first.content == "from-the-shell\n", first
