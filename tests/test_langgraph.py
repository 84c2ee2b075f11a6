"""LangGraph with the real library, no network: a ``StateGraph`` driven by a scripted chat model from
langchain-core's fake models, its tool calls run by :class:`FleetToolNode` on real prefork workers
(plan rule, model order, approval interrupts resumed by call id, nothing re-run on resume)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest
import redis

pytest.importorskip("langgraph")

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import tools_condition  # noqa: E402
from langgraph.types import Command  # noqa: E402

from toolfleet import Dispatcher, Policy, ToolCall  # noqa: E402
from toolfleet.audit import AuditLog  # noqa: E402
from toolfleet.integrations.langgraph import FleetToolNode  # noqa: E402
from toolfleet.keys import Keys  # noqa: E402

from .conftest import ROOT, make_registry  # noqa: E402
from .faults import freeze, thaw, wait_started, wait_until  # noqa: E402

WAIT_S = 60
POLICY_TOML = '[tools]\nappend_line = "ask"\n'


class ScriptedChatModel(FakeMessagesListChatModel):
    """The fake model plus ``bind_tools`` as chat models implement it (OpenAI-format tools bound
    as the ``tools`` keyword of every request)."""

    def bind_tools(self, tools, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def tc(cid: str, name: str, **args) -> dict:
    return {"name": name, "args": args, "id": cid, "type": "tool_call"}


def build(node: FleetToolNode, responses: list[AIMessage], saver: InMemorySaver | None = None):
    """The agent loop around ``node``, compiled with ``saver`` (a checkpointer shared by the graphs
    of "several processes"; a fresh one by default), and its scripted model."""
    model = ScriptedChatModel(responses=responses).bind_tools(node.tools)
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver() if saver is None else saver), model


def audit(settings, turn_id: str):
    return AuditLog(redis.Redis.from_url(settings.redis_url), Keys(settings.namespace), 60).read(turn_id)


def starts(settings, *turn_ids: str) -> dict[str, list[int]]:
    """call id -> when each execution of it started (Redis's clock, ms), from the audit trails.
    (A read may start twice if the watchdog judged its worker gone under load: a read runs again.)"""
    out: dict[str, list[int]] = {}
    for turn_id in turn_ids:
        for event in audit(settings, turn_id):
            if event.type == "started":
                out.setdefault(event.call_id, []).append(event.at_ms)
    return out


def redis_now_ms(settings) -> int:
    seconds, micros = redis.Redis.from_url(settings.redis_url).time()
    return seconds * 1000 + micros // 1000


@pytest.fixture
def fleet(settings, start_worker, tmp_path):
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(POLICY_TOML)
    start_worker(concurrency=2, args=["--policy", str(policy_file)])
    with Dispatcher(settings, make_registry(), Policy.load(policy_file)) as dispatcher:
        yield dispatcher


def test_two_model_turns_parallel_reads_a_write_pair_and_an_approval_resumed_by_call_id(fleet, settings, workspace):
    node = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    first = AIMessage(content="", id="ai-1", tool_calls=[
        tc("r1", "wait_read", label="a", seconds=1.0),
        tc("r2", "wait_read", label="b", seconds=1.0),
        tc("w1", "write_file", path="notes/x.md", content="one"),
        tc("w2", "write_file", path="notes/x.md", content="two"),  # conflicts with w1: runs after it
        tc("r3", "read_file", path="notes/x.md"),  # after w2 in the plan: reads "two"
    ], invalid_tool_calls=[{"name": "read_file", "args": "{not json", "id": "bad", "error": "unparsable"}])
    second = AIMessage(content="", id="ai-2", tool_calls=[
        tc("a1", "append_line", path="log.txt", line="approved line"),
        tc("rd", "read_file", path="README.md"),
        tc("a2", "append_line", path="log.txt", line="denied line"),
    ])
    app, model = build(node, [first, second, AIMessage(content="all done", id="ai-3")])
    assert {t["function"]["name"] for t in model.kwargs["tools"]} == set(make_registry().names())
    config = {"configurable": {"thread_id": "thread-1"}}

    out = app.invoke({"messages": [HumanMessage("go")]}, config)
    asked = out["__interrupt__"][0].value
    assert [p["call_id"] for p in asked["pending"]] == ["a1", "a2"]
    assert app.get_state(config).next == ("tools",)
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_messages] == ["r1", "r2", "w1", "w2", "r3", "bad"]  # model order
    assert [m.status for m in tool_messages] == ["success"] * 5 + ["error"]
    assert tool_messages[5].artifact["error"]["code"] == "INVALID_ARGUMENT"
    assert "two" in tool_messages[4].content
    assert (workspace / "notes" / "x.md").read_text() == "two"

    # the plan: r1 and r2 wait for nothing and ran at the same time; w2 after w1; r3 after w2
    first_turn = tool_messages[0].artifact["turn_id"]
    events = audit(settings, first_turn)
    deps = next(e for e in events if e.type == "planned").data["deps"]
    assert deps["r1"] == [] and deps["r2"] == [] and deps["w2"] == ["w1"] and "w2" in deps["r3"]
    began = starts(settings, first_turn)
    ended = {e.call_id: e.at_ms for e in events if e.type == "finished"}
    assert min(began["r2"]) < ended["r1"] and min(began["r1"]) < ended["r2"]  # the two reads overlapped

    # the held calls: nothing ran; rd (not held) has its result inside the turn already
    assert not (workspace / "log.txt").exists()
    resumed_ms = redis_now_ms(settings)
    out = app.invoke(Command(resume={"a1": "approve", "a2": {"decision": "deny", "reason": "not this one"}}), config)
    assert out["messages"][-1].content == "all done"
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)][6:]
    assert [m.tool_call_id for m in tool_messages] == ["a1", "rd", "a2"]
    assert [m.status for m in tool_messages] == ["success", "success", "error"]
    assert tool_messages[2].artifact["error"]["code"] == "PERMISSION_DENIED"
    assert "not this one" in tool_messages[2].content
    assert (workspace / "log.txt").read_text() == "approved line\n"

    # the resumed node re-ran from its start, and no call ran twice
    second_turn = tool_messages[0].artifact["turn_id"]
    assert second_turn == asked["turn_id"]
    began = starts(settings, first_turn, second_turn)
    assert set(began) == {"r1", "r2", "w1", "w2", "r3", "rd", "a1"}  # a2 denied, bad invalid: never started
    assert [cid for cid, times in began.items() if max(times) >= resumed_ms] == ["a1"]  # only a1 after the resume


def test_a_partial_answer_asks_again_for_the_rest_and_async_graphs_work(fleet, settings, workspace):
    node = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    held = AIMessage(content="", id="ai-1", tool_calls=[
        tc("p1", "append_line", path="log.txt", line="one"),
        tc("p2", "append_line", path="log.txt", line="two"),
    ])
    app, _ = build(node, [held, AIMessage(content="done", id="ai-2")])
    config = {"configurable": {"thread_id": "thread-2"}}

    async def main():
        out = await app.ainvoke({"messages": [HumanMessage("go")]}, config)
        assert [p["call_id"] for p in out["__interrupt__"][0].value["pending"]] == ["p1", "p2"]
        out = await app.ainvoke(Command(resume={"p1": True}), config)  # p2 not answered: asked again
        assert [p["call_id"] for p in out["__interrupt__"][0].value["pending"]] == ["p2"]
        return await app.ainvoke(Command(resume="maybe"), config)  # not understood: denied (fail closed)

    out = asyncio.run(main())
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in tool_messages] == [("p1", "success"), ("p2", "error")]
    assert "not understood" in tool_messages[1].content
    assert (workspace / "log.txt").read_text() == "one\n"
    assert set(starts(settings, tool_messages[0].artifact["turn_id"])) == {"p1"}


def test_a_replayed_node_returns_the_recorded_results_without_running_anything(fleet, settings, workspace):
    node = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    state = {"messages": [AIMessage(content="", id="ai-1", tool_calls=[
        tc("x1", "write_file", path="once.txt", content="1")])]}
    config = {"configurable": {"thread_id": "thread-3"}}
    first = node.invoke(state, config)["messages"]
    replayed_ms = redis_now_ms(settings)
    again = FleetToolNode(fleet, workspace=str(workspace)).invoke(state, config)["messages"]  # another node object
    assert [m.content for m in again] == [m.content for m in first]
    assert again[0].artifact["turn_id"] == first[0].artifact["turn_id"]
    assert max(starts(settings, first[0].artifact["turn_id"])["x1"]) < replayed_ms


def test_cancelling_an_async_graph_run_cancels_the_turn(fleet, settings, workspace):
    node = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    long = AIMessage(content="", id="ai-1", tool_calls=[
        tc("n1", "count_until_cancelled", seconds=30), tc("n2", "wait_write", label="k", seconds=30),
        tc("n3", "wait_write", label="k")])
    app, _ = build(node, [long, AIMessage(content="done", id="ai-2")])
    config = {"configurable": {"thread_id": "thread-4"}}

    async def main():
        task = asyncio.create_task(app.ainvoke({"messages": [HumanMessage("go")]}, config))
        done, _ = await asyncio.wait([task], timeout=1.0)
        assert not done
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    turn_id = node._batch_id(config, long, node._calls({"messages": [long]})[1])
    assert fleet.ledger.is_cancelled(turn_id)
    assert node._turns == {}


def test_the_langgraph_example_runs(settings, start_worker):
    start_worker(concurrency=2)
    env = dict(os.environ, PYTHONPATH=str(ROOT), REDIS_URL=settings.redis_url, TOOLFLEET_NAMESPACE=settings.namespace)
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "langgraph_agent.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "approval asked: c3 write_file" in done.stdout and "approval asked: c4 write_file" in done.stdout
    assert "The plan is written." in done.stdout
    assert done.stdout.rstrip().endswith("notes/plan.md: draft 2")


def test_a_resume_in_another_process_takes_the_turn_over_and_runs_nothing_twice(fleet, settings, workspace):
    """Process A runs the graph to its interrupt; process B (another node and dispatcher, the same
    checkpointer) resumes it with an answer for one held call: it and the call blocked behind it
    run in B's turn, the call that had finished in A is not run again; A then resumes the rest
    (its own turn was taken over: it follows the chain)."""
    batch = AIMessage(content="", id="ai-1", tool_calls=[
        tc("rd", "read_file", path="README.md"),
        tc("a1", "append_line", path="log.txt", line="approved line"),
        tc("blk", "read_file", path="log.txt"),  # waits for a1 in the plan
        tc("a2", "append_line", path="other.txt", line="denied line"),
    ])
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "thread-5"}}

    def graph(node, responses):
        return build(node, responses, saver)[0]

    in_a = graph(FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S),
                 [batch, AIMessage(content="done", id="ai-2")])
    out = in_a.invoke({"messages": [HumanMessage("go")]}, config)
    first_turn = out["__interrupt__"][0].value["turn_id"]
    assert [p["call_id"] for p in out["__interrupt__"][0].value["pending"]] == ["a1", "a2"]

    resumed_ms = redis_now_ms(settings)
    with Dispatcher(settings, make_registry(), fleet.policy) as elsewhere:  # B answers a1 only
        in_b = graph(FleetToolNode(elsewhere, workspace=str(workspace), timeout_s=WAIT_S), [])
        out = in_b.invoke(Command(resume={"a1": "approve"}), config)
    second_turn = out["__interrupt__"][0].value["turn_id"]
    assert [p["call_id"] for p in out["__interrupt__"][0].value["pending"]] == ["a2"]
    assert second_turn != first_turn and fleet.ledger.is_cancelled(first_turn)

    out = in_a.invoke(Command(resume={"a2": "deny"}), config)  # back in A, whose own turn was taken over
    assert out["messages"][-1].content == "done"
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in tool_messages] == [
        ("rd", "success"), ("a1", "success"), ("blk", "success"), ("a2", "error")]
    assert "approved line" in tool_messages[2].content  # blk still ran after a1
    assert (workspace / "log.txt").read_text() == "approved line\n" and not (workspace / "other.txt").exists()
    turns = [m.artifact["turn_id"] for m in tool_messages]
    assert turns[:3] == [first_turn, second_turn, second_turn] and turns[3] not in (first_turn, second_turn)
    began = starts(settings, first_turn, second_turn, turns[3])
    assert set(began) == {"rd", "a1", "blk"}
    assert max(began["rd"]) < resumed_ms  # the call that had finished in A did not run again in B
    assert len(began["a1"]) == 1


def test_resume_values_read_by_call_id_or_as_one_answer_for_all():
    from toolfleet.integrations.langgraph_approvals import _decision, decisions_for

    assert decisions_for(["a", "b"], {"a": "approve", "z": "deny"}) == {"a": "approve"}  # b stays pending
    assert decisions_for(["b"], {"a": "approve"}) == {}  # an answer for a call decided before: nothing for b
    assert decisions_for(["a", "b"], "approve") == {"a": "approve", "b": "approve"}
    assert decisions_for(["a"], {"decision": "deny", "reason": "r"}) == {"a": {"decision": "deny", "reason": "r"}}
    assert _decision(True)[0] == _decision("Approve")[0] == _decision({"decision": "yes"})[0] == "approve"
    assert _decision(False)[0] == _decision("deny")[0] == "deny"
    assert _decision({"decision": "deny", "reason": "not now"})[1] == "not now"
    verdict, reason, remember = _decision("aprove")  # a typo: denied, and it says why
    assert verdict == "deny" and "not understood" in reason and remember is False
    assert _decision({"decision": "approve", "remember": ["x"]})[2] is False  # only a pattern or a bool


def test_a_resume_after_the_holding_process_cancelled_its_turn_still_runs_the_approved_call(fleet, settings,
                                                                                            workspace):
    """The process that hit the interrupt exits (its exit hook cancels its live turns, as
    ``cancel_interrupted`` does here): the resume, elsewhere, still runs the approved call, once."""
    held = AIMessage(content="", id="ai-1", tool_calls=[tc("h1", "append_line", path="log.txt", line="later"),
                                                        tc("ok", "read_file", path="README.md")])
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "thread-6"}}
    node_a = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)

    def graph(node, responses):
        return build(node, responses, saver)[0]

    out = graph(node_a, [held]).invoke({"messages": [HumanMessage("go")]}, config)
    first_turn = out["__interrupt__"][0].value["turn_id"]
    assert node_a.cancel_interrupted() == [first_turn]
    resumed_ms = redis_now_ms(settings)
    node_b = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    out = graph(node_b, [AIMessage(content="done", id="ai-2")]).invoke(Command(resume="approve"), config)
    tool_messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.status) for m in tool_messages] == [("h1", "success"), ("ok", "success")]
    assert (workspace / "log.txt").read_text() == "later\n"
    began = starts(settings, first_turn, tool_messages[0].artifact["turn_id"])
    assert len(began["h1"]) == 1 and max(began["ok"]) < resumed_ms


def test_a_last_message_that_is_not_an_ai_message_is_a_clear_error_and_no_calls_no_messages(settings):
    from toolfleet import ToolfleetError

    with Dispatcher(settings, make_registry()) as dispatcher:
        node = FleetToolNode(dispatcher)
        with pytest.raises(ToolfleetError, match="not the AIMessage"):
            node.invoke({"messages": [HumanMessage("hi")]})
        assert node.invoke({"messages": [AIMessage(content="no tools")]}) == {"messages": []}
        assert node.invoke([AIMessage(content="no tools")]) == []


def test_a_message_without_an_id_whose_call_ids_repeat_runs_its_own_calls(fleet, settings, workspace):
    """Local OpenAI-compatible servers number call ids ``call_0``, ``call_1`` in every turn, and a state
    without ``add_messages`` (or a direct invoke) leaves the AIMessage without an id: each batch is still
    its own (the turn id is seeded with each call's name and arguments, and, without a message id, the
    messages before it), and a recorded turn of other calls under the batch's id is never taken for it."""
    (workspace / "README.md").write_text("the readme\n")
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "main.py").write_text("print(1)\n")
    node = FleetToolNode(fleet, workspace=str(workspace), timeout_s=WAIT_S)
    config = {"configurable": {"thread_id": "thread-7"}}
    read = AIMessage(content="", tool_calls=[tc("call_0", "read_file", path="README.md")])
    listing = AIMessage(content="", tool_calls=[tc("call_0", "list_dir", path="pkg")])
    [first] = node.invoke({"messages": [read]}, config)["messages"]
    [second] = node.invoke({"messages": [listing]}, config)["messages"]
    assert "the readme" in first.content
    assert "main.py" in second.content and "the readme" not in second.content  # list_dir ran: its own answer
    assert second.artifact["turn_id"] != first.artifact["turn_id"]
    # the same call after a write in the same thread: the messages before it differ, so it runs again
    wrote = AIMessage(content="", tool_calls=[tc("call_0", "write_file", path="README.md", content="changed\n")])
    history = [HumanMessage(content="read it"), read, first]
    [done] = node.invoke({"messages": [*history, wrote]}, config)["messages"]
    assert done.status == "success", done.content
    [reread] = node.invoke({"messages": [*history, wrote, done, read]}, config)["messages"]
    assert "changed" in reread.content and reread.artifact["turn_id"] != first.artifact["turn_id"]
    # a genuine replay (same messages, same calls) still returns the recorded result, running nothing
    replayed_ms = redis_now_ms(settings)
    [again] = node.invoke({"messages": [listing]}, config)["messages"]
    assert again.content == second.content and again.artifact["turn_id"] == second.artifact["turn_id"]
    assert max(starts(settings, second.artifact["turn_id"])["call_0"]) < replayed_ms
    # a turn recorded under this batch's id with other calls (e.g. left by an older seed) is not reused
    other = AIMessage(content="", tool_calls=[tc("call_0", "read_file", path="pkg/main.py")])
    state = {"messages": [other]}
    parts = node._calls(state)
    squatter = fleet.submit([ToolCall(id="call_0", name="list_dir", arguments={"path": "pkg"})],
                            turn_id=node._batch_id(config, *parts, state), workspace=str(workspace))
    squatter.results(WAIT_S)
    [own] = node.invoke(state, config)["messages"]
    assert "print(1)" in own.content and own.artifact["turn_id"] != squatter.turn_id


