"""Issue 15, point 3: one source of truth for tools. Workers publish each tool's full spec; a
dispatcher (Python API and `toolfleet run` without --tools) builds its registry from the live
catalog without importing any tool code. The tools module here lives in a temporary folder only
the worker's PYTHONPATH names: this process cannot import it."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from examples.vfs import TOOLS as VFS_TOOLS
from examples.vfs import VirtualFS
from toolfleet import Dispatcher, ToolCall
from toolfleet.dispatcher.sessions import initial_value, open_session
from toolfleet.errors import ToolfleetError
from toolfleet.models import ErrorCode
from toolfleet.tools.published import describe, spec_from_description, version_conflicts
from toolfleet.tools.registry import Registry, default_registry
from toolfleet.tools.resources import EVERYTHING, resolve
from toolfleet.tools.state import SessionState

from .conftest import ROOT

ROW_TOOLS = '''
import time
from typing import Annotated
from pydantic import Field
from toolfleet import ToolContext, paths, tool

@tool(access="read", resources=paths(), timeout_s=10)  # touches nothing
def fetch_row(table: str, row: Annotated[int, Field(ge=0)]) -> dict:
    """Fetch one row of a table."""
    return {"table": table, "row": row, "value": f"{table}-{row}-VERSION"}

@tool(access="write", resources=paths("path"), timeout_s=10)
def append_slowly(path: str, text: str, ctx: ToolContext) -> str:
    """Append a start line, wait, append an end line."""
    target = ctx.resolve_path(path)
    with open(target, "a") as out:
        out.write(f"start {text}\\n")
    time.sleep(0.4)
    with open(target, "a") as out:
        out.write(f"end {text}\\n")
    return "ok"

@tool(access="write", resources=lambda a: [f"db:{a['table']}"])
def bump_row(table: str) -> str:
    """Bump a row counter (its resource function is Python code)."""
    return "bumped"
'''


def tools_module(tmp_path: Path, version: str = "v1", folder: str = "mods") -> tuple[str, Path]:
    """A tools module in a folder of its own (not on this process's path): (module name, folder)."""
    name = f"rowtools_{uuid.uuid4().hex[:8]}"
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    (where / f"{name}.py").write_text(ROW_TOOLS.replace("VERSION", version))
    assert importlib.util.find_spec(name) is None  # the dispatcher side cannot import it
    return name, where


def test_published_description_round_trips_for_the_builtins() -> None:
    for spec in default_registry():
        entry = describe(spec)
        again = spec_from_description(json.loads(json.dumps(entry)))
        assert describe(again)["version"] == entry["version"]
        assert again.parameters == spec.parameters and again.queue == spec.queue
        assert (again.timeout_s, again.journal, again.idempotent) == (spec.timeout_s, spec.journal, spec.idempotent)
    read_file = describe(default_registry().get("read_file"))
    assert read_file["resources"] == {"paths": ["path"], "default": "."}
    assert describe(default_registry().get("run_command"))["resources"] == "*"
    assert describe(default_registry().get("read_output"))["resources"] == "code"  # a lambda


def test_version_conflicts_name_the_workers() -> None:
    entries = [{"worker": "a", "tools": [{"name": "t", "version": "1"}, {"name": "u", "version": "9"}]},
               {"worker": "b", "tools": [{"name": "t", "version": "2"}, {"name": "u", "version": "9"}]}]
    assert version_conflicts(entries) == {"t": {"1": ["a"], "2": ["b"]}}


def test_dispatcher_without_registry_uses_the_published_specs(settings, start_worker, tmp_path, workspace) -> None:
    module, folder = tools_module(tmp_path)
    start_worker(python_path=[str(folder)], tools=module)
    with Dispatcher(settings) as dispatcher:  # no registry: the live catalog, no tool code imported
        registry = dispatcher.registry
        assert registry.sources["fetch_row"] == "live" and registry.sources["read_file"] == "local"
        assert resolve(registry.get("bump_row").resources, {"table": "x"}) == {EVERYTHING}  # code: everything
        turn = dispatcher.submit([
            ToolCall(id="ok", name="fetch_row", arguments={"table": "orders", "row": 3}),
            ToolCall(id="neg", name="fetch_row", arguments={"table": "orders", "row": -1}),
            ToolCall(id="extra", name="fetch_row", arguments={"table": "t", "row": 1, "col": "x"}),
            ToolCall(id="w1", name="append_slowly", arguments={"path": "log.txt", "text": "one"}),
            ToolCall(id="w2", name="append_slowly", arguments={"path": "./log.txt", "text": "two"}),
            ToolCall(id="w3", name="append_slowly", arguments={"path": "other.txt", "text": "three"}),
        ], workspace=str(workspace))
        results = turn.results(60)
        deps = {k: sorted(v) for k, v in turn.plan.deps.items()}
    # the plan rule holds from the published form: same path after, another path beside
    assert deps.get("w2") == ["w1"] and not deps.get("w3") and not deps.get("w1"), deps
    by_id = {r.call_id: r for r in results}
    assert by_id["ok"].ok and by_id["ok"].data == {"table": "orders", "row": 3, "value": "orders-3-v1"}
    for bad in ("neg", "extra"):  # refused by the dispatcher, from the published schema: never ran
        assert by_id[bad].code == ErrorCode.INVALID_ARGUMENT, by_id[bad].content
        assert by_id[bad].worker is None and by_id[bad].attempts == 0
    assert "row" in by_id["neg"].content and "col" in by_id["extra"].content
    assert by_id["w1"].ok and by_id["w2"].ok and by_id["w3"].ok
    # two writes of one path serialize (paths() is published declaratively): never interleaved
    assert (workspace / "log.txt").read_text().split("\n")[:4] == ["start one", "end one", "start two", "end two"]


def test_cli_run_without_tools_gets_the_real_result(settings, start_worker, tmp_path, workspace) -> None:
    module, folder = tools_module(tmp_path)
    start_worker(python_path=[str(folder)], tools=module)
    chat = {"id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason":
            "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "fetch_row",
                                                               "arguments": json.dumps({"table": "t", "row": 7})}},
                {"id": "c2", "type": "function", "function": {"name": "fetch_row",
                                                               "arguments": json.dumps({"table": "t"})}}]}}]}
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(chat))
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the CLI cannot import the tools module
    argv = [sys.executable, "-m", "toolfleet", "run", str(path), "-w", str(workspace), "--json",
            "--redis-url", settings.redis_url, "--namespace", settings.namespace]
    if settings.broker_url:
        argv += ["--broker-url", settings.broker_url]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "UNKNOWN_TOOL" not in done.stdout + done.stderr, done.stderr
    doc = json.loads(done.stdout)
    results = {r["call_id"]: r for r in doc["results"]}
    assert results["c1"]["status"] == "ok" and "t-7-v1" in results["c1"]["content"]
    assert results["c2"]["error"]["code"] == "INVALID_ARGUMENT"  # `row` is required by the published schema


