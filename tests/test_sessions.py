"""Stored session state (issue 13, items 1, 2, 4-7) against real Redis and real prefork workers.

The scripted test runs >= 100 turns over three sessions of examples/vfs.py through the workers
and compares every result and the final states with the same calls run one by one in-process.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest

from examples.vfs import TOOLS, VirtualFS
from toolfleet import Dispatcher, Settings, ToolCall, default_registry
from toolfleet.errors import ConfigurationError, ToolfleetError
from toolfleet.models import ErrorCode
from toolfleet.tools.state import SessionStore
from toolfleet.trace import build_timeline
from toolfleet.worker.values import to_content_and_data

from .conftest import TEST_TOOLS

WAIT_S = 90
MODULES = [TEST_TOOLS, "examples.vfs", "tests.tools_for_sessions"]
WORKER_ARGS = ["--tools", "examples.vfs", "--tools", "tests.tools_for_sessions"]


@pytest.fixture
def sdispatcher(settings: Settings) -> Iterator[Dispatcher]:
    with Dispatcher(settings, default_registry(MODULES)) as d:
        yield d


def calls_of(turn_no: int, script: list[tuple[str, dict]]) -> list[ToolCall]:
    return [ToolCall(id=f"t{turn_no}c{i}", name=name, arguments=json.dumps(args), index=i)
            for i, (name, args) in enumerate(script)]


def expected_of(fs: VirtualFS, name: str, args: dict) -> tuple[str, str]:
    """(status, text) of one call run in-process, as the worker reports it."""
    try:
        value = getattr(fs, name.removeprefix("fs_"))(**args)
    except Exception as exc:  # noqa: BLE001 - the same rule as the worker's
        return "error", f"{type(exc).__name__}: {exc}"
    return "ok", to_content_and_data(value)[0]


def snapshot(fs: VirtualFS) -> dict:
    return {"cwd": fs.cwd, "dirs": sorted(fs.dirs), "files": fs.files, "rng": fs.rng.getstate()}


def make_script(rng: random.Random, turns: int) -> list[list[tuple[str, dict]]]:
    """Batches of 1-6 calls; reads come in runs so the plan can overlap them. No three identical
    read calls in a row (that is a loop, refused by design); cd("..") three times in a row is in."""
    names = ["a", "b", "c", "notes.txt", "log.txt", "x.md"]
    out = []
    for t in range(turns):
        batch: list[tuple[str, dict]] = []
        if t % 9 == 4:
            batch = [("fs_mkdir", {"path": "d1/d2/d3"}), ("fs_cd", {"path": "d1/d2/d3"}),
                     *[("fs_cd", {"path": ".."})] * 3]
            out.append(batch)
            continue
        for _ in range(rng.randint(1, 6)):
            kind = rng.random()
            f = rng.choice(names)
            if kind < 0.45:
                batch.append(rng.choice([("fs_ls", {}), ("fs_cat", {"path": f}), ("fs_find", {"name": f[:1]}),
                                         ("fs_wc", {"path": f}), ("fs_pwd", {}), ("fs_du", {}),
                                         ("fs_ls", {"path": rng.choice(["/", "a", ".."])})]))
            else:
                batch.append(rng.choice([
                    ("fs_echo", {"text": f"line {t}\n", "path": f, "append": rng.random() < 0.5}),
                    ("fs_mkdir", {"path": rng.choice(["a", "b", "a/b", "c/d"])}),
                    ("fs_cd", {"path": rng.choice(["a", "/", "..", "b", "nope"])}),
                    ("fs_mv", {"source": f, "target": rng.choice(names)}),
                    ("fs_rm", {"path": f}),
                    ("fs_roll", {"sides": rng.choice([6, 20])}),
                    ("fs_du", {"save_as": "total.txt"}),
                ]))
        out.append(batch)
    return out


def test_scripted_turns_match_in_process(sdispatcher: Dispatcher, start_worker, settings: Settings) -> None:
    """Issue 13, must-show 1: 120 turns over 3 sessions through 2 workers (4 processes) give the
    results and final states of running the same calls one by one in one process; reads that the
    plan lets run side by side overlap (measured from the audit trail)."""
    start_worker(args=WORKER_ARGS)
    start_worker(args=WORKER_ARGS)
    seeds = {"s-alpha": 1, "s-beta": 2, "s-gamma": 3}
    local = {sid: VirtualFS(rng=random.Random(seed)) for sid, seed in seeds.items()}
    for sid, seed in seeds.items():
        assert sdispatcher.open_session(sid, state={"vfs": VirtualFS(rng=random.Random(seed))}) == sid
    scripts = {sid: make_script(random.Random(seed * 7), 40) for sid, seed in seeds.items()}
    compared = overlapping = parallel_reads = 0
    turn_no = 0
    for step in range(40):
        for sid in seeds:
            batch = scripts[sid][step]
            turn_no += 1
            turn = sdispatcher.submit(calls_of(turn_no, batch), session_id=sid)
            results = turn.results(timeout_s=WAIT_S)
            plan_deps = turn.plan.deps
            trail = sdispatcher.ledger.audit.read(turn.turn_id)
            rows = {r.call_id: r for r in build_timeline(turn.turn_id, trail).rows}
            for call, result in zip(calls_of(turn_no, batch), results, strict=True):
                status, text = expected_of(local[sid], call.name, json.loads(call.arguments))
                assert result.status == status, (sid, turn_no, call, result)
                got = result.content if status == "ok" else result.error.message
                assert got == text, (sid, turn_no, call, got, text)
                compared += 1
            reads = [c.id for c, (name, args) in zip(calls_of(turn_no, batch), batch, strict=True)
                     if TOOLS_BY_NAME[name].access_for(args) == "read" and not plan_deps.get(c.id)]
            for i, a in enumerate(reads):
                for b in reads[i + 1:]:
                    parallel_reads += 1
                    ra, rb = rows[a], rows[b]
                    if None not in (ra.started_ms, rb.started_ms, ra.finished_ms, rb.finished_ms) and \
                            ra.started_ms <= rb.finished_ms and rb.started_ms <= ra.finished_ms:
                        overlapping += 1
    assert turn_no >= 100 and compared >= 300
    store = SessionStore(sdispatcher.ledger.redis, sdispatcher.ledger.keys)
    state = TOOLS[0].state
    for sid, fs in local.items():
        stored = store.load(state, sid).value
        assert snapshot(stored) == snapshot(fs), sid
    print(f"\n{turn_no} turns, {compared} calls equal; read pairs the plan let overlap: {parallel_reads}, "
          f"measured overlapping: {overlapping}")
    assert parallel_reads > 0 and overlapping > 0


TOOLS_BY_NAME = {spec.name: spec for spec in TOOLS}


def run(d: Dispatcher, sid: str | None, *script: tuple[str, dict], turn: str = "") -> list:
    calls = [ToolCall(id=f"{turn}c{i}", name=n, arguments=json.dumps(a), index=i) for i, (n, a) in enumerate(script)]
    return d.submit(calls, session_id=sid).results(timeout_s=WAIT_S)


def test_state_survives_sigkill_and_lifecycle(sdispatcher: Dispatcher, start_worker, settings: Settings) -> None:
    """Must-show 2: the state saved by a worker that is then SIGKILLed is what the next call, on
    another worker, sees. Lifecycle: open, list, close; a closed session refuses calls."""
    first = start_worker(args=WORKER_ARGS)
    sid = sdispatcher.open_session(state={"vfs": {"cwd": "/", "dirs": ["/", "/home"], "files": {}}})
    with pytest.raises(ToolfleetError, match="open already"):
        sdispatcher.open_session(sid)
    r = run(sdispatcher, sid, ("fs_cd", {"path": "home"}), ("fs_echo", {"text": "kept", "path": "k.txt"}))
    assert [x.status for x in r] == ["ok", "ok"], r
    first.kill()
    start_worker(args=WORKER_ARGS)
    r = run(sdispatcher, sid, ("fs_pwd", {}), ("fs_cat", {"path": "k.txt"}))
    assert [x.content for x in r] == ["/home", "kept"], r
    listed = {s["session_id"]: s for s in sdispatcher.sessions.sessions()}
    assert listed[sid]["states"]["vfs"]["version"] == 3 and listed[sid]["expires_in_s"] > 0
    assert sdispatcher.close_session(sid)
    r = run(sdispatcher, sid, ("fs_pwd", {}), turn="after")
    assert r[0].code is ErrorCode.EXECUTION_ERROR and "not open" in r[0].error.message
    r = run(sdispatcher, None, ("fs_pwd", {}), turn="none")
    assert r[0].code is ErrorCode.EXECUTION_ERROR and "no session id" in r[0].error.message


def test_tool_output_cannot_plant_state(sdispatcher: Dispatcher, start_worker, settings: Settings, workspace) -> None:
    """Must-show 3: what a tool outputs or writes never becomes session state: the state is in
    Redis (no file tool reaches it), written only by the worker's save of the tool's own object;
    a stored value that is not a valid state is refused, never run (JSON, no pickle)."""
    start_worker(args=WORKER_ARGS)
    sid = sdispatcher.open_session()
    planted = json.dumps({"cwd": "/evil", "dirs": ["/", "/evil"], "files": {"/x": "pwned"}})
    calls = [ToolCall(id="w", name="write_file", index=0,
                      arguments=json.dumps({"path": "vfs.json", "content": planted})),
             ToolCall(id="e", name="fs_echo", arguments=json.dumps({"text": planted, "path": "state"}), index=1),
             ToolCall(id="p", name="fs_pwd", arguments="{}", index=2)]
    results = sdispatcher.submit(calls, session_id=sid, workspace=str(workspace)).results(timeout_s=WAIT_S)
    assert [r.status for r in results] == ["ok", "ok", "ok"], results
    assert results[2].content == "/"
    store = sdispatcher.sessions
    fs = store.load(TOOLS[0].state, sid).value
    assert fs.cwd == "/" and fs.files == {"/state": planted} and "/evil" not in fs.dirs
    assert not list(workspace.glob("**/*.pickle")) and not any(
        sid in p.name for p in workspace.rglob("*"))  # nothing of the session lives in the workspace
    # a tampered store (someone with Redis access) is refused by validation, not executed
    sdispatcher.ledger.redis.hset(store.state_key(sid, "vfs"), "data", b"\x80\x04cos\nsystem\n")
    r = run(sdispatcher, sid, ("fs_pwd", {}), turn="tampered")
    assert r[0].code is ErrorCode.EXECUTION_ERROR and "not a valid" in r[0].error.message


def test_access_per_call_loops_formatter_and_save_on_raise(sdispatcher: Dispatcher, start_worker,
                                                           settings: Settings) -> None:
    """Items 1, 5, 6, 7: per-call access plans du() as a read and du(save_as) as a write on the
    session resource; the third cd("..") in a row runs (state changed), a third identical ls is a
    loop, pwd opts out; a handler that raises keeps what it changed; the size limit holds; a
    tool's formatter gives the text and data is kept; a tool_from_schema handler gets ctx."""
    start_worker(args=WORKER_ARGS)
    sid = sdispatcher.open_session(state={"vfs": VirtualFS(dirs={"/", "/a", "/a/b", "/a/b/c"}, cwd="/a/b/c")})
    turn = sdispatcher.submit(calls_of(1, [("fs_du", {}), ("fs_du", {}), ("fs_du", {"save_as": "t"}), ("fs_ls", {})]),
                              session_id=sid)
    turn.results(timeout_s=WAIT_S)
    deps = turn.plan.deps
    assert deps["t1c1"] == frozenset() and deps["t1c2"] == {"t1c0", "t1c1"} and deps["t1c3"] == {"t1c2"}
    r = run(sdispatcher, sid, *[("fs_cd", {"path": ".."})] * 3, turn="cd")
    assert [x.content for x in r] == ["/a/b", "/a", "/"], r
    r = run(sdispatcher, sid, *[("fs_pwd", {})] * 4, ("fs_ls", {}), ("fs_ls", {}), ("fs_ls", {}), turn="loop")
    assert [x.status for x in r[:6]] == ["ok"] * 6 and r[6].code is ErrorCode.LOOP_DETECTED, r

    r = run(sdispatcher, sid, ("bump", {"label": "x"}), ("bump", {"label": "boom"}), ("bump", {}),
            ("bump", {"label": "y" * 3000}), ("bump", {}), turn="bump")
    assert r[0].content == "count=1" and r[0].data == {"count": 1, "seen": 1}
    assert r[1].code is ErrorCode.EXECUTION_ERROR and "failed after counting" in r[1].error.message
    assert r[2].content == "count=3"  # the failed call's count was kept
    assert r[3].code is ErrorCode.EXECUTION_ERROR and "over its limit of 2000" in r[3].error.message
    assert r[4].content == "count=4"  # the oversized change was not kept
    r = run(sdispatcher, sid, ("whoami", {"greeting": "hi"}), turn="who")
    assert r[0].data == {"greeting": "hi", "session": sid, "tool": "whoami"}
    assert r[0].content == json.dumps(r[0].data)  # compact JSON by default


