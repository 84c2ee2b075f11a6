"""The sandbox's process limit (docs/sandbox.md, "Processes"; tools/limits.py), through real workers:
a fan-out past ``sandbox_max_processes`` is refused by the kernel and the result says so; a fork
bomb, in ``run_command`` or left in the background of a live ``shell``, stops at the limit, its call
ends, and the worker runs the next calls; ordinary fan-out (pipes, ``xargs -P``, ~50 processes at
once) runs as before. Every fork bomb here runs only after a bounded fan-out has shown the limit in
force on that worker: were it not, the test fails before the bomb, never with the host's PID space.

The kernel facility is whichever the worker has: a cgroup per sandbox (``pids``), or
``RLIMIT_NPROC`` in the sandbox's user namespace for a worker that is not root (checked directly
here with ``setpriv``, since the test workers run as whoever runs the tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from toolfleet import Dispatcher
from toolfleet.defaults import MIN_MAX_PROCESSES
from toolfleet.dispatcher.affinity import close_live_session
from toolfleet.tools import limits, sandbox
from toolfleet.tools.registry import default_registry

from .conftest import TEST_TOOLS
from .faults import call
from .leftovers import marker, processes_with, wait_gone
from .test_sandbox import _start_logged_worker, _stop, _tools_json

LIMIT = 48
# a bounded fan-out: 80 sleeps at once, past LIMIT; each ends after 3 s, so bash's fork retries get through
FAN_OUT = "for i in $(seq 80); do sleep 3 & done; wait; echo fan-out-done"
REFUSED = "Resource temporarily unavailable"
BOMB = "bomb() { bomb | bomb & }; bomb"
SHELL_TOOLS = "toolfleet.tools.shell_session"


def _kept_here() -> str:
    """How a worker of this host would keep the limit (``"none"``: no writable pids cgroup, and root)."""
    return limits.find(LIMIT, os.environ.get("TOOLFLEET_SANDBOX_CGROUP", "auto")).kind


# A host where the kernel cannot keep the limit (a read-only cgroup file system, a root worker) is
# said by the worker's start-up warning (the test below); the limit's own tests need the facility.
needs_the_facility = pytest.mark.skipif(_kept_here() == "none", reason="this host gives a root worker no writable "
                                        "pids cgroup: sandboxed commands have no process limit here (the worker warns)")


def run(dispatcher, workspace: Path, command: str, timeout_s: float = 60, **extra):
    return dispatcher.run([call("c", "run_command", command=command, timeout_s=timeout_s, **extra)],
                          workspace=str(workspace), timeout_s=90)[0]


@pytest.fixture
def limited(start_worker, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_SANDBOX_MAX_PROCESSES", str(LIMIT))
    return start_worker(concurrency=2, args=["--tools", SHELL_TOOLS])


def assert_limit_in_force(dispatcher, workspace: Path) -> None:
    result = run(dispatcher, workspace, FAN_OUT)
    assert REFUSED in result.content, result.content[-2000:]
    assert f"the sandbox reached its limit of {LIMIT} processes" in result.content, result.content[-2000:]


@needs_the_facility
def test_a_fan_out_past_the_limit_is_refused_and_said(dispatcher, limited, workspace):
    assert_limit_in_force(dispatcher, workspace)


@needs_the_facility
def test_a_fork_bomb_ends_and_the_worker_runs_the_next_calls(dispatcher, limited, workspace):
    assert_limit_in_force(dispatcher, workspace)  # never a bomb on a worker without the limit
    word = marker()  # in the bomb's command line, so in each of its processes'
    started = time.monotonic()
    turn = dispatcher.submit(
        [call("bomb", "run_command", command=f"{BOMB}; sleep 3; echo bomb-over # {word}", timeout_s=12),
         call("beside", "run_command", command="sleep 1; echo beside-ok", timeout_s=30)],
        workspace=str(workspace))
    most = 0
    while not turn.wait(0.05):  # seen from the host while it runs: never past the limit
        most = max(most, len(processes_with(word)))
        assert most <= LIMIT
    assert most >= LIMIT // 2, most
    bomb, beside = turn.results(timeout_s=90)
    assert time.monotonic() - started < 40
    assert REFUSED in bomb.content and f"limit of {LIMIT} processes" in bomb.content, bomb.content[-2000:]
    assert beside.ok and beside.content == "beside-ok\n", beside.content  # the other call on the worker ran
    assert wait_gone(word) == []
    for i in range(3):  # the worker goes on
        after = run(dispatcher, workspace, f"seq 5 | sort -r | head -1; echo next-{i}")
        assert after.ok and after.content == f"5\nnext-{i}\n", after.content
        assert "limit of" not in after.content
    assert limited.proc.poll() is None


@needs_the_facility
def test_a_fork_bomb_left_in_a_live_shell_is_bounded_and_ends_with_the_session(settings, limited, workspace):
    with Dispatcher(settings, default_registry([TEST_TOOLS, SHELL_TOOLS])) as live:
        def sh(command: str, timeout_s: float = 30):
            return live.run([call("s", "shell", command=command, timeout_s=timeout_s)], workspace=str(workspace),
                            session_id="bomb", timeout_s=90)[0]

        first = sh(FAN_OUT)  # the limit holds in the session's sandbox too, before any bomb
        assert REFUSED in first.content and f"limit of {LIMIT} processes" in first.content, first.content[-2000:]
        word = marker()  # the bomb's processes are bash -c ... <word>: seen from the host by that name
        planted = sh(f"bash -c '{BOMB}' bomb-{word} & echo planted")  # the bomb goes on in the background
        assert "planted" in planted.content, planted.content
        most, deadline = 0, time.monotonic() + 10
        while most < LIMIT // 2 and time.monotonic() < deadline:  # it grows to the limit, never past it
            most = max(most, len(processes_with(word)))
            assert most <= LIMIT
        assert most >= LIMIT // 2
        later = sh("echo still-here; ls / >/dev/null; echo after-ls", timeout_s=30)  # ls needs a fork: refused
        assert "still-here" in later.content and f"limit of {LIMIT} processes" in later.content, later.content
        beside = run(live, workspace, "echo beside-ok")  # run_command on the same worker, meanwhile
        assert beside.ok and beside.content == "beside-ok\n", beside.content
        assert close_live_session(settings, "bomb") == limited.name
    assert wait_gone(word, timeout_s=10) == []
    with Dispatcher(settings, default_registry([TEST_TOOLS, SHELL_TOOLS])) as live:
        [again] = live.run([call("s", "shell", command="seq 3 | wc -l")], workspace=str(workspace),
                           session_id="after", timeout_s=90)
        assert again.ok and again.content == "3\n", again.content
    assert limited.proc.poll() is None


def test_ordinary_fan_out_runs_under_the_default_limit(dispatcher, worker, workspace):
    command = ("for i in $(seq 50); do (sleep 0.5; echo $i) & done | sort -n | tail -1; "
               "seq 200 | xargs -P 8 -n 10 echo | wc -l; "
               "printf 'all:\\n\\tfor i in 1 2 3 4 5 6 7 8; do sleep 0.2 & done; wait\\n' > Makefile; "
               "make -s -j4 all && echo make-ok")
    result = run(dispatcher, workspace, command)
    assert result.ok and result.content == "50\n20\nmake-ok\n", result.content
    assert "limit of" not in result.content


def test_rlimit_nproc_in_the_sandboxs_user_namespace_bounds_that_sandbox_alone():
    """A worker that is not root (the Docker image's) with no cgroup: ``RLIMIT_NPROC`` set inside
    the sandbox's own user namespace bounds its processes, however many the worker's user has
    elsewhere on the host (15 sleeps outside; 6 processes inside fit a limit of 10, 20 do not)."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to run the sandbox as another user (setpriv)")
    limit = limits.ProcessLimit(10, prlimit=shutil.which("prlimit"))
    assert limit.kind == "rlimit"
    state = sandbox.SandboxState(sandbox.SandboxConfig(bwrap=shutil.which("bwrap") or "bwrap"), None, limit)
    workspace = Path(tempfile.mkdtemp(prefix="toolfleet-nproc-", dir="/var/tmp"))  # where nobody may enter
    os.chmod(workspace, 0o777)
    inner = "for i in $(seq {n}); do sleep 1 & done; wait; echo inner-done"
    try:
        for n, refused in ((5, False), (20, True)):
            argv, env = state.command(["bash", "-c", inner.format(n=n)], workspace)
            script = 'for i in $(seq 15); do sleep 2 & done; "$@"; s=$?; wait; exit $s'
            done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                   script, "sh", *argv], env=env, capture_output=True, text=True, timeout=60)
            out = done.stdout + done.stderr
            assert ("fork:" in out) is refused, out  # refused: bash retries, or gives up and exits
            if not refused:
                assert done.returncode == 0 and "inner-done" in out, out
    finally:
        shutil.rmtree(workspace, ignore_errors=True)