def test_two_versions_of_a_tool_are_refused_and_shown(settings, start_worker, tmp_path) -> None:
    module, old = tools_module(tmp_path, "v1", "old")
    new = tmp_path / "new"
    new.mkdir()
    (new / f"{module}.py").write_text(ROW_TOOLS.replace("VERSION", "v2"))
    start_worker(python_path=[str(old)], tools=module, name="old")
    start_worker(python_path=[str(new)], tools=module, name="new")
    with Dispatcher(settings) as dispatcher:
        assert set(dispatcher.registry.conflicts) == {"fetch_row"}  # the other tools' code is the same
        [result] = dispatcher.run([ToolCall(id="c", name="fetch_row", arguments={"table": "t", "row": 1})],
                                  timeout_s=60)
    assert result.code == ErrorCode.TOOL_UNAVAILABLE, result.content
    assert "2 different versions" in result.content and "old0@" in result.content and "new1@" in result.content
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    shown = subprocess.run([sys.executable, "-m", "toolfleet", "tools", "--redis-url", settings.redis_url,
                            "--namespace", settings.namespace], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert "fetch_row: 2 different versions live" in shown.stdout, shown.stdout + shown.stderr


def test_an_explicit_registry_wins(settings, start_worker, tmp_path) -> None:
    module, folder = tools_module(tmp_path)
    start_worker(python_path=[str(folder)], tools=module)
    with Dispatcher(settings, Registry(default_registry())) as dispatcher:
        [result] = dispatcher.run([ToolCall(id="c", name="fetch_row", arguments={"table": "t", "row": 1})],
                                  timeout_s=60)
    assert result.code == ErrorCode.UNKNOWN_TOOL  # used as given: no catalog


def test_a_worker_started_after_the_dispatcher_is_found(settings, start_worker, tmp_path) -> None:
    module, folder = tools_module(tmp_path)
    with Dispatcher(settings) as dispatcher:
        assert "fetch_row" not in dispatcher.registry  # no worker yet
        start_worker(python_path=[str(folder)], tools=module)
        # an unknown name makes the registry read the catalog again
        [result] = dispatcher.run([ToolCall(id="c", name="fetch_row", arguments={"table": "t", "row": 2})],
                                  timeout_s=60)
    assert result.ok and result.data["value"] == "t-2-v1", result.content


def test_session_state_of_a_live_tool_from_the_catalog(settings, start_worker) -> None:
    """A tool with stored session state (examples.vfs) known to the dispatcher only from the catalog:
    the session opens with its published initial value or a given one, the state plans as a
    resource, and the calls see what the earlier ones saved."""
    start_worker(args=["--tools", "examples.vfs"])
    with Dispatcher(settings) as d:
        assert d.registry.sources["fs_cd"] == "live" and d.registry.get("fs_cd").state.name == "vfs"
        sid = d.open_session(state={"vfs": {"cwd": "/", "dirs": ["/", "/home"], "files": {}}})
        calls = [ToolCall(id="cd", name="fs_cd", arguments={"path": "home"}),
                 ToolCall(id="pwd", name="fs_pwd", arguments={})]
        results = d.submit(calls, session_id=sid).results(60)
        fresh = d.open_session()  # the published initial value
        [pwd] = d.submit([ToolCall(id="p", name="fs_pwd", arguments={})], session_id=fresh).results(60)
        # the README's example: an instance (a generator inside), dumped by its own class
        seeded = d.open_session(state={"vfs": VirtualFS(rng=random.Random(7))})
        rolls = d.submit([ToolCall(id=f"r{i}", name="fs_roll", arguments={"sides": 20}, index=i) for i in range(3)],
                         session_id=seeded).results(60)
        with pytest.raises(ToolfleetError, match=r"'vfs' does not match .* at \$\.cwd: 5 is not of type 'string'"):
            d.open_session(state={"vfs": {"cwd": 5, "dirs": "nope"}})
    assert [r.content for r in results] == ["/home", "/home"], results
    assert pwd.ok and pwd.content == "/", pwd.content
    local = VirtualFS(rng=random.Random(7))
    assert [r.content for r in rolls] == [str(local.roll(20)) for _ in range(3)], rolls


def catalog_only_vfs() -> tuple[SessionState, SessionState]:
    """(the real vfs state, the one a dispatcher builds from examples.vfs's published description)."""
    real = VFS_TOOLS[0].state
    published = json.loads(json.dumps(describe(VFS_TOOLS[0])))
    return real, spec_from_description(published).state


def test_a_catalog_state_is_checked_against_its_published_schema(settings) -> None:
    """An initial state given to a dispatcher that knows the state only from the catalog: an instance
    is stored as its own class dumps it (the worker loads the same generator); a JSON form that is
    not the type is refused at open naming the state and the path; a catalog without a schema (an
    older worker) still opens; an object without a JSON form is refused saying what to pass."""
    import redis

    from toolfleet.keys import Keys
    from toolfleet.tools.state import SessionStore

    real, catalog = catalog_only_vfs()
    assert catalog.type is object and catalog.json_schema["properties"]["cwd"]["type"] == "string"
    registry = Registry()
    registry.add(spec_from_description(json.loads(json.dumps(describe(VFS_TOOLS[0])))))
    store = SessionStore(redis.Redis.from_url(settings.redis_url), Keys(settings.namespace))
    sid = open_session(store, registry, state={"vfs": VirtualFS(cwd="/", rng=random.Random(7))})
    assert store.load(real, sid).value.rng.getstate() == random.Random(7).getstate()
    for bad, where in [({"cwd": 5, "dirs": "nope"}, r"\$\.cwd: 5 is not"), ({"files": {"/a": 1}}, r"\$\.files\./a"),
                       ([1], r"at \$: \[1\] is not of type 'object'")]:
        with pytest.raises(ToolfleetError, match=f"initial state 'vfs' does not match .*{where}"):
            open_session(store, registry, state={"vfs": bad})
    with pytest.raises(ToolfleetError, match="pass its JSON form, or give the Dispatcher the tools' registry"):
        open_session(store, registry, state={"vfs": random.Random(1)})
    old = Registry()  # a catalog from before state_schema: no check at open, as before
    description = {k: v for k, v in describe(VFS_TOOLS[0]).items() if k != "state_schema"}
    old.add(spec_from_description(json.loads(json.dumps(description))))
    assert open_session(store, old, state={"vfs": {"cwd": 5}})
    assert store.load(real, open_session(store, old, state={"vfs": VirtualFS(cwd="/x")})).value.cwd == "/x"


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                       max_size=3), max_leaves=6)
vfs_forms = st.fixed_dictionaries({}, optional={
    "cwd": st.text(max_size=3) | json_values,
    "dirs": st.lists(st.sampled_from(["/", "/a", "/b"]), max_size=4) | json_values,
    "files": st.dictionaries(st.sampled_from(["/a", "/b"]), st.text(max_size=3) | json_values, max_size=2)
    | json_values})