def test_builtins_left_out_or_replaced_explicitly() -> None:
    """Item 6: a user tool named like a built-in is refused unless replaced on purpose."""
    with pytest.raises(ConfigurationError, match="--replace grep"):
        default_registry(["tests.tools_user_grep"])
    replaced = default_registry(["tests.tools_user_grep"], replace=["grep"])
    assert replaced.get("grep").handler(pattern="x") == "user grep: x" and "read_file" in replaced
    bare = default_registry(["tests.tools_user_grep", "tests.tools_for_sessions"], builtins=False)
    assert sorted(bare.names()) == ["bump", "crash_bump", "grep", "meter_add", "meter_get", "slow_bump", "whoami"]
    with pytest.raises(ConfigurationError, match="no tool module"):
        default_registry(["examples.vfs"], replace=["read_file"])
    assert bare.get("whoami").context_param == "ctx"
    from toolfleet import SessionState, tool

    with pytest.raises(ConfigurationError, match="ctx.session"):
        tool(lambda a: a, name="stateless_handler", state=SessionState("x", dict))


def test_cli_sessions_open_list_close(settings: Settings) -> None:
    """Item 2: `toolfleet sessions` opens (with a state given as JSON), lists and closes."""
    import os
    import subprocess
    import sys

    from .conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    base = [sys.executable, "-m", "toolfleet", "sessions", "--redis-url", settings.redis_url,
            "--namespace", settings.namespace]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=60)

    opened = cli("--open", "cli-1", "--tools", "examples.vfs", "--state", 'vfs={"cwd": "/", "dirs": ["/"]}')
    assert opened.returncode == 0 and "opened session cli-1" in opened.stdout, opened.stderr
    bad = cli("--open", "cli-2", "--tools", "examples.vfs", "--state", 'vfs={"cwd": 5}')
    assert bad.returncode == 1 and "not a valid" in bad.stderr + bad.stdout and "Traceback" not in bad.stderr
    listed = json.loads(cli("--json").stdout)
    assert [s["session_id"] for s in listed] == ["cli-1"] and listed[0]["states"]["vfs"]["version"] == 1
    assert "cli-1" in cli().stdout
    assert "closed session cli-1" in cli("--close", "cli-1").stdout
    assert json.loads(cli("--json").stdout) == []
    # an id is the caller's text: [/x] in it is printed as is (before: MarkupError, a traceback)
    odd = cli("--open", "cli-[/x]", "--tools", "examples.vfs")
    assert odd.returncode == 0 and "opened session cli-[/x]" in odd.stdout, odd.stderr
    shown = cli()
    assert shown.returncode == 0 and "cli-[/x]" in shown.stdout, shown.stderr
    assert "closed session cli-[/x]" in cli("--close", "cli-[/x]").stdout
    for option in ("--close", "--open"):  # an empty id is refused, not taken for "list"
        empty = cli(option, "", "--tools", "examples.vfs") if option == "--open" else cli(option, " ")
        assert empty.returncode == 1 and "give a session id" in empty.stdout + empty.stderr, empty.stdout
        assert "Traceback" not in empty.stderr