def test_where_the_kernel_cannot_keep_the_limit_the_worker_warns_and_shows_it(settings, dispatcher, workspace,
                                                                            tmp_path):
    """A root worker without a cgroup (``sandbox_cgroup = "off"``; RLIMIT_NPROC does not bind root):
    commands still run, the worker warns at start-up, and ``toolfleet tools --json`` shows no limit.
    With the default, the same worker shows the cgroup it keeps the limit with."""
    if os.getuid() != 0:
        pytest.skip("a worker that is not root keeps the limit with RLIMIT_NPROC")
    proc, log = _start_logged_worker(settings, tmp_path, {"TOOLFLEET_SANDBOX_CGROUP": "off"})
    try:
        text = log.read_text()
        assert "sandboxed commands have NO process limit" in text and "sandbox_cgroup is off" in text, text
        [entry] = _tools_json(settings)
        assert entry["sandbox"]["process_limit"] == "none" and entry["sandbox"]["max_processes"] == 512
        result = run(dispatcher, workspace, "echo ran")
        assert result.ok and result.content == "ran\n", result.content
    finally:
        _stop(proc)


@needs_the_facility
def test_the_catalog_shows_how_the_limit_is_kept(settings, worker):
    [entry] = _tools_json(settings)
    assert entry["sandbox"]["max_processes"] == 512
    assert entry["sandbox"]["process_limit"] in ("cgroup", "rlimit"), entry["sandbox"]


