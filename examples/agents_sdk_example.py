"""OpenAI Agents SDK on the fleet, offline: a scripted model (no API key, no network) drives a real
``Runner``; its function tools run on toolfleet's workers.

    toolfleet up -d                      # the local stack (Redis + workers), or any running fleet
    python examples/agents_sdk_example.py
    toolfleet down

The first model response asks for two reads and a conflicting write pair at once; toolfleet runs the
response as one turn (reads side by side, the write before the read of the same file), and the second
response answers with what the tools returned.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path

from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from toolfleet import Dispatcher, Settings
from toolfleet.integrations.agents_sdk import FleetTools
from toolfleet.stack import running_redis_url, with_local_fleet_key


def call(call_id: str, name: str, **arguments) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", id=f"fc_{call_id}", call_id=call_id, name=name,
                                    arguments=json.dumps(arguments), status="completed")


class ScriptedModel(Model):
    """Stands in for a real model: first the tool calls, then an answer built from their outputs."""

    def __init__(self) -> None:
        self.step = 0

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, **_):
        self.step += 1
        if self.step == 1:
            output = [call("c1", "list_dir", path="."), call("c2", "read_file", path="README.md"),
                      call("c3", "write_file", path="notes/todo.md", content="- try toolfleet\n"),
                      call("c4", "read_file", path="notes/todo.md")]  # waits for the write before it
        else:
            results = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
            summary = "\n\n".join(f"{r['call_id']}:\n{r['output'][:300]}" for r in results)
            output = [ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                            content=[ResponseOutputText(type="output_text", text=summary,
                                                                        annotations=[])])]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


async def main() -> None:
    set_tracing_disabled(True)
    workspace = Path(tempfile.mkdtemp()) / "workspace"
    shutil.copytree(Path(__file__).parent / "cases" / "workspace", workspace)
    settings = Settings.from_env(with_local_fleet_key(), redis_url=running_redis_url())
    with Dispatcher(settings) as dispatcher, FleetTools(dispatcher, workspace=str(workspace)) as fleet:
        agent = Agent(name="assistant", instructions="Use the tools.", model=ScriptedModel(), tools=fleet.tools)
        result = await Runner.run(agent, "What is in this project?", hooks=fleet.hooks,
                                  run_config=RunConfig(tracing_disabled=True))
        print(result.final_output)
        print(f"\n{len(fleet.turns)} fleet turn(s); results came in this order: {fleet.completed}")


if __name__ == "__main__":
    asyncio.run(main())