def test_worker_without_builtins_and_with_a_replaced_grep(settings: Settings, start_worker) -> None:
    """Item 6 through real workers: --no-builtins serves no built-in; --replace grep serves the
    module's grep in the built-in's place (the call runs the user's handler)."""
    from toolfleet.worker.catalog import live_catalog

    start_worker(args=["--no-builtins", "--tools", "tests.tools_for_sessions"], name="bare")
    served = {t["name"] for entry in live_catalog(settings) for t in entry["tools"]}
    assert "whoami" in served and not served & {"read_file", "run_command", "grep"}
    start_worker(args=["--replace", "grep", "--tools", "tests.tools_user_grep"], name="repl")
    registry = default_registry([TEST_TOOLS, "tests.tools_user_grep"], replace=["grep"])
    with Dispatcher(settings, registry) as d:
        r = d.submit([ToolCall(id="g", name="grep", arguments='{"pattern": "x"}', index=0)]).results(timeout_s=WAIT_S)
    assert r[0].content == "user grep: x", r


def test_loop_detection_lets_a_repeat_through_when_results_differed(dispatcher: Dispatcher, worker, workspace) -> None:
    """Item 7: identical calls whose earlier results differ (the file changed in between, by
    something else) are not a loop; once the results stop changing, the repeat is refused."""
    readme = workspace / "README.md"

    def read(turn: str):
        call = ToolCall(id=f"{turn}-r", name="read_file", arguments='{"path": "README.md"}', index=0)
        return dispatcher.submit([call], workspace=str(workspace), session_id="s-changing").results(timeout_s=WAIT_S)[0]

    assert read("t1").ok
    readme.write_text("changed by someone else\n")
    assert read("t2").ok
    third = read("t3")
    assert third.ok and "changed by someone else" in third.content  # results differed: not a loop
    assert read("t4").code is ErrorCode.LOOP_DETECTED  # the last two results were the same


