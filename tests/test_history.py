"""History check and repair in the three formats; repaired histories validate against the SDK types."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet import repair_history
from toolfleet.errors import BatchRejected

from .sdk_types import check_messages


def chat_call(call_id: str, name: str = "read_file") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def tool_msg(call_id: str, text: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def kinds(repaired) -> list[tuple[str, str]]:
    return [(r.kind, r.call_id) for r in repaired.repairs]


def test_chat_assistant_with_one_result_missing_is_repaired_and_reported():
    history = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": None, "tool_calls": [chat_call("a"), chat_call("b"), chat_call("c")]},
        tool_msg("a"), tool_msg("c"),
        {"role": "user", "content": "and?"},
    ]
    repaired = repair_history(history)
    assert repaired.format == "openai_chat"
    assert kinds(repaired) == [("missing_result", "b")]
    assert [m.get("tool_call_id") for m in repaired.messages] == [None, None, "a", "b", "c", None]
    placeholder = repaired.messages[3]
    assert placeholder["content"].startswith("Error [ABORTED]:")
    check_messages("openai_chat", repaired.messages)
    assert history[2:4] == [tool_msg("a"), tool_msg("c")]  # the input is not changed


def test_chat_duplicates_orphans_and_misplaced_results():
    history = [
        {"role": "assistant", "content": None, "tool_calls": [chat_call("a"), chat_call("b")]},
        tool_msg("a", "first"), tool_msg("a", "second"), tool_msg("ghost"),
        {"role": "user", "content": "hm"},
        tool_msg("b", "late"),
    ]
    repaired = repair_history(history, format="chat")
    assert sorted(kinds(repaired)) == [("duplicate_result", "a"), ("moved_result", "b"), ("orphan_result", "ghost")]
    assert repaired.messages == [history[0], tool_msg("a", "first"), tool_msg("b", "late"), history[4]]
    check_messages("openai_chat", repaired.messages)


def test_anthropic_tool_use_without_tool_result_is_repaired_and_reported():
    history = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                                          {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}},
                                          {"type": "tool_use", "id": "t2", "name": "list_dir", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "x"},
                                     {"type": "text", "text": "go on"}]},
    ]
    repaired = repair_history(history)
    assert repaired.format == "anthropic"
    assert kinds(repaired) == [("missing_result", "t1")]
    results = repaired.messages[2]["content"]
    assert [b.get("tool_use_id") for b in results] == ["t1", "t2", None]  # results first, in call order
    assert results[0]["is_error"] is True and results[0]["content"].startswith("Error [ABORTED]:")
    assert results[2] == {"type": "text", "text": "go on"}
    check_messages("anthropic", repaired.messages)


def test_anthropic_history_ending_on_a_tool_use_gets_a_user_message():
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "grep", "input": {}}]}]
    repaired = repair_history(history, format="anthropic")
    assert kinds(repaired) == [("missing_result", "t1")]
    assert repaired.messages[-1]["role"] == "user" and repaired.messages[-1]["content"][0]["tool_use_id"] == "t1"
    check_messages("anthropic", repaired.messages)


def test_anthropic_orphans_duplicates_and_moved_results():
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "grep", "input": {}}]}
    history = [
        {"role": "user", "content": "go"},
        use,
        {"role": "user", "content": "what next?"},
        {"role": "assistant", "content": "working"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "late"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": "again"},
                                     {"type": "tool_result", "tool_use_id": "zz", "content": "?"}]},
    ]
    repaired = repair_history(history)
    assert sorted(kinds(repaired)) == [("duplicate_result", "t1"), ("empty_message_removed", ""),
                                       ("moved_result", "t1"), ("orphan_result", "zz")]
    assert repaired.messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "t1", "content": "late"},
                                               {"type": "text", "text": "what next?"}]
    assert len(repaired.messages) == 4
    check_messages("anthropic", repaired.messages)


def test_responses_call_without_output_is_repaired_and_reported():
    history = [
        {"role": "user", "content": "look"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "grep", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "ok"},
        {"type": "function_call_output", "call_id": "c2", "output": "again"},
        {"type": "function_call_output", "call_id": "c9", "output": "?"},
    ]
    repaired = repair_history(history)
    assert repaired.format == "openai_responses"
    assert sorted(kinds(repaired)) == [("duplicate_result", "c2"), ("missing_result", "c1"), ("orphan_result", "c9")]
    assert [(i.get("type"), i.get("call_id")) for i in repaired.messages] == [
        (None, None), ("function_call", "c1"), ("function_call_output", "c1"),
        ("function_call", "c2"), ("function_call_output", "c2")]
    assert repaired.messages[2]["output"].startswith("Error [ABORTED]:")
    check_messages("openai_responses", repaired.messages)


def test_responses_output_before_its_call_is_moved_after_it():
    history = [{"type": "function_call_output", "call_id": "c1", "output": "early"},
               {"type": "function_call", "call_id": "c1", "name": "grep", "arguments": "{}"}]
    repaired = repair_history(history, format="responses")
    assert kinds(repaired) == [("moved_result", "c1")]
    assert [i["type"] for i in repaired.messages] == ["function_call", "function_call_output"]


@pytest.mark.parametrize("history", [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [chat_call("a")]},
     tool_msg("a")],
    [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "g", "input": {}}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}],
    [{"type": "function_call", "call_id": "c", "name": "g", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "c", "output": "x"}],
])
def test_a_sound_history_comes_back_unchanged(history):
    repaired = repair_history(history)
    assert repaired.ok and repaired.messages == history


def test_a_history_must_be_a_list():
    with pytest.raises(BatchRejected):
        repair_history({"role": "user"})  # type: ignore[arg-type]


def _sound_history(fmt: str, turns: list[list[str]], order: list[int]) -> list:
    """A history a provider accepts: each turn's calls (ids unique within the turn, reused across
    turns, as servers that number calls per response do), then their results, in ``order``
    (Responses; Chat's and Anthropic's in call order)."""
    history: list = []
    for n, ids in enumerate(turns):
        history.append({"role": "user", "content": f"turn {n}"})
        answered = sorted(ids, key=lambda i: order[ids.index(i) % len(order)])
        if fmt == "openai_chat":  # (results in another order are kept too: test_history_turns.py)
            history.append({"role": "assistant", "content": None, "tool_calls": [chat_call(i) for i in ids]})
            history += [tool_msg(i, f"{n}:{i}") for i in ids]
        elif fmt == "anthropic":
            history.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": i, "name": "g", "input": {}} for i in ids]})
            history.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": i, "content": f"{n}:{i}"} for i in ids]})
        else:
            history += [{"type": "function_call", "call_id": i, "name": "g", "arguments": "{}"} for i in ids]
            history += [{"type": "function_call_output", "call_id": i, "output": f"{n}:{i}"} for i in answered]
    return history


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["openai_chat", "anthropic", "openai_responses"]),
       st.lists(st.lists(st.sampled_from(["call_0", "call_1", "toolu_2"]), min_size=1, max_size=3, unique=True),
                min_size=1, max_size=5),
       st.permutations([0, 1, 2]))
def test_call_ids_reused_across_turns_keep_each_result_with_its_call(fmt, turns, order):
    """A Responses history whose second turn reused call_0 lost that turn's result: repair kept
    only the first call of an id, so the second output read as a duplicate and was dropped (a
    breaker's find). Every format now leaves such a sound history as it is."""
    history = _sound_history(fmt, turns, order)
    repaired = repair_history(history, format=fmt)
    assert repaired.ok and repaired.repairs == [] and repaired.messages == history


def test_responses_call_id_reused_with_the_first_result_lost_gets_a_placeholder_there():
    call = {"type": "function_call", "call_id": "call_0", "name": "g", "arguments": "{}"}
    history = [call, {"role": "user", "content": "again"}, dict(call),
               {"type": "function_call_output", "call_id": "call_0", "output": "two"}]
    repaired = repair_history(history, format="responses")
    assert kinds(repaired) == [("missing_result", "call_0")] and repaired.repairs[0].position == 0
    assert [i.get("output", "")[:14] for i in repaired.messages] == ["", "Error [ABORTED", "", "", "two"]


def test_responses_an_output_of_the_other_kind_is_retyped_for_its_call():
    """A ``function_call`` answered by a ``custom_tool_call_output`` (or the other way round)
    passed repair, and the API refuses it: a call pairs with an output of its own kind only."""
    history = [
        {"type": "function_call", "call_id": "a", "name": "read_file", "arguments": "{}"},
        {"type": "custom_tool_call_output", "call_id": "a", "output": "text of a"},
        {"type": "custom_tool_call", "call_id": "b", "name": "apply", "input": "x"},
        {"type": "message", "role": "user", "content": "between"},
        {"type": "function_call_output", "id": "fco_1", "call_id": "b", "output": "done", "status": "completed"},
    ]
    repaired = repair_history(history, "openai_responses")
    assert kinds(repaired) == [("retyped_result", "a"), ("retyped_result", "b")]
    # only the fields of the type it becomes (a custom_tool_call_output has no status; the item id was
    # the other type's): a breaker's find, the SDK check below refused it
    assert repaired.messages[3] == {"type": "custom_tool_call_output", "call_id": "b", "output": "done"}
    assert [(i["type"], i.get("call_id"), i.get("output")) for i in repaired.messages] == [
        ("function_call", "a", None), ("function_call_output", "a", "text of a"),
        ("custom_tool_call", "b", None), ("custom_tool_call_output", "b", "done"), ("message", None, None)]
    check_messages("openai_responses", repaired.messages)
    assert history[1]["type"] == "custom_tool_call_output"  # the input is never changed


def test_responses_a_builtin_tool_answer_pairs_only_with_a_call_of_its_kind():
    history = [
        {"type": "function_call", "call_id": "a", "name": "read_file", "arguments": "{}"},
        {"type": "shell_call_output", "call_id": "a", "output": []},
    ]
    repaired = repair_history(history, "openai_responses")
    assert sorted(kinds(repaired)) == [("missing_result", "a"), ("orphan_result", "a")]
    assert [i["type"] for i in repaired.messages] == ["function_call", "function_call_output"]


def test_responses_the_duplicate_dropped_is_the_one_not_kept():
    """``[output x, call x, output x]``: the output after the call is kept; the report said "the
    first is kept" of the one it dropped, the first."""
    history = [
        {"type": "function_call_output", "call_id": "x", "output": "early"},
        {"type": "function_call", "call_id": "x", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "x", "output": "late"},
    ]
    repaired = repair_history(history, "openai_responses")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("duplicate_result", 0)]
    assert "which is kept; this one was dropped" in repaired.repairs[0].detail
    assert [i.get("output") for i in repaired.messages] == [None, "late"]
