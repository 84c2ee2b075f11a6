"""Agents SDK: a call running when the response's wait bound passes is told CANCELLED, never NOT_EXECUTED."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402

from toolfleet.integrations.agents_sdk import FleetTools  # noqa: E402

from .test_agents_sdk import ScriptedModel, _outputs, fcall, message  # noqa: E402


def test_a_call_running_at_the_timeout_is_cancelled_not_reported_as_never_run(dispatcher, worker):
    model = ScriptedModel([fcall("long", "count_until_cancelled", seconds=8)],
                          lambda seen: [message(json.dumps(_outputs(seen), sort_keys=True))])
    with FleetTools(dispatcher, names=["count_until_cancelled"], timeout_s=2) as fleet:
        agent = Agent(name="fleet", model=model, tools=fleet.tools)
        result = asyncio.run(asyncio.wait_for(
            Runner.run(agent, "go", hooks=fleet.hooks, run_config=RunConfig(tracing_disabled=True)), 60))
        text = json.loads(result.final_output)["long"]
        recorded = fleet.turns[0].results(timeout_s=30)[0]
        # the call ran (it counted ticks) and was stopped: the model must read what the fleet recorded
        assert recorded.error.code.value in ("CANCELLED", "OUTCOME_UNKNOWN")
        assert text == recorded.content, text