def test_store_saves_compare_and_set_and_expire(settings: Settings) -> None:
    """A stale execution never overwrites a newer state; a closed session saves nothing; a state
    first saved after opening is listed and closed with the session; ttl_s is the keys' expiry."""
    import redis as redis_lib

    from toolfleet.errors import ToolFailure
    from toolfleet.keys import Keys

    from .tools_for_sessions import COUNTER, Counter

    store = SessionStore(redis_lib.Redis.from_url(settings.redis_url), Keys(settings.namespace))
    vfs = TOOLS[0].state
    store.open("cas", {vfs: None}, ttl_s=120)
    first, stale = store.load(vfs, "cas"), store.load(vfs, "cas")
    first.value.cwd = "/first"
    assert store.save(vfs, "cas", first, first.value) == 2
    stale.value.cwd = "/stale"
    with pytest.raises(ToolFailure, match="changed by another execution"):
        store.save(vfs, "cas", stale, stale.value)
    assert store.load(vfs, "cas").value.cwd == "/first"
    late = store.load(COUNTER, "cas")
    assert late.version == 0 and store.save(COUNTER, "cas", late, Counter(count=5)) == 1
    assert 0 < store.redis.ttl(store.state_key("cas", "counter")) <= 120
    assert set(store.sessions()[0]["states"]) == {"vfs", "counter"}
    assert store.close("cas") and not store.redis.exists(store.state_key("cas", "counter"))
    with pytest.raises(ToolFailure, match="closed or expired"):
        store.save(vfs, "cas", first, first.value)
    with pytest.raises(ToolFailure, match="not open"):
        store.load(vfs, "cas")