@given(vfs_forms)
@hsettings(max_examples=300, deadline=None)
def test_a_json_form_is_accepted_at_open_exactly_when_the_worker_could_load_it(form: dict) -> None:
    """Bad input: the catalog dispatcher's check at open agrees with the real type's validation
    (what the worker does on load), for any JSON value of the fields it can describe."""
    real, catalog = catalog_only_vfs()
    try:
        real.adapter.validate_python(form)
        valid = True
    except ValueError:
        valid = False
    try:
        initial_value("vfs", catalog, form)
        accepted = True
    except ToolfleetError as exc:
        assert "initial state 'vfs'" in str(exc) and "at $" in str(exc)
        accepted = False
    assert accepted == valid, form


def test_a_catalog_this_version_cannot_read_is_skipped_not_a_crash(settings) -> None:
    """Bad input: a worker (of another version, or anything writing the key) publishes tools this
    dispatcher cannot read; those are skipped, the readable ones taken."""
    import redis

    from toolfleet.keys import Keys
    from toolfleet.tools.published import catalog_registry

    keys, client = Keys(settings.namespace), redis.Redis.from_url(settings.redis_url)
    good = describe(default_registry().get("read_file")) | {"name": "read_file_copy", "version": "x1"}
    broken = [42, "text", {"name": 7}, {"name": "no_parameters"}, {"name": "bad name!", "parameters": {}},
              {"name": "bad_schema", "parameters": {"type": 12}}, {"name": "bad_sensitive", "parameters": {},
                                                                  "sensitive": 3}, good]
    client.set(keys.catalog("odd@host"), json.dumps({"worker": "odd@host", "tools": broken}), px=30_000)
    client.set(keys.catalog("older@host"), json.dumps({"worker": "older@host", "tools": "not a list"}), px=30_000)
    client.sadd(keys.workers, "odd@host", "older@host")
    registry = catalog_registry(settings)
    assert registry.sources["read_file_copy"] == "live"
    assert registry.get("read_file_copy").resources({"path": "a/b"}) == ["fs:a/b"]
    assert not {"no_parameters", "bad name!", "bad_schema", "bad_sensitive"} & set(registry.names())
    assert registry.conflicts == {}