def _sandbox_cgroup_of(pid: int) -> str | None:
    """The toolfleet sandbox cgroup (a path under the pids hierarchy) process ``pid`` is in, if any."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if ("pids" in controllers.split(",") or controllers == "") and limits.PREFIX in path:
            return path
    return None


def _cgroup_dir(path: str) -> Path:
    limit = limits.find(LIMIT, os.environ.get("TOOLFLEET_SANDBOX_CGROUP", "auto"))
    assert limit.cgroup_base is not None
    return Path(limit.cgroup_base) / Path(path).name


@needs_the_facility
def test_a_pool_process_killed_mid_command_leaves_no_cgroup_behind(dispatcher, limited, workspace):
    """A pool process killed while its command runs (the dispatcher's SIGKILL of a stuck cancelled
    call, the OOM killer): the sandbox dies with it (PR_SET_PDEATHSIG), and its empty cgroup is
    removed while the worker lives on, not only at the worker's next start."""
    word = marker()
    turn = dispatcher.submit([call("c", "run_command", command=f"sleep {word}", timeout_s=60)],
                             workspace=str(workspace))
    deadline = time.monotonic() + 20
    while not (found := processes_with(word)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert found, "the command did not start"
    path = _sandbox_cgroup_of(found[0][0])
    assert path is not None
    directory = _cgroup_dir(path)
    pool_pid = int(directory.name[len(limits.PREFIX):].split("-")[0])
    assert pool_pid in limited.children()
    os.kill(pool_pid, 9)
    assert wait_gone(word, timeout_s=10) == []
    turn.results(timeout_s=60)
    for i in range(3):  # the worker goes on, in new pool processes
        after = run(dispatcher, workspace, f"echo next-{i}")
        assert after.ok, after.content
    deadline = time.monotonic() + 10
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not directory.exists(), f"{directory} of the killed pool process {pool_pid} is left"


@needs_the_facility
def test_a_live_shell_restarted_to_stop_a_bomb_still_says_the_limit(settings, limited, workspace):
    """A fork bomb run in the foreground of a live shell, stopped at its time limit by restarting the
    shell: the result says the limit refused forks (they happened in the old sandbox, whose count
    goes with it), and the new shell's next result does not."""
    with Dispatcher(settings, default_registry([TEST_TOOLS, SHELL_TOOLS])) as live:
        def sh(command: str, timeout_s: float = 30):
            return live.run([call("s", "shell", command=command, timeout_s=timeout_s)], workspace=str(workspace),
                            session_id="restart", timeout_s=90)[0]

        first = sh(FAN_OUT)  # the limit holds in the session's sandbox, before any bomb
        assert REFUSED in first.content and f"limit of {LIMIT} processes" in first.content, first.content[-2000:]
        word = marker()
        bombed = sh(f"bomb() {{ bomb | bomb & }}; trap '' USR1; bomb; while :; do :; done # {word}", timeout_s=4)
        assert not bombed.ok
        assert f"limit of {LIMIT} processes" in bombed.content, bombed.content[-2000:]
        assert wait_gone(word, timeout_s=10) == []
        after = sh("echo after")
        assert after.ok and "limit of" not in after.content, after.content
        assert close_live_session(settings, "restart") == limited.name


@pytest.mark.parametrize("too_few", ["1", "3", "4"])
def test_a_limit_the_sandbox_itself_does_not_fit_in_is_refused_at_start_up(settings, tmp_path, too_few):
    """``sandbox_max_processes`` counts the sandbox's own processes (the deadline's ``timeout``,
    ``bwrap``, its init, the shell): a limit of 1 to 4 let the worker start and serve ``run_command``,
    whose every command then failed (``bwrap: Can't fork for pid 1``, ``bash: fork: ...``). The
    setting is refused, and the worker does not start, saying why."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent),
               TOOLFLEET_SANDBOX_MAX_PROCESSES=too_few)
    argv = [sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url, "--namespace",
            settings.namespace, "--concurrency", "1", "--tools", TEST_TOOLS, "--loglevel", "WARNING"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"the worker started with sandbox_max_processes = {too_few}: {out[-2000:]}")
    assert "sandbox_max_processes" in out and "at least" in out, out[-2000:]


def test_the_smallest_limit_allowed_runs_a_pipeline(dispatcher, start_worker, workspace, monkeypatch):
    monkeypatch.setenv("TOOLFLEET_SANDBOX_MAX_PROCESSES", str(MIN_MAX_PROCESSES))
    start_worker(concurrency=1)
    result = run(dispatcher, workspace, "seq 100 | sort -rn | head -1")
    assert result.ok and result.content == "100\n", result.content


@needs_the_facility
def test_a_thread_refused_by_the_limit_is_said_as_such(dispatcher, limited, workspace):
    """Threads count against the limit too: a program that starts more threads than it allows fails
    with its own words (Python: ``can't start new thread``), not bash's ``fork:``, and the note says
    that threads were refused as well as processes."""
    command = ("python3 -c 'import threading, time\n"
               f"ts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range({LIMIT + 20})]\n"
               "[t.start() for t in ts]'")
    result = run(dispatcher, workspace, command)
    assert not result.ok and "can't start new thread" in result.content, result.content[-2000:]
    assert f"the sandbox reached its limit of {LIMIT} processes" in result.content, result.content[-2000:]
    note = result.content[result.content.index("[the sandbox reached"):]
    assert "thread" in note, note
