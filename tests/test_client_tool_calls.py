"""OpenAI Responses built-in tool items the client executes (``local_shell_call``, ``shell_call``,
``apply_patch_call``, client ``tool_search_call``, ``computer_call``) are calls: each gets exactly
one answer, in its own shape, in model order, paired by ``call_id`` (the API refuses the next
request otherwise). Shell items run as ``run_command`` on a real worker, through the normal path.
Found by a helper: the adapter skipped every one of them (no call, no answer)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet import Dispatcher, ErrorCode
from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.adapters.client_tools import client_results
from toolfleet.dispatcher.history import repair_history
from toolfleet.errors import BatchRejected
from toolfleet.models import ToolResult
from toolfleet.tools.registry import Registry

from . import input_strategies as s
from .conftest import make_registry
from .sdk_types import check_messages


def local_shell(call_id: str, command, **action) -> dict:
    return {"type": "local_shell_call", "id": f"lsh_{call_id}", "call_id": call_id, "status": "completed",
            "action": {"type": "exec", "command": command, "env": {}, **action}}


def shell(call_id: str, commands, **action) -> dict:
    return {"type": "shell_call", "id": f"sh_{call_id}", "call_id": call_id, "status": "completed",
            "action": {"commands": commands, **action}}


def function(call_id: str, name: str, arguments: str) -> dict:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name, "arguments": arguments}


PATCH = {"type": "apply_patch_call", "id": "apc_1", "call_id": "patch", "status": "completed",
         "operation": {"type": "create_file", "path": "new.txt", "diff": "+hello\n"}}
SEARCH = {"type": "tool_search_call", "id": "tsc_1", "call_id": "search", "status": "completed",
          "execution": "client", "arguments": {"query": "calendar"}}
SERVER_SEARCH = [{"type": "tool_search_call", "id": "tsc_2", "call_id": None, "status": "completed",
                  "execution": "server", "arguments": {"query": "x"}},
                 {"type": "tool_search_output", "id": "tso_2", "call_id": None, "status": "completed",
                  "execution": "server", "tools": []}]
COMPUTER = {"type": "computer_call", "id": "cu_1", "call_id": "screen", "status": "completed",
            "pending_safety_checks": [], "actions": [{"type": "screenshot"}]}


def response(*items) -> dict:
    return {"id": "resp_1", "object": "response", "status": "completed", "output": list(items)}


def run(dispatcher, workspace, payload):
    turn = dispatcher.submit_response(payload, workspace=str(workspace))
    results = turn.results(timeout_s=60)
    return turn, {r.call_id: r for r in results}, turn.messages()


def sdk_accepts(assistant, messages) -> None:
    """What goes back validates against openai-python's input item types, except the
    ``local_shell_call_output`` (sent with ``call_id`` as the guide and the Agents SDK do; the
    generated type names the field ``id``, docs/providers.md)."""
    check_messages("openai_responses", [m for m in assistant + messages if m["type"] != "local_shell_call_output"])


def test_a_local_shell_call_runs_as_run_command_and_is_answered_by_call_id(worker, dispatcher, workspace):
    (workspace / "sub").mkdir()
    item = local_shell("c1", ["bash", "-c", 'echo "$GREETING from $(basename "$PWD")"'],
                       env={"GREETING": "hello there"}, working_directory="sub", timeout_ms=20000)
    turn, by_id, messages = run(dispatcher, workspace, response(item))
    result = by_id["c1"]
    assert result.ok and result.name == "run_command" and result.attempts == 1, result
    assert "hello there from sub" in result.content
    assert messages == [{"type": "local_shell_call_output", "call_id": "c1", "output": result.content}]
    assert turn.assistant_messages() == [item]  # goes back as it came, not rewritten as a function_call


def test_a_shell_call_is_answered_with_stdout_stderr_and_its_outcome(worker, dispatcher, workspace):
    payload = response(shell("ok", ["echo one", "echo two >&2"]),
                       shell("fails", ["echo before", "exit 3"], max_output_length=4),
                       shell("slow", ["sleep 20"], timeout_ms=300))
    turn, by_id, messages = run(dispatcher, workspace, payload)
    assert [m["call_id"] for m in messages] == ["ok", "fails", "slow"]
    ok, fails, slow = messages
    [entry] = ok["output"]
    assert entry["outcome"] == {"type": "exit", "exit_code": 0}
    assert "one" in entry["stdout"] and "two" in entry["stdout"]  # run_command prints both as one stream
    assert fails["max_output_length"] == 4  # passed back, as the guide asks
    [entry] = fails["output"]
    assert entry["outcome"] == {"type": "exit", "exit_code": 3}
    assert len(entry["stdout"]) + len(entry["stderr"]) <= 4 and entry["stdout"] == "befo"
    assert by_id["slow"].code is ErrorCode.TIMEOUT and slow["output"][0]["outcome"] == {"type": "timeout"}
    assert "TIMEOUT" in slow["output"][0]["stderr"]
    sdk_accepts(turn.assistant_messages(), messages)


def test_apply_patch_and_client_tool_search_are_answered_without_running(worker, dispatcher, workspace):
    turn, by_id, messages = run(dispatcher, workspace, response(PATCH, *SERVER_SEARCH, SEARCH))
    assert by_id["patch"].code is ErrorCode.UNKNOWN_TOOL and by_id["patch"].attempts == 0
    assert by_id["search"].ok and by_id["search"].attempts == 0
    assert set(by_id) == {"patch", "search"}  # the server's tool search is no call
    assert messages == [
        {"type": "apply_patch_call_output", "call_id": "patch", "status": "failed", "output": by_id["patch"].content},
        {"type": "tool_search_output", "call_id": "search", "execution": "client", "status": "completed",
         "tools": []}]
    assert not (workspace / "new.txt").exists()
    sdk_accepts(turn.assistant_messages(), messages)


def test_a_mixed_batch_comes_back_in_model_order_paired_by_call_id(worker, dispatcher, workspace):
    items = [function("f1", "list_dir", '{"path": "."}'),
             local_shell("l1", ["cat", "README.md"]),
             {"type": "custom_tool_call", "id": "ctc_1", "call_id": "k1", "name": "grammar", "input": "x"},
             shell("s1", ["ls docs"]),
             PATCH, SEARCH,
             function("f2", "write_file", '{"path": "made.txt", "content": "x"}'),
             local_shell("already", ["true"]),
             {"type": "local_shell_call_output", "call_id": "already", "output": "done"}]  # answered: not a call
    turn, by_id, messages = run(dispatcher, workspace, response(*items))
    assert [(m["type"], m["call_id"]) for m in messages] == [
        ("function_call_output", "f1"), ("local_shell_call_output", "l1"), ("custom_tool_call_output", "k1"),
        ("shell_call_output", "s1"), ("apply_patch_call_output", "patch"), ("tool_search_output", "search"),
        ("function_call_output", "f2")]
    assert by_id["f1"].ok and by_id["l1"].ok and by_id["s1"].ok and by_id["f2"].ok
    assert "runbook.md" in messages[3]["output"][0]["stdout"]
    sdk_accepts(turn.assistant_messages(), messages)
    assert repair_history(turn.assistant_messages() + messages, "openai_responses").repairs == []


def test_without_a_shell_tool_each_shell_item_gets_unknown_tool_in_its_own_shape(settings, workspace):
    registry = Registry([spec for spec in make_registry() if spec.name != "run_command"])
    with Dispatcher(settings, registry) as dispatcher:
        turn = dispatcher.submit_response(response(local_shell("l1", ["ls"]), shell("s1", ["ls"])),
                                          workspace=str(workspace))
        results = turn.results(timeout_s=30)
        messages = turn.messages()
    assert [r.code for r in results] == [ErrorCode.UNKNOWN_TOOL] * 2 and all(r.attempts == 0 for r in results)
    assert "shell tool" in results[0].content
    assert messages[0] == {"type": "local_shell_call_output", "call_id": "l1", "output": results[0].content}
    assert messages[1]["type"] == "shell_call_output"
    assert messages[1]["output"][0]["outcome"] == {"type": "exit", "exit_code": 1}
    assert "UNKNOWN_TOOL" in messages[1]["output"][0]["stderr"]


def test_malformed_items_become_their_own_error_results_and_the_rest_runs(worker, dispatcher, workspace):
    items = [local_shell("str", "ls -la"),  # command not an argv array
             local_shell("env", ["ls"], env={"BAD NAME": "x"}),
             local_shell("user", ["ls"], user="root"),
             local_shell("time", ["ls"], timeout_ms="soon"),
             {"type": "local_shell_call", "id": "lsh_x", "call_id": "noaction", "status": "completed"},
             shell("cmds", "ls"),
             shell("limit", ["ls"], max_output_length=-1),
             {"type": "apply_patch_call", "call_id": "nop", "status": "completed"},  # no operation: still answered
             function("good", "list_dir", '{"path": "."}')]
    turn, by_id, messages = run(dispatcher, workspace, response(*items))
    bad = ["str", "env", "user", "time", "noaction", "cmds", "limit"]
    assert all(by_id[c].code is ErrorCode.INVALID_ARGUMENT and by_id[c].attempts == 0 for c in bad), by_id
    assert by_id["nop"].code is ErrorCode.UNKNOWN_TOOL and by_id["good"].ok
    assert [m["call_id"] for m in messages] == [i["call_id"] for i in items]
    assert "action.user" in by_id["user"].content and "action.timeout_ms" in by_id["time"].content


def test_a_client_item_without_a_call_id_refuses_the_batch_as_a_function_call_does(dispatcher):
    item = local_shell("x", ["ls"])
    del item["call_id"]
    with pytest.raises(BatchRejected) as refused:
        dispatcher.submit_response(response(item))
    assert refused.value.reason == "missing_call_id"
    with pytest.raises(BatchRejected) as refused:
        get_adapter("openai_responses").parse(response({**item, "call_id": 7}))
    assert refused.value.reason == "unreadable_payload" and refused.value.pointer == "/output/0/call_id"


def test_a_bare_list_of_client_items_is_told_as_responses():
    from toolfleet.dispatcher.adapters import detect

    assert detect([shell("s1", ["ls"])]).name == "openai_responses"
    assert [c.id for c in detect([local_shell("l1", ["ls"]), PATCH]).parse([local_shell("l1", ["ls"]), PATCH])] == [
        "l1", "patch"]


def test_a_computer_call_refuses_the_batch_before_anything_runs(worker, dispatcher, workspace):
    write = function("w", "write_file", '{"path": "never.txt", "content": "x"}')
    with pytest.raises(BatchRejected) as refused:
        dispatcher.submit_response(response(write, COMPUTER), workspace=str(workspace))
    assert refused.value.reason == "unanswerable_call" and refused.value.call_ids == ("screen",)
    assert refused.value.pointer == "/output/1"
    assert not (workspace / "never.txt").exists()


def stream_events(items: list[dict], streamed_commands: bool = True) -> list[dict]:
    """A Responses stream announcing each item (added, then done), as the API sends them."""
    events = [{"type": "response.created", "response": {"id": "resp_1", "object": "response",
                                                        "status": "in_progress", "output": []}}]
    for n, item in enumerate(items):
        added = dict(item)
        if item["type"] == "shell_call" and streamed_commands:
            added["action"] = {**item["action"], "commands": []}  # its commands stream in before done
            added["status"] = "in_progress"
        if item["type"] == "function_call":
            added["arguments"] = ""
        events.append({"type": "response.output_item.added", "output_index": n, "item": added})
        if item["type"] == "function_call":
            events.append({"type": "response.function_call_arguments.done", "output_index": n,
                           "item_id": item["id"], "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed", "response": response(*items)})
    return events


def test_streamed_client_items_are_answered_as_the_whole_response_is(worker, dispatcher, workspace):
    items = [function("f1", "list_dir", '{"path": "."}'), shell("s1", ["echo streamed"]),
             local_shell("l1", ["echo", "local"]), *SERVER_SEARCH, SEARCH, PATCH]
    turn, by_id, messages = run(dispatcher, workspace, stream_events(items))
    assert [(m["type"], m["call_id"]) for m in messages] == [
        ("function_call_output", "f1"), ("shell_call_output", "s1"), ("local_shell_call_output", "l1"),
        ("tool_search_output", "search"), ("apply_patch_call_output", "patch")]
    assert "streamed" in messages[1]["output"][0]["stdout"] and "local" in messages[2]["output"]
    assistant = turn.assistant_messages()
    assert [i["type"] for i in assistant] == [i["type"] for i in items]  # not rewritten as function calls
    sdk_accepts(assistant, messages)


def test_a_shell_item_the_token_limit_cut_off_does_not_run(worker, dispatcher, workspace):
    """A command cut short by max_output_tokens must not run (docs/guarantees.md I4), whole or streamed."""
    item = {**local_shell("cut", ["touch", "cut.txt"]), "status": "incomplete"}
    cut_response = {**response(item), "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    for payload in (cut_response, stream_events([item])):
        turn, by_id, messages = run(dispatcher, workspace, payload)
        assert by_id["cut"].code is ErrorCode.INVALID_ARGUMENT and "cut off" in by_id["cut"].content
        assert messages == [{"type": "local_shell_call_output", "call_id": "cut", "output": by_id["cut"].content}]
    still_open = {**shell("open", ["touch open.txt"]), "status": "in_progress"}
    open_at_end = [e for e in stream_events([still_open])
                   if e["type"] not in ("response.output_item.done", "response.completed")]
    open_at_end.append({"type": "response.incomplete", "response": {
        **response(still_open), "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}})
    turn, by_id, messages = run(dispatcher, workspace, open_at_end)
    assert by_id["open"].code is ErrorCode.INVALID_ARGUMENT and messages[0]["type"] == "shell_call_output"
    assert not (workspace / "cut.txt").exists() and not (workspace / "open.txt").exists()


def test_client_items_only_in_the_terminal_response_are_calls_too(worker, dispatcher, workspace):
    events = [{"type": "response.created", "response": {"id": "r", "object": "response", "output": []}},
              {"type": "response.completed", "response": response(shell("s1", ["echo late"]), PATCH)}]
    turn, by_id, messages = run(dispatcher, workspace, events)
    assert [(m["type"], m["call_id"]) for m in messages] == [("shell_call_output", "s1"),
                                                             ("apply_patch_call_output", "patch")]
    assert by_id["s1"].ok and "late" in by_id["s1"].content


def test_a_streamed_computer_call_ends_the_turn_and_is_refused(worker, dispatcher, workspace):
    slow = function("w", "run_command", '{"command": "sleep 5; touch never.txt"}')
    events = stream_events([slow, COMPUTER])
    stream = dispatcher.open_stream(workspace=str(workspace))
    with pytest.raises(BatchRejected) as refused:
        for event in events:
            stream.feed(event)
    assert refused.value.reason == "unanswerable_call" and refused.value.call_ids == ("screen",)
    [result] = stream.turn.results(timeout_s=30)  # the call taken before it was stopped or never started
    assert result.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
    assert not (workspace / "never.txt").exists()


def test_repair_history_adds_each_missing_answer_in_its_own_shape():
    history = [local_shell("l1", ["ls"]), shell("s1", ["ls"]), PATCH, SEARCH, *SERVER_SEARCH, COMPUTER,
               {"type": "shell_call_output", "call_id": "gone", "output": []}]
    repaired = repair_history(history, "openai_responses")
    assert [(r.kind, r.call_id) for r in repaired.repairs] == [
        ("missing_result", "l1"), ("missing_result", "s1"), ("missing_result", "patch"),
        ("missing_result", "search"), ("orphan_result", "gone")]
    added = [m for m in repaired.messages if m not in history]
    assert [(m["type"], m["call_id"]) for m in added] == [
        ("local_shell_call_output", "l1"), ("shell_call_output", "s1"), ("apply_patch_call_output", "patch"),
        ("tool_search_output", "search")]
    assert "ABORTED" in added[0]["output"] and added[2]["status"] == "failed" and added[3]["tools"] == []
    assert SERVER_SEARCH[1] in repaired.messages and COMPUTER in repaired.messages  # left as they are
    check_messages("openai_responses", [m for m in repaired.messages if m["type"] != "local_shell_call_output"])
    # an answer already there, under the generated type's ``id``, pairs too
    answered = repair_history([local_shell("l1", ["ls"]), {"type": "local_shell_call_output", "id": "l1",
                                                            "output": "x"}], "openai_responses")
    assert answered.repairs == []


# ---- property: any mix of such items gives exactly one answer per call id (tests/test_inputs_properties.py style)

KINDS = ["function_call", "custom_tool_call", "local_shell_call", "shell_call", "apply_patch_call",
         "tool_search_call", "computer_call", "message"]
ANSWER_OF = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
             "local_shell_call": "local_shell_call_output", "shell_call": "shell_call_output",
             "apply_patch_call": "apply_patch_call_output", "tool_search_call": "tool_search_output"}


@st.composite
def client_batches(draw) -> tuple[list[dict], list[str], list[str]]:
    """Output items of every kind, some fields garbled, some calls run by the server (hosted shell,
    server tool search) or already answered in the same output; returns the items, the call ids
    that must be answered, in order, and the call ids answered in the output."""
    items, expected, answered = [], [], []
    for n in range(draw(st.integers(0, 7))):
        kind_, call_id = draw(st.sampled_from(KINDS)), f"c{n}"
        garbled = s.GARBAGE if draw(st.booleans()) else st.nothing()
        if kind_ == "message":
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]})
            continue
        if kind_ == "function_call":
            item = function(call_id, draw(s.NAMES), "{}")
        elif kind_ == "custom_tool_call":
            item = {"type": kind_, "call_id": call_id, "name": "grammar", "input": draw(s.TEXT)}
        elif kind_ == "local_shell_call":
            item = local_shell(call_id, draw(st.lists(s.ANY_TEXT, max_size=3) | garbled),
                               **draw(st.dictionaries(st.sampled_from(["env", "timeout_ms", "working_directory",
                                                                       "user", "type"]), s.GARBAGE, max_size=2)))
        elif kind_ == "shell_call":
            item = shell(call_id, draw(st.lists(s.ANY_TEXT, max_size=3) | garbled),
                         **draw(st.dictionaries(st.sampled_from(["timeout_ms", "max_output_length"]), s.GARBAGE,
                                                max_size=2)))
            if draw(st.booleans()):
                item["action"] = draw(s.GARBAGE)
            if draw(st.booleans()):
                item["environment"] = draw(st.sampled_from([{"type": "local"}, None,
                                                            {"type": "container_reference", "container_id": "x"}]))
        elif kind_ == "apply_patch_call":
            item = {**PATCH, "call_id": call_id, "operation": draw(s.GARBAGE)}
        elif kind_ == "tool_search_call":
            item = {**SEARCH, "call_id": call_id, "execution": draw(st.sampled_from(["client", "server", None])),
                    "arguments": draw(s.GARBAGE)}
        else:
            item = {**COMPUTER, "call_id": call_id}
        items.append(item)
        if item.get("execution") == "server" or (isinstance(item.get("environment"), dict)
                                                 and item["environment"]["type"] != "local"):
            continue  # the server ran it: no call
        expected.append(call_id)
        if kind_ not in ("function_call", "custom_tool_call") and draw(st.booleans()):
            items.append({"type": ANSWER_OF.get(kind_, "computer_call_output"), "call_id": call_id,
                          "output": "ran elsewhere"})  # already answered in the output: no call either
            answered.append(call_id)
    return items, expected, answered


def fabricated(calls, failed) -> list:
    """Each call's result: the one the dispatcher decided (``failed``), else ok, an exit status, a timeout."""
    made = []
    for n, call in enumerate(calls):
        made.append(failed.get(call.id) or [
            ToolResult(call_id=call.id, name=call.name, status="ok", content="done"),
            ToolResult.failure(call.id, call.name, ErrorCode.EXECUTION_ERROR, "command exited with status 2: x",
                               "read it", output="printed"),
            ToolResult.failure(call.id, call.name, ErrorCode.TIMEOUT, "ran past its time limit", "raise it")][n % 3])
    return made