def test_a_worker_serves_a_tools_module_given_as_a_file_path(settings, start_worker, tmp_path) -> None:
    """Newcomer trial: `toolfleet worker --tools ./my_tools.py` said "No module named
    '/tmp/.../my_tools'". A .py path is imported from its folder, by its stem."""
    module, folder = tools_module(tmp_path)
    start_worker(tools=str(folder / f"{module}.py"))
    with Dispatcher(settings) as dispatcher:  # from the catalog: this process never imports it
        [result] = dispatcher.run([ToolCall(id="c", name="fetch_row", arguments={"table": "t", "row": 3})],
                                  timeout_s=60)
    assert result.ok and result.data["value"] == "t-3-v1", result.content


def test_a_tool_whose_workers_all_stopped_is_unavailable_not_unknown(settings, start_worker, tmp_path) -> None:
    """Newcomer trial: a custom tool whose only worker was stopped got ``UNKNOWN_TOOL`` ("there is no
    tool named ...") in a new dispatcher, which tells the model the tool does not exist; the result
    contract says ``TOOL_UNAVAILABLE`` (no live worker serves it). Workers record the tools they
    serve (``<ns>:tools:seen``); a name no worker ever served stays ``UNKNOWN_TOOL``."""
    module, folder = tools_module(tmp_path)
    worker = start_worker(tools=str(folder / f"{module}.py"))
    fetch = ToolCall(id="c", name="fetch_row", arguments={"table": "t", "row": 3})
    with Dispatcher(settings) as dispatcher:
        assert dispatcher.run([fetch], timeout_s=60)[0].ok
    worker.stop()  # warm shutdown: its catalog goes at once
    with Dispatcher(settings) as dispatcher:  # a new process would start like this: it never saw it live
        assert dispatcher.registry.sources["fetch_row"] == "seen"
        unavailable, unknown = dispatcher.run([fetch, ToolCall(id="u", name="fetch_rows", arguments={})],
                                              timeout_s=60)
    assert unavailable.code is ErrorCode.TOOL_UNAVAILABLE and "no live worker serves" in unavailable.content, \
        unavailable.content
    assert unknown.code is ErrorCode.UNKNOWN_TOOL, unknown.content


