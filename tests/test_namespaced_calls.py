"""OpenAI Responses ``function_call`` items with a ``namespace`` (a function of a ``namespace``
tool): the fleet tool each runs, streamed and whole, and what goes back
(toolfleet/dispatcher/adapters/namespaces.py). No worker: the tests look at what the dispatcher
took, then cancel the turn."""

from __future__ import annotations

import pytest

from toolfleet import Dispatcher
from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.adapters.namespaces import resolve, tool_name
from toolfleet.models import ErrorCode, ToolCall
from toolfleet.tools.spec import tool

from .conftest import make_registry


@tool(name="crm__lookup", access="read")
def crm_lookup(id: int) -> str:
    """Look a customer up.

    Args:
        id: The customer's number.
    """
    return str(id)


def _item(n: int, name: str, namespace: str | None, arguments: str) -> dict:
    item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
            "arguments": arguments, "status": "completed"}
    return item if namespace is None else {**item, "namespace": namespace}


ITEMS = [
    _item(1, "lookup", "crm", '{"id": 7}'),              # the registry has crm__lookup: that runs
    _item(2, "read_file", "fleet", '{"path": "README.md"}'),  # a namespace grouping the fleet's own tools
    _item(3, "read_file", "read_file", '{"path": "README.md"}'),  # the Agents SDK's deferred top-level shape
    _item(4, "nothing", "crm", "{}"),                     # in neither form: UNKNOWN_TOOL for the name given
]
RESPONSE = {"id": "resp_ns", "object": "response", "status": "completed", "output": ITEMS}


def _stream() -> list[dict]:
    events: list[dict] = [{"type": "response.created", "response": {"id": "resp_ns", "object": "response",
                                                                     "status": "in_progress", "output": []}}]
    for n, item in enumerate(ITEMS):
        events.append({"type": "response.output_item.added", "output_index": n,
                       "item": {**item, "arguments": "", "status": "in_progress"}})
        events.append({"type": "response.function_call_arguments.delta", "output_index": n, "item_id": item["id"],
                       "delta": item["arguments"]})
        events.append({"type": "response.function_call_arguments.done", "output_index": n, "item_id": item["id"],
                       "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed", "response": RESPONSE})
    return events


def test_the_tool_a_namespaced_call_runs():
    known = {"crm__lookup", "read_file"}.__contains__
    assert tool_name("lookup", "crm", known) == "crm__lookup"
    assert tool_name("read_file", "fleet", known) == "read_file"
    assert tool_name("read_file", "read_file", known) == "read_file"
    assert tool_name("nothing", "crm", known) == "nothing"
    assert tool_name("lookup", None, known) == "lookup"  # no namespace: the name as given
    call = ToolCall(id="call_1", name="lookup")
    assert resolve([call], {}, known) == [call]


def test_both_responses_adapters_read_each_calls_namespace():
    assert get_adapter("openai_responses").namespaces(RESPONSE) == {
        "call_1": "crm", "call_2": "fleet", "call_3": "read_file", "call_4": "crm"}
    parser = get_adapter("openai_responses_stream").replay(_stream())
    assert parser.namespaces == get_adapter("openai_responses").namespaces(RESPONSE)
    # only the terminal response carries the item: its namespace is read there
    only_end = [_stream()[0], {"type": "response.completed", "response": {**RESPONSE, "output": ITEMS[:1]}}]
    assert get_adapter("openai_responses_stream").replay(only_end).namespaces == {"call_1": "crm"}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_namespaced_call_runs_the_fleet_tool_it_names_and_goes_back_as_it_came(settings, tmp_path, streamed):
    """A tester's find: ``namespace`` was not read, so ``{"namespace": "crm", "name": "lookup"}`` was
    checked as the tool ``lookup`` (UNKNOWN_TOOL here; another tool of that bare name would have run).
    Now it runs ``crm__lookup`` when the registry has it, else the bare name; the items go back as
    the model wrote them and the outputs pair by call_id."""
    registry = make_registry()
    registry.add(crm_lookup)
    with Dispatcher(settings, registry) as dispatcher:
        payload = _stream() if streamed else RESPONSE
        turn = dispatcher.submit_response(payload, workspace=str(tmp_path))
        try:
            assert [(c.id, c.name) for c in turn.calls] == [
                ("call_1", "crm__lookup"), ("call_2", "read_file"), ("call_3", "read_file"), ("call_4", "nothing")]
        finally:
            turn.cancel("the test looked at what was taken")
        results = {r.call_id: r for r in turn.results(timeout_s=20)}
        assert results["call_4"].error is not None and results["call_4"].error.code == ErrorCode.UNKNOWN_TOOL
        assert all(results[c].error is None or results[c].error.code != ErrorCode.UNKNOWN_TOOL
                   for c in ("call_1", "call_2", "call_3"))
        echoed = [i for i in turn.assistant_messages() if i.get("type") == "function_call"]
        assert [(i["call_id"], i.get("namespace"), i["name"]) for i in echoed] == [
            (i["call_id"], i["namespace"], i["name"]) for i in ITEMS]
        assert [m["call_id"] for m in turn.messages()] == ["call_1", "call_2", "call_3", "call_4"]
