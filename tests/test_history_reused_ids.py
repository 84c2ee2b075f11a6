"""History repair of a Responses history whose call ids repeat across turns, among built-in tool
items the server ran and ones the client ran: each turn's own answers pair with its own calls, and
a whole history of well-answered turns needs no repair. Found by a helper: a client
``tool_search_call`` reusing the id of a server-run one had its answer taken for the server's, so a
placeholder was added beside it (two answers to one call, which the API refuses)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.adapters.client_tools import client_results
from toolfleet.dispatcher.history import repair_history
from toolfleet.errors import BatchRejected

from .test_client_tool_calls import client_batches, fabricated, response

SERVER_SEARCH = {"type": "tool_search_call", "call_id": "x", "status": "completed", "execution": "server",
                 "arguments": {"query": "calendar"}}
SERVER_FOUND = {"type": "tool_search_output", "call_id": "x", "status": "completed", "execution": "server",
                "tools": []}
CLIENT_SEARCH = {**SERVER_SEARCH, "execution": "client"}
CLIENT_FOUND = {**SERVER_FOUND, "execution": "client"}


def answers(items: list) -> list:
    return [i for i in repair_history(items, "openai_responses").messages if i["type"].endswith("_output")]


def test_a_client_search_reusing_a_server_searchs_id_keeps_its_one_answer():
    history = [SERVER_SEARCH, SERVER_FOUND, CLIENT_SEARCH, CLIENT_FOUND]
    repaired = repair_history(history, "openai_responses")
    assert repaired.repairs == [] and repaired.messages == history


def test_an_unanswered_client_search_after_a_server_one_of_its_id_gets_one_placeholder():
    repaired = repair_history([SERVER_SEARCH, SERVER_FOUND, CLIENT_SEARCH], "openai_responses")
    assert [r.kind for r in repaired.repairs] == ["missing_result"]
    assert [a["execution"] for a in answers([SERVER_SEARCH, SERVER_FOUND, CLIENT_SEARCH])] == ["server", "client"]


def test_a_server_output_without_its_execution_field_stays_the_servers():
    """The server's answer is told by the call before it, not only by its ``execution`` field."""
    bare = {k: v for k, v in SERVER_FOUND.items() if k != "execution"}
    history = [SERVER_SEARCH, bare, CLIENT_SEARCH, CLIENT_FOUND]
    assert repair_history(history, "openai_responses").messages == history
    repaired = repair_history([CLIENT_SEARCH, CLIENT_FOUND, SERVER_SEARCH, bare], "openai_responses")
    assert repaired.repairs == [] and len(answers([CLIENT_SEARCH, CLIENT_FOUND, SERVER_SEARCH, bare])) == 2


def turn_items(batch) -> list | None:
    """The assistant items of one turn and its answers, as the adapter writes them; None when the
    turn is refused (a ``computer_call``)."""
    items = batch[0]
    adapter = get_adapter("openai_responses")
    payload = response(*items)
    try:
        calls = adapter.parse(payload)
    except BatchRejected:
        return None
    made = fabricated(calls, client_results(calls, adapter.client_calls(payload), lambda name: True))
    return adapter.assistant_messages(payload) + adapter.format_results(made, response=payload)


@settings(max_examples=int(300 * float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))), derandomize=True,
          database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=st.lists(client_batches(), min_size=2, max_size=4))
def test_turns_reusing_call_ids_need_no_repair_and_lose_no_answer(batches):
    """Every turn numbers its calls ``c0``, ``c1``...: ids repeat across turns, between calls the
    server ran (answered in its output) and calls the client ran. The whole history needs no
    repair; without a turn's last answer, exactly that call gets one placeholder (a screenshot has
    none: a ``computer_call_output`` is left out of that half)."""
    turns = [t for t in map(turn_items, batches) if t is not None]
    history = [item for turn in turns for item in turn]
    repaired = repair_history(history, "openai_responses")
    assert [r.kind for r in repaired.repairs] == [] and repaired.messages == history
    last = next((t for t in reversed(turns) if t and t[-1]["type"].endswith("_output")  # no placeholder
                 and t[-1]["type"] != "computer_call_output" and t[-1].get("execution") != "server"), None)
    if last is None:
        return
    cut = history[:len(history) - sum(len(t) for t in turns[turns.index(last):])] + last[:-1]
    repaired = repair_history(cut, "openai_responses")
    assert [(r.kind, r.call_id) for r in repaired.repairs] == [("missing_result", last[-1]["call_id"])]
    assert len(repaired.messages) == len(cut) + 1