def test_junk_in_the_seen_tools_or_a_catalog_never_breaks_a_dispatcher(settings) -> None:
    """A breaker's find: one bad field in ``<ns>:tools:seen`` (kept 7 days) made every new
    ``Dispatcher(settings)`` raise (RecursionError on deep JSON) or its calls crash (a text or NaN
    time limit). Each unreadable record is skipped; a record older than the TTL is not read, though
    the hash's own TTL is renewed by every worker start (a retired tool is forgotten)."""
    import time as clock

    import redis

    from toolfleet.keys import Keys
    from toolfleet.worker.catalog import TOOLS_SEEN_TTL_S

    keys, client = Keys(settings.namespace), redis.Redis.from_url(settings.redis_url)
    good = describe(default_registry().get("read_file")) | {"name": "seen_good", "version": "s1"}

    def record(tool: object, at: float | None = None) -> str:
        return json.dumps({"tool": tool, "worker": "w@h", "at": clock.time() if at is None else at})

    client.hset(keys.tools_seen, mapping={
        "deep": "[" * 100_000 + "]" * 100_000,
        "text_limit": record(good | {"name": "text_limit", "timeout_s": "abc"}),
        "nan_limit": record(good | {"name": "nan_limit"}).replace('"timeout_s": 30', '"timeout_s": NaN'),
        "huge_limit": record(good | {"name": "huge_limit", "timeout_s": 1e308}),
        "list_queue": record(good | {"name": "list_queue", "queue": ["a"]}),
        "not_json": "{", "not_object": "[1]", "retired": record(good | {"name": "retired"}, at=1.0),
        "seen_good": record(good),
    })
    client.set(keys.catalog("junk@host"), "[" * 100_000, px=30_000)
    client.sadd(keys.workers, "junk@host")
    assert client.ttl(keys.tools_seen) == -1 or client.ttl(keys.tools_seen) <= TOOLS_SEEN_TTL_S
    with Dispatcher(settings) as dispatcher:
        names = set(dispatcher.registry.names())
        assert "seen_good" in names and dispatcher.registry.sources["seen_good"] == "seen"
        assert not names & {"deep", "text_limit", "nan_limit", "huge_limit", "list_queue", "retired"}
        assert dispatcher.tools()  # listing them raises nothing either


def test_a_tools_module_that_is_not_there_says_how_to_name_one(tmp_path) -> None:
    from toolfleet.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="PYTHONPATH"):
        default_registry(["no_such_tools_module_x1"])
    with pytest.raises(ConfigurationError, match="no such file") as missing:  # was "not a .py file", said twice
        default_registry([str(tmp_path / "missing.py")])
    assert str(missing.value).count("cannot import") == 1
    with pytest.raises(ConfigurationError, match="is not a .py file"):
        default_registry([str(tmp_path)])
    broken = tmp_path / "needs_pkg.py"
    broken.write_text("import no_such_package_y2\n")
    with pytest.raises(ConfigurationError, match="no_such_package_y2"):  # the module's own import, named
        default_registry([str(broken)])


def test_an_initial_state_naming_a_field_its_type_lacks_is_refused() -> None:
    """A newcomer's ``toolfleet sessions --open s --state 'counter={"m": 7}'`` printed "opened":
    pydantic ignores unknown fields, so a misspelt one was dropped without a word. Refused now,
    with the type (the tools imported) and from the catalog's schema; a type that takes other
    fields (``extra="allow"``) decides itself."""
    from pydantic import BaseModel, ConfigDict

    class Counter(BaseModel):
        count: int = 0

    class Loose(BaseModel):
        model_config = ConfigDict(extra="allow")
        count: int = 0

    real = SessionState("counter", Counter)
    catalog = SessionState("counter", object, json_schema=real.adapter.json_schema())
    for decl in (real, catalog):
        with pytest.raises(ToolfleetError, match=r"initial state 'counter' has no field m; its fields: count"):
            initial_value("counter", decl, {"m": 7})
        assert initial_value("counter", decl, {"count": 3}) in (Counter(count=3), {"count": 3})
    loose = SessionState("loose", Loose)
    assert initial_value("loose", loose, {"m": 7}).model_extra == {"m": 7}
    loose_catalog = SessionState("loose", object, json_schema=loose.adapter.json_schema())
    assert initial_value("loose", loose_catalog, {"m": 7}) == {"m": 7}