def test_concurrent_resumes_elsewhere_run_each_call_at_most_once(settings, start_worker, workspace, tmp_path):
    """Three resumes of one interrupted batch, each in "another process" (its own dispatcher and
    node, the same checkpointer), overlapping: R1 takes the turn over and runs the approved write;
    while it runs (it is not cancellable), R2 takes R1's turn over (its claimed successor is not
    submitted until the write's outcome is in), and R3 arrives in that gap. The write runs once
    (tally.txt gets one line per execution), and every resume returns exactly one ToolMessage per
    call, the write's own result included."""
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[tools]\ntally_through = "ask"\n')
    policy = Policy.load(policy_file)
    start_worker(concurrency=2, args=["--policy", str(policy_file)])
    batch = AIMessage(content="", id="ai-1", tool_calls=[tc("rd", "read_file", path="README.md"),
                                                          tc("k1", "tally_through", text="k1", seconds=4)])
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "thread-8"}}
    dispatchers = [Dispatcher(settings, make_registry(), policy) for _ in range(4)]

    def graph(dispatcher, responses):
        return build(FleetToolNode(dispatcher, workspace=str(workspace), timeout_s=WAIT_S), responses, saver)[0]

    outs: dict[str, object] = {}

    def resume(name: str, dispatcher) -> threading.Thread:
        def run():
            try:
                outs[name] = graph(dispatcher, [AIMessage(content="done", id=f"ai-{name}")]).invoke(
                    Command(resume="approve"), config)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
                outs[name] = exc
        thread = threading.Thread(target=run, name=f"resume-{name}", daemon=True)
        thread.start()
        return thread

    continued = f"{settings.namespace}:integrations:continued:"
    client = redis.Redis.from_url(settings.redis_url)

    def successor(turn_id: str) -> str | None:
        value = client.get(continued + turn_id)
        return None if value is None else value.decode()

    try:
        out = graph(dispatchers[0], [batch]).invoke({"messages": [HumanMessage("go")]}, config)
        first_turn = out["__interrupt__"][0].value["turn_id"]
        threads = [resume("r1", dispatchers[1])]
        wait_until(lambda: successor(first_turn) is not None, WAIT_S, "R1's takeover of the first turn")
        r1_turn = successor(first_turn)
        wait_started(dispatchers[0], r1_turn, "k1", WAIT_S)  # approved in R1's turn, running
        threads.append(resume("r2", dispatchers[2]))
        wait_until(lambda: successor(r1_turn) is not None, WAIT_S, "R2's takeover of R1's turn")
        threads.append(resume("r3", dispatchers[3]))  # R2's successor is claimed, not yet submitted
        for thread in threads:
            thread.join(WAIT_S * 2)
            assert not thread.is_alive(), f"{thread.name} did not finish"
    finally:
        for dispatcher in dispatchers:
            dispatcher.close()
    assert (workspace / "tally.txt").read_text() == "k1\n"  # one execution
    for name in ("r1", "r2", "r3"):
        got = outs[name]
        assert not isinstance(got, BaseException), f"{name}: {got!r}"
        tool_messages = [m for m in got["messages"] if isinstance(m, ToolMessage)]
        assert sorted(m.tool_call_id for m in tool_messages) == ["k1", "rd"], name
        [k1] = [m for m in tool_messages if m.tool_call_id == "k1"]
        assert k1.status == "success" and "tallied k1" in k1.content, (name, k1.content)