def test_worker_killed_under_a_write_leaves_the_state_as_before(settings: Settings, start_worker) -> None:
    """A pool process SIGKILLed after its handler changed the state in memory saves nothing: the
    call ends with an error result within the liveness bound and the next call sees the state as
    it was before it."""
    fast = settings.model_copy(update={"heartbeat_s": 0.5})
    start_worker(args=WORKER_ARGS, settings=fast)
    with Dispatcher(fast, default_registry(MODULES)) as d:
        sid = d.open_session()
        assert run(d, sid, ("bump", {}), turn="a")[0].content == "count=1"
        crashed = run(d, sid, ("crash_bump", {}), turn="b")[0]
        assert crashed.code in (ErrorCode.OUTCOME_UNKNOWN, ErrorCode.WORKER_LOST), crashed
        assert run(d, sid, ("bump", {}), turn="c")[0].content == "count=2"


def test_a_cancelled_call_saves_nothing(sdispatcher: Dispatcher, start_worker) -> None:
    """A write call of a turn cancelled while it ran is CANCELLED and its changes are not saved
    (ctx.check_fence refuses the save): the next call sees the state as before it."""
    from .faults import wait_started

    start_worker(args=WORKER_ARGS)
    sid = sdispatcher.open_session()
    assert run(sdispatcher, sid, ("bump", {}), turn="a")[0].content == "count=1"
    turn = sdispatcher.submit([ToolCall(id="slow", name="slow_bump", arguments="{}", index=0)], session_id=sid)
    wait_started(sdispatcher, turn.turn_id, "slow")
    turn.cancel()
    assert turn.results(timeout_s=WAIT_S)[0].code is ErrorCode.CANCELLED
    assert run(sdispatcher, sid, ("bump", {}), turn="c")[0].content == "count=2"