@settings(max_examples=int(400 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=client_batches())
def test_any_mix_of_client_items_gives_exactly_one_answer_per_call_id(batch):
    """Whole: every call not run by the server nor answered in the output is answered once, in model
    order, in its kind's shape. Streamed (the answers left out: a stream takes a call when its item
    is whole and does not wait for the rest): the same for every call not run by the server. A
    ``computer_call`` among the calls refuses the batch."""
    items, expected, answered = batch
    kinds = {i["call_id"]: i["type"] for i in items if i.get("type") in (*ANSWER_OF, "computer_call")}
    unanswered = [c for c in expected if c not in answered]
    streamed = [i for i in items if i.get("type") not in (*ANSWER_OF.values(), "computer_call_output")]
    adapter, stream_adapter = get_adapter("openai_responses"), get_adapter("openai_responses_stream")
    for adapter_, source, ids in ((adapter, response(*items), unanswered),
                                  (stream_adapter, stream_events(streamed, streamed_commands=False), expected)):
        if any(kinds[c] == "computer_call" for c in ids):
            with pytest.raises(BatchRejected) as refused:
                adapter_.parse(source)
            assert refused.value.reason == "unanswerable_call"
            continue
        calls = adapter_.parse(source)
        assert [c.id for c in calls] == ids
        if adapter_.streamed:
            parser = adapter_.replay(source)
            client, payload = parser.client, parser.response()
        else:
            client, payload = adapter_.client_calls(source), source
        messages = adapter_.format_results(fabricated(calls, client_results(calls, client, lambda name: True)),
                                           response=payload)
        assert [m["call_id"] for m in messages] == ids  # one each, model order, paired by id
        assert [m["type"] for m in messages] == [ANSWER_OF[kinds[c]] for c in ids]
        check_messages("openai_responses", [m for m in messages if m["type"] != "local_shell_call_output"])
        assert all(isinstance(m["output"], str) for m in messages if m["type"] == "local_shell_call_output")
        history = adapter_.assistant_messages(payload) + messages
        assert [r.kind for r in repair_history(history, "openai_responses").repairs] == []


@settings(max_examples=int(300 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(items=st.lists(st.fixed_dictionaries({"type": st.sampled_from([*ANSWER_OF, *ANSWER_OF.values()]) | s.GARBAGE},
                                            optional={k: s.GARBAGE for k in ("call_id", "id", "action", "operation",
                                                                              "arguments", "execution", "environment",
                                                                              "status", "output")}), max_size=4))
def test_garbled_client_items_give_answers_or_batch_rejected_never_a_crash(items):
    for adapter, source in ((get_adapter("openai_responses"), response(*items)),
                            (get_adapter("openai_responses_stream"), stream_events([], False)[:1] + [
                                {"type": "response.output_item.done", "output_index": n, "item": i}
                                for n, i in enumerate(items)] + [{"type": "response.completed",
                                                                   "response": response(*items)}])):
        try:
            calls = adapter.parse(source)
            payload = adapter.replay(source).response() if adapter.streamed else source
            client = adapter.client_calls(payload)
            messages = adapter.format_results(fabricated(calls, client_results(calls, client, lambda name: True)),
                                              response=payload)
            repair_history(adapter.assistant_messages(payload) + messages, "openai_responses")
        except BatchRejected:
            continue
        assert [m["call_id"] for m in messages] == [c.id for c in calls]