def test_runs_of_a_live_batch_elsewhere_run_its_running_write_once(settings, start_worker, workspace):
    """A batch still running in process P0 (its write not cancellable, running) is run again by two
    other processes (a client retrying the request; each its own dispatcher and node): R1 takes P0's
    turn over and waits for the write's outcome before it submits the calls that never ran; R2
    comes in that gap, and finds R1's successor turn claimed but not submitted. The write runs once
    (tally.txt gets one line per execution) and every run returns one ToolMessage per call, the
    write's own result. (Before: R2 submitted the still-running write in R1's successor turn, where
    it ran again once P0's execution let go of its resource.)"""
    start_worker(concurrency=2)
    batch = AIMessage(content="", id="ai-1", tool_calls=[tc("rd", "read_file", path="README.md"),
                                                          tc("k1", "tally_through", text="k1", seconds=4)])
    state = {"messages": [HumanMessage("go"), batch]}
    config = {"configurable": {"thread_id": "thread-9"}}
    dispatchers = [Dispatcher(settings, make_registry()) for _ in range(3)]
    nodes = [FleetToolNode(d, workspace=str(workspace), timeout_s=WAIT_S) for d in dispatchers]
    outs: dict[int, object] = {}

    def run(i: int) -> threading.Thread:
        def body():
            try:
                outs[i] = nodes[i].invoke(state, config)["messages"]
            except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
                outs[i] = exc
        thread = threading.Thread(target=body, name=f"node-run-{i}", daemon=True)
        thread.start()
        return thread

    client = redis.Redis.from_url(settings.redis_url)
    first_turn = nodes[0]._batch_id(config, batch, nodes[0]._calls(state)[1], state)
    try:
        threads = [run(0)]
        wait_started(dispatchers[0], first_turn, "k1", WAIT_S)
        threads.append(run(1))
        wait_until(lambda: client.exists(f"{settings.namespace}:integrations:continued:{first_turn}"), WAIT_S,
                   "R1's takeover of P0's turn")
        threads.append(run(2))  # while the write still runs in P0's (cancelled) turn
        for thread in threads:
            thread.join(WAIT_S * 2)
            assert not thread.is_alive(), f"{thread.name} did not finish"
    finally:
        for dispatcher in dispatchers:
            dispatcher.close()
    assert (workspace / "tally.txt").read_text() == "k1\n"  # one execution
    for i in range(3):
        got = outs[i]
        assert not isinstance(got, BaseException), f"run {i}: {got!r}"
        assert [m.tool_call_id for m in got] == ["rd", "k1"], i
        assert got[1].status == "success" and "tallied k1" in got[1].content, (i, got[1].content)


