"""LangGraph, offline: a ``StateGraph`` whose tool node is the fleet (``FleetToolNode`` instead of
``ToolNode``), driven by a scripted chat model; a write waits for approval (a LangGraph interrupt)
and the graph is resumed by call id. Needs ``pip install 'toolfleet[langgraph]'``.

    toolfleet up -d --workers 2 --no-flower      # a local Redis and workers (or set REDIS_URL)
    python examples/langgraph_agent.py
    toolfleet down

Swap ``ScriptedModel`` for a real chat model (``ChatOpenAI(...)``, ``ChatAnthropic(...)``): nothing
else changes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command

from toolfleet import Dispatcher, Policy, Settings
from toolfleet.integrations.langgraph import FleetToolNode
from toolfleet.stack import running_redis_url, with_local_fleet_key

HERE = Path(__file__).resolve().parent


class ScriptedModel(FakeMessagesListChatModel):
    """langchain-core's fake chat model, with ``bind_tools`` as real chat models have it."""

    def bind_tools(self, tools, **kwargs):
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def call(cid: str, name: str, **args) -> dict:
    return {"id": cid, "name": name, "args": args, "type": "tool_call"}


SCRIPT = [
    AIMessage("", id="m1", tool_calls=[call("c1", "read_file", path="README.md"),
                                       call("c2", "list_dir", path="src"),
                                       call("c3", "write_file", path="notes/plan.md", content="draft 1"),
                                       call("c4", "write_file", path="notes/plan.md", content="draft 2")]),
    AIMessage("", id="m2", tool_calls=[call("c5", "read_file", path="notes/plan.md")]),
    AIMessage("The plan is written.", id="m3"),
]


def main() -> None:
    redis_url = None if os.environ.get("REDIS_URL") else running_redis_url()
    settings = Settings.from_env(with_local_fleet_key(), redis_url=redis_url)
    workspace = Path(tempfile.mkdtemp()) / "workspace"
    shutil.copytree(HERE / "cases" / "workspace", workspace)
    policy = Policy.from_dict({"tools": {"write_file": "ask"}})           # writes wait for a person

    with Dispatcher(settings, policy=policy) as fleet:
        tools = FleetToolNode(fleet, workspace=str(workspace))          # glue 1: the node
        model = ScriptedModel(responses=SCRIPT).bind_tools(tools.tools)  # glue 2: the fleet's tools, once

        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        app = graph.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "example"}}

        out = app.invoke({"messages": [HumanMessage("write the plan")]}, config)
        while "__interrupt__" in out:                                    # a person answers, by call id
            asked = out["__interrupt__"][0].value
            for p in asked["pending"]:
                print(f"approval asked: {p['call_id']} {p['name']} {p['arguments']} ({p['reason']})")
            out = app.invoke(Command(resume={p["call_id"]: "approve" for p in asked["pending"]}), config)
        for message in out["messages"]:
            print(f"{message.type:>6}: {getattr(message, 'tool_call_id', '')} {str(message.content)[:70]!r}")
        print("notes/plan.md:", (workspace / "notes" / "plan.md").read_text())


if __name__ == "__main__":
    main()