def test_open_takes_the_json_form_of_a_state_typed_set_or_list_of_models(settings: Settings) -> None:
    """A state whose type is not a class (``set[str]``, ``list[Todo]``) given at open as its JSON
    form (``--state 'tags=["a","b"]'``, what docs/sessions.md says open takes): it was kept
    unvalidated (every value "is an instance" of a generic alias) and then refused ("would not load
    back as it is (at $: a list is loaded back as set)"), so such a session could not be opened with
    a value. It is validated into the type, as a class-typed state's JSON form is; an instance
    given is stored as it is."""
    from pydantic import BaseModel

    from toolfleet import tool
    from toolfleet.tools.registry import Registry
    from toolfleet.tools.state import SessionState

    class Todo(BaseModel):
        title: str
        done: bool = False

    tags, todos = SessionState("tags", set[str], default=set), SessionState("todos", list[Todo], default=list)

    @tool(state=tags)
    def tag(ctx, name: str) -> str:
        """Tag.

        Args:
            name: The tag.
        """
        return name

    @tool(state=todos)
    def todo(ctx, title: str) -> str:
        """Add a todo.

        Args:
            title: The title.
        """
        return title

    registry = Registry()
    registry.add(tag)
    registry.add(todo)
    with Dispatcher(settings, registry) as d:
        sid = d.open_session(state={"tags": ["b", "a"], "todos": [{"title": "write tests"}]})
        assert d.sessions.load(tags, sid).value == {"a", "b"}
        assert d.sessions.load(todos, sid).value == [Todo(title="write tests")]
        d.open_session(sid, state={"tags": {"c"}, "todos": [Todo(title="x", done=True)]}, replace=True)
        assert d.sessions.load(tags, sid).value == {"c"}
        assert d.sessions.load(todos, sid).value == [Todo(title="x", done=True)]
        with pytest.raises(ToolfleetError, match="not a valid"):
            d.open_session("other", state={"todos": [{"done": True}]})


def test_a_state_redis_could_not_load_or_save_says_whether_the_handler_ran(
        sdispatcher: Dispatcher, start_worker, tmp_path, monkeypatch) -> None:
    """Redis failing the load of a session's state (the handler never ran) or its save (the handler
    ran, its changes were not kept) was EXECUTION_ERROR "ConnectionError: ..." with the hint "fix the
    arguments": neither said whether the call ran, and the model was told to change a right call."""
    monkeypatch.setenv("TOOLFLEET_TEST_STATE_FAULTS", str(tmp_path))
    start_worker(concurrency=1, args=[*WORKER_ARGS, "--tools", "tests.tools_for_state_faults"])
    sid = sdispatcher.open_session()
    assert run(sdispatcher, sid, ("bump", {}), turn="a")[0].content == "count=1"

    (tmp_path / "load").touch()
    not_run = run(sdispatcher, sid, ("bump", {}), turn="b")[0]
    assert not (tmp_path / "load").exists()
    assert not_run.code is ErrorCode.EXECUTION_ERROR, not_run
    assert "did not run" in not_run.content and "ConnectionError" in not_run.content, not_run.content
    assert "fix the arguments" not in not_run.content

    (tmp_path / "save").touch()
    not_kept = run(sdispatcher, sid, ("bump", {}), turn="c")[0]
    assert not (tmp_path / "save").exists()
    assert not_kept.code is ErrorCode.EXECUTION_ERROR, not_kept
    assert "the call ran" in not_kept.content and "may not have been kept" in not_kept.content, not_kept.content
    assert "fix the arguments" not in not_kept.content
    assert run(sdispatcher, sid, ("bump", {}), turn="d")[0].content == "count=2"  # neither change was kept
