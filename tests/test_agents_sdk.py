"""OpenAI Agents SDK: a real ``Runner`` driven by a scripted ``Model`` (no network), tools on real workers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

from toolfleet import ErrorCode  # noqa: E402
from toolfleet.integrations.agents_sdk import FleetTools  # noqa: E402

set_tracing_disabled(True)


def fcall(call_id: str, name: str, **arguments) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", id=f"fc_{call_id}", call_id=call_id, name=name,
                                    arguments=json.dumps(arguments), status="completed")


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


class ScriptedModel(Model):
    """Returns the scripted responses in turn; the last one may be a callable of the input it saw."""

    def __init__(self, *responses) -> None:
        self.responses = list(responses)
        self.inputs: list = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **_):
        self.inputs.append(input)
        step = self.responses.pop(0)
        output = step(input) if callable(step) else step
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("scripted model: get_response only")


def _outputs(items) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"}


def test_runner_runs_one_response_as_one_fleet_turn_keeping_the_plan_rule(dispatcher, worker):
    first = [
        fcall("r1", "wait_read", label="a", seconds=0.3),
        fcall("r2", "wait_read", label="b", seconds=0.3),
        fcall("w", "wait_write", label="k", seconds=0.8),
        fcall("after", "wait_read", label="k"),  # conflicts with the write before it: runs after it
        fcall("bad", "wait_read", nope=1),       # invalid arguments: an error result, the others run
    ]
    model = ScriptedModel(first, lambda seen: [message(json.dumps(_outputs(seen), sort_keys=True))])
    with FleetTools(dispatcher, names=["wait_read", "wait_write"]) as fleet:
        agent = Agent(name="fleet", instructions="use the tools", model=model, tools=fleet.tools)
        result = asyncio.run(asyncio.wait_for(
            Runner.run(agent, "go", hooks=fleet.hooks, run_config=RunConfig(tracing_disabled=True)), 120))
        outputs = json.loads(result.final_output)
        assert outputs["r1"] == "read a" and outputs["r2"] == "read b"
        assert outputs["w"] == "wrote k" and outputs["after"] == "read k"
        assert outputs["bad"].startswith("Error [INVALID_ARGUMENT]")
        assert len(fleet.turns) == 1  # the whole response went to the fleet as one turn, in model order
        results = {r.call_id: r for r in fleet.turns[0].results(timeout_s=30)}
        assert [c.id for c in fleet.turns[0].calls] == ["r1", "r2", "w", "after", "bad"]
        # the read of k (no wait) waited for the write of k (0.8 s): the result of running them in model order
        assert fleet.completed.index("w") < fleet.completed.index("after")
        assert results["w"].run_ms >= 700
        assert results["bad"].code == ErrorCode.INVALID_ARGUMENT


def test_each_model_turn_is_its_own_fleet_turn_and_calls_without_hooks_still_run(dispatcher, worker):
    model = ScriptedModel([fcall("c1", "wait_read", label="x")], [fcall("c2", "wait_read", label="y")],
                          lambda seen: [message(json.dumps(_outputs(seen), sort_keys=True))])
    with FleetTools(dispatcher, names=["wait_read"]) as fleet:
        agent = Agent(name="fleet", model=model, tools=fleet.tools)
        result = asyncio.run(asyncio.wait_for(Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)),
                                              120))  # no hooks
        assert json.loads(result.final_output) == {"c1": "read x", "c2": "read y"}
        assert [[c.id for c in t.calls] for t in fleet.turns] == [["c1"], ["c2"]]


def test_cancelling_the_run_cancels_the_fleet_turn(dispatcher, worker):
    model = ScriptedModel([fcall("long", "count_until_cancelled", seconds=20),
                           fcall("next", "wait_read", label="z")])
    with FleetTools(dispatcher, names=["count_until_cancelled", "wait_read"]) as fleet:
        agent = Agent(name="fleet", model=model, tools=fleet.tools)

        async def main() -> None:
            run = asyncio.create_task(Runner.run(agent, "go", hooks=fleet.hooks,
                                                 run_config=RunConfig(tracing_disabled=True)))
            deadline = time.monotonic() + 60
            while not fleet.turns or not fleet.turns[0].armed:  # the call was handed to the fleet
                assert not run.done() and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run

        started = time.monotonic()
        asyncio.run(main())
        results = {r.call_id: r for r in fleet.turns[0].results(timeout_s=30)}
        assert results["long"].code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
        assert results["next"].ok or results["next"].code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)
        assert time.monotonic() - started < 15  # not the 20 s the call would have taken


def test_calls_held_for_approval_wait_for_the_answer_by_call_id(settings, worker):
    from toolfleet import Dispatcher, Policy

    from .conftest import make_registry

    policy = Policy.from_dict({"tools": {"wait_write": "ask"}})
    model = ScriptedModel([fcall("r", "wait_read", label="a"), fcall("w", "wait_write", label="k"),
                           fcall("w2", "wait_write", label="m"), fcall("rk", "wait_read", label="k")],
                          lambda seen: [message(json.dumps(_outputs(seen), sort_keys=True))])
    with Dispatcher(settings, make_registry(), policy) as dispatcher, \
            FleetTools(dispatcher, names=["wait_read", "wait_write"]) as fleet:
        agent = Agent(name="fleet", model=model, tools=fleet.tools)

        async def main():
            run = asyncio.create_task(Runner.run(agent, "go", hooks=fleet.hooks,
                                                 run_config=RunConfig(tracing_disabled=True)))
            deadline = time.monotonic() + 60
            while not fleet.turns or not fleet.turns[0].armed:
                assert not run.done() and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            turn = fleet.turns[0]
            pending = await asyncio.to_thread(turn.wait_settled, 60)  # all that could run ran
            assert sorted(p.call_id for p in pending) == ["w", "w2"]
            # r's result is in the turn; the adapter's reader thread hands it on just after
            while "r" not in fleet.completed:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert "rk" not in fleet.completed  # rk waits for the held write
            await asyncio.to_thread(turn.approve, "w")
            await asyncio.to_thread(turn.deny, "w2", "not today")
            return await asyncio.wait_for(run, 60)

        outputs = json.loads(asyncio.run(main()).final_output)
        assert outputs["r"] == "read a" and outputs["w"] == "wrote k" and outputs["rk"] == "read k"
        assert outputs["w2"].startswith("Error [PERMISSION_DENIED]")
        assert fleet.completed.index("w") < fleet.completed.index("rk")


def test_without_hooks_a_call_id_seen_in_an_earlier_run_runs_again(dispatcher, worker):
    """One FleetTools serving run after run (built once, as its tools are): providers behind the
    SDK's Chat Completions model reuse call ids across conversations (``call_0`` in every response:
    Gemini through LiteLLM, llama.cpp, Mistral's short ids). Without hooks the second run's
    ``call_0`` was answered with the first run's result (its batch was kept by call id): it never
    ran, and the model read another call's text."""
    with FleetTools(dispatcher, names=["wait_read"]) as fleet:
        seen = []
        for label in ("x", "y"):
            model = ScriptedModel([fcall("call_0", "wait_read", label=label)],
                                  lambda items: [message(json.dumps(_outputs(items)))])
            agent = Agent(name="fleet", model=model, tools=fleet.tools)
            result = asyncio.run(asyncio.wait_for(
                Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)), 120))  # no hooks
            seen.append(json.loads(result.final_output))
        assert seen == [{"call_0": "read x"}, {"call_0": "read y"}]
        assert len(fleet.turns) == 2