P0_SCRIPT = """
import json, os, sys
from toolfleet import Dispatcher, Policy, Settings, ToolCall
from tests.conftest import make_registry
data = json.loads(sys.argv[1])
data["fleet_key"], data["fleet_keys_previous"] = os.environ.get("TOOLFLEET_FLEET_KEY"), ()
dispatcher = Dispatcher(Settings.model_validate(data), make_registry(), Policy.load(sys.argv[2]))
dispatcher.submit([ToolCall(**c) for c in json.loads(sys.argv[3])], turn_id=sys.argv[4], workspace=sys.argv[5],
                  session_id=sys.argv[6])
print("submitted", flush=True)
sys.stdin.read()
"""


def test_a_call_whose_outcome_a_takeover_gave_up_on_is_never_sent_again_by_a_later_resume(settings, start_worker,
                                                                                       workspace, tmp_path):
    """Process P0 submitted the batch (as the node does on its first run); its write started and
    wrote its line (it ran), then its worker froze and P0 was killed (nobody drives its turn). R1,
    elsewhere, takes the turn over: the write's outcome never comes within the bound, so it is
    OUTCOME_UNKNOWN, and only the held call goes on, in R1's turn. R2 resumes that (approves the
    held call) and takes R1's turn over: it reads the write's OUTCOME_UNKNOWN in the ledger and does
    not send it again. (Before: the OUTCOME_UNKNOWN lived only in R1's process; R2 took the write for
    one that never ran and sent it again: it waited for the lock of P0's dead turn, and ran a second
    time once that lapsed or, as here, R2 gave up first and said NOT_EXECUTED of a write that ran.)
    Loop detection is off, so a second run would show."""
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[tools]\nread_file = "ask"\n\n[loops]\nlimit = 0\n')  # a read: P0's dead turn holds
    # no lock it waits for
    policy = Policy.load(policy_file)
    frozen = start_worker(concurrency=1, args=["--policy", str(policy_file)])
    batch = AIMessage(content="", id="ai-1", tool_calls=[tc("k1", "tally_through", text="k1", seconds=1),
                                                          tc("h", "read_file", path="README.md")])
    config = {"configurable": {"thread_id": "thread-10"}}
    dispatchers = [Dispatcher(settings, make_registry(), policy) for _ in range(2)]
    saver = InMemorySaver()

    def graph(dispatcher, responses):
        return build(FleetToolNode(dispatcher, workspace=str(workspace), timeout_s=WAIT_S), responses, saver)[0]

    probe = FleetToolNode(dispatchers[0])
    calls = probe._calls({"messages": [batch]})[1]
    first_turn = probe._batch_id(config, batch, calls, {"messages": [batch]})
    tally = workspace / "tally.txt"
    p0 = subprocess.Popen([sys.executable, "-c", P0_SCRIPT, settings.model_dump_json(), str(policy_file),
                           json.dumps([c.model_dump(mode="json") for c in calls]), first_turn, str(workspace),
                           "thread-10"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p0.stdout.readline().strip() == "submitted"
        wait_until(lambda: tally.exists() and tally.read_text() == "k1\n", WAIT_S, "P0's write")
        freeze(frozen)
        p0.kill()
        p0.wait()
        start_worker(concurrency=1, args=["--policy", str(policy_file)])
        out = graph(dispatchers[0], [batch]).invoke({"messages": [HumanMessage("go")]}, config)
        assert [p["call_id"] for p in out["__interrupt__"][0].value["pending"]] == ["h"]
        out = graph(dispatchers[1], [AIMessage(content="done", id="ai-2")]).invoke(Command(resume="approve"), config)
    finally:
        if p0.poll() is None:
            p0.kill()
            p0.wait()
        thaw(frozen)
        for dispatcher in dispatchers:
            dispatcher.close()
    assert tally.read_text() == "k1\n"  # one execution
    tool_messages = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert sorted(tool_messages) == ["h", "k1"]
    assert tool_messages["k1"].artifact["error"]["code"] == "OUTCOME_UNKNOWN", tool_messages["k1"].content
    assert tool_messages["h"].status == "success", tool_messages["h"].content


def test_two_resumes_that_submit_one_successor_at_once_open_it_once(settings, start_worker, workspace, tmp_path):
    """R1 approves the running-to-be write k1 only (h2 stays held); while k1 runs (not cancellable),
    R2 and R3 resume with "approve" at once: R2 claims the successor of R1's turn, R3 finds it
    claimed and not submitted; both wait for k1's outcome, then both submit h2 in that successor,
    which the ledger opens once: the other follows the chain (and takes the opened turn over). k1
    and h2 each run once; every resume gets one result per call, none asks again about h2 (the
    resume whose turn was taken over returns its NOT_EXECUTED). Loop detection is off (the takeovers
    register h2 in four turns)."""
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[tools]\ntally_through = "ask"\n\n[loops]\nlimit = 0\n')
    policy = Policy.load(policy_file)
    start_worker(concurrency=2, args=["--policy", str(policy_file)])
    batch = AIMessage(content="", id="ai-1", tool_calls=[tc("k1", "tally_through", text="k1", seconds=4),
                                                          tc("h2", "tally_through", text="h2")])
    saver = InMemorySaver()
    config = {"configurable": {"thread_id": "thread-11"}}
    dispatchers = [Dispatcher(settings, make_registry(), policy) for _ in range(4)]

    def graph(dispatcher, responses):
        return build(FleetToolNode(dispatcher, workspace=str(workspace), timeout_s=WAIT_S), responses, saver)[0]

    outs: dict[str, object] = {}

    def resume(name: str, dispatcher, answer) -> threading.Thread:
        def run():
            try:
                outs[name] = graph(dispatcher, [AIMessage(content="done", id=f"ai-{name}")]).invoke(
                    Command(resume=answer), config)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertions below
                outs[name] = exc
        thread = threading.Thread(target=run, name=f"resume-{name}", daemon=True)
        thread.start()
        return thread

    client = redis.Redis.from_url(settings.redis_url)

    def successor(turn_id: str) -> str | None:
        value = client.get(f"{settings.namespace}:integrations:continued:{turn_id}")
        return None if value is None else value.decode()

    try:
        out = graph(dispatchers[0], [batch]).invoke({"messages": [HumanMessage("go")]}, config)
        first_turn = out["__interrupt__"][0].value["turn_id"]
        threads = [resume("r1", dispatchers[1], {"k1": "approve"})]
        wait_until(lambda: successor(first_turn) is not None, WAIT_S, "R1's takeover of the first turn")
        r1_turn = successor(first_turn)
        wait_started(dispatchers[0], r1_turn, "k1", WAIT_S)
        threads += [resume("r2", dispatchers[2], "approve"), resume("r3", dispatchers[3], "approve")]
        for thread in threads:
            thread.join(WAIT_S * 2)
            assert not thread.is_alive(), f"{thread.name} did not finish"
    finally:
        for dispatcher in dispatchers:
            dispatcher.close()
    assert sorted((workspace / "tally.txt").read_text().splitlines()) == ["h2", "k1"]  # one execution each
    h2_codes = []
    for name in ("r1", "r2", "r3"):
        got = outs[name]
        assert not isinstance(got, BaseException), f"{name}: {got!r}"
        tool_messages = {m.tool_call_id: m for m in got["messages"] if isinstance(m, ToolMessage)}
        assert sorted(tool_messages) == ["h2", "k1"], (name, got)
        assert tool_messages["k1"].status == "success", (name, tool_messages["k1"].content)
        h2 = tool_messages["h2"]
        h2_codes.append("ok" if h2.status == "success" else h2.artifact["error"]["code"])
    assert h2_codes[0] == "NOT_EXECUTED" and "ok" in h2_codes[1:], h2_codes  # R1's turn was taken over
    assert set(h2_codes[1:]) <= {"ok", "NOT_EXECUTED"}, h2_codes