def test_a_long_lived_fleet_tools_keeps_no_turn_of_answered_calls(dispatcher, worker, monkeypatch):
    """One FleetTools serving run after run (a server): each call without hooks opened a turn kept
    by call id in ``_batches`` and never dropped, so every turn stayed in memory for good. An answered
    call's entry goes (with hooks or without), and ``turns`` keeps only the latest ones."""
    monkeypatch.setattr("toolfleet.integrations.agents_sdk._KEPT_TURNS", 2)
    with FleetTools(dispatcher, names=["wait_read"]) as fleet:
        for run, hooks in enumerate((None, None, fleet.hooks)):
            model = ScriptedModel([fcall(f"a{run}", "wait_read", label="x")],
                                  [fcall(f"b{run}", "wait_read", label="y")],
                                  lambda items: [message(json.dumps(_outputs(items), sort_keys=True))])
            agent = Agent(name="fleet", model=model, tools=fleet.tools)
            result = asyncio.run(asyncio.wait_for(
                Runner.run(agent, "go", hooks=hooks, run_config=RunConfig(tracing_disabled=True)), 120))
            assert json.loads(result.final_output) == {f"a{run}": "read x", f"b{run}": "read y"}
            assert fleet._batches == {}
        assert [[c.id for c in t.calls] for t in fleet.turns] == [["a2"], ["b2"]]
