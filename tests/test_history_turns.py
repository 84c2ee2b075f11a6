"""History repair across turns, in Chat and Anthropic as in Responses, and the changes it used to make
without a report. Found by a tester: call ids reused across turns (``call_0`` in every turn) had a
later turn's result moved onto an earlier call (the later call got a placeholder) and a duplicate
of turn 1 took turn 2's place; a Chat ``type: "custom"`` call got a made-up ``function``; a
Responses input of a request with ``previous_response_id`` (its calls on the server) lost all its
outputs as orphans; an empty Chat ``tool_calls`` list was kept (OpenAI refuses it); an Anthropic
user message with text before its ``tool_result`` blocks was rewritten with no repair reported;
an Anthropic response with no content block left gave an assistant message with empty content."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.adapters import get_adapter
from toolfleet.dispatcher.history import repair_history

from .sdk_types import check_messages

SCALE = float(os.environ.get("TOOLFLEET_PROPERTY_SCALE", "1"))
FORMATS = ["openai_chat", "anthropic", "openai_responses"]


def kinds(repaired) -> list[tuple[str, str]]:
    return [(r.kind, r.call_id) for r in repaired.repairs]


def chat_call(call_id: str, name: str = "g") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def chat_turn(call_id: str, name: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [chat_call(call_id, name)]}


def tool_msg(call_id: str, text: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def use_turn(call_id: str, name: str) -> dict:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": name, "input": {}}]}


def result_block(call_id: str, text: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "content": text}


# 1. Chat custom calls

CUSTOM = {"id": "call_a", "type": "custom", "custom": {"name": "grammar", "input": "SELECT 1"}}


def test_chat_a_custom_call_with_its_result_needs_no_repair():
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [CUSTOM]},
               tool_msg("call_a", "done")]
    check_messages("openai_chat", history)
    repaired = repair_history(history, "openai_chat")
    assert repaired.ok and repaired.messages == history


def test_chat_a_custom_call_beside_a_function_call_with_null_arguments_stays_as_it_came():
    function = {"id": "call_f", "type": "function", "function": {"name": "list_dir", "arguments": None}}
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "content": None, "tool_calls": [CUSTOM, function]}]
    repaired = repair_history(history, "openai_chat")
    assert kinds(repaired) == [("arguments_normalized", "call_f"), ("missing_result", "call_a"),
                               ("missing_result", "call_f")]
    assert repaired.messages[1]["tool_calls"] == [CUSTOM, {**function, "function": {"name": "list_dir",
                                                                                     "arguments": "{}"}}]
    assert [m["tool_call_id"] for m in repaired.messages[2:]] == ["call_a", "call_f"]
    check_messages("openai_chat", repaired.messages)


# 2. and 3. call ids reused across turns, Chat and Anthropic

def test_chat_a_reused_id_whose_first_turn_lost_its_result_gets_the_placeholder_there():
    history = [{"role": "user", "content": "a"}, chat_turn("call_0", "delete_branch"), {"role": "user", "content": "b"},
               chat_turn("call_0", "get_weather"), tool_msg("call_0", "sunny, 21C")]
    repaired = repair_history(history, "openai_chat")
    assert [(r.kind, r.call_id, r.position) for r in repaired.repairs] == [("missing_result", "call_0", 1)]
    assert repaired.messages[2]["content"].startswith("Error [ABORTED]:")
    assert repaired.messages[3:] == history[2:]  # the weather stays the weather's
    check_messages("openai_chat", repaired.messages)


def test_chat_a_duplicate_in_the_first_turn_does_not_take_the_second_turns_place():
    history = [{"role": "user", "content": "a"}, chat_turn("call_0", "f"), tool_msg("call_0", "F"),
               tool_msg("call_0", "F again"), {"role": "user", "content": "b"}, chat_turn("call_0", "g"),
               tool_msg("call_0", "G")]
    repaired = repair_history(history, "openai_chat")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("duplicate_result", 3)]
    assert repaired.messages == history[:3] + history[4:]


def test_anthropic_a_reused_id_whose_first_turn_lost_its_result_gets_the_placeholder_there():
    history = [{"role": "user", "content": "a"}, use_turn("toolu_0", "f"), {"role": "user", "content": "b"},
               use_turn("toolu_0", "g"), {"role": "user", "content": [result_block("toolu_0", "G")]}]
    repaired = repair_history(history, "anthropic")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("missing_result", 1)]
    first = repaired.messages[2]["content"]
    assert first[0]["is_error"] is True and first[1] == {"type": "text", "text": "b"}
    assert repaired.messages[3:] == history[3:]
    check_messages("anthropic", repaired.messages)


def test_anthropic_a_duplicate_in_the_first_turn_does_not_take_the_second_turns_place():
    history = [{"role": "user", "content": "a"}, use_turn("toolu_0", "f"),
               {"role": "user", "content": [result_block("toolu_0", "F"), result_block("toolu_0", "F again")]},
               use_turn("toolu_0", "g"), {"role": "user", "content": [result_block("toolu_0", "G")]}]
    repaired = repair_history(history, "anthropic")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("duplicate_result", 2)]
    assert repaired.messages[2]["content"] == [result_block("toolu_0", "F")]
    assert repaired.messages[4] == history[4]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_duplicate_in_a_later_turn_does_not_answer_an_earlier_turns_call(fmt):
    """Turn 1 lost its result, turn 2's is written twice: the copy is turn 2's, not turn 1's
    (it was moved onto turn 1's call, in Chat and Anthropic, and kept as its answer, in Responses)."""
    history, results = _turns(fmt, [["call_0"], ["call_0"]])
    lost = _without(_twice(history, results[1][0]), results[0][0])
    repaired = repair_history(lost, fmt)
    assert sorted((r.kind, r.position) for r in repaired.repairs) == [("duplicate_result", len(lost) - 1),
                                                                      ("missing_result", results[0][1])]
    assert _answers(fmt, repaired.messages) == ["ABORTED", "1:call_0"]


def test_responses_calls_of_one_id_in_one_run_keep_their_outputs():
    """Calls without ids in one response: each output answers one; with one lost, the first call
    gets the placeholder, right after it, and the history is sound when repaired again."""
    call = {"type": "function_call", "call_id": "", "name": "g", "arguments": "{}"}
    history = [call, dict(call), {"type": "function_call_output", "call_id": "", "output": "one"},
               {"type": "function_call_output", "call_id": "", "output": "two"}]
    repaired = repair_history(history, "openai_responses")
    assert repaired.ok and repaired.messages == history
    repaired = repair_history(history[:3], "openai_responses")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("missing_result", 0)]
    assert [i.get("output", "")[:7] for i in repaired.messages] == ["", "Error [", "", "one"]
    assert repair_history(repaired.messages, "openai_responses").ok


def test_chat_one_message_calling_one_id_twice_keeps_its_results_in_order():
    """Calls of one id in one message (a server that sends no ids) take its results first come."""
    history = [{"role": "user", "content": "a"},
               {"role": "assistant", "content": None, "tool_calls": [chat_call(""), chat_call("")]},
               tool_msg("", "one"), tool_msg("", "two")]
    repaired = repair_history(history, "openai_chat")
    assert repaired.ok and repaired.messages == history


def _turns(fmt: str, turns: list[list[str]]) -> tuple[list, list[tuple[int, int, str]]]:
    """A sound history (each turn's calls, then their results in call order; ids reused across
    turns), and where each result is: (its index, the position of its call's message or item, id)."""
    history: list = []
    results = []
    for n, ids in enumerate(turns):
        history.append({"role": "user", "content": f"turn {n}"})
        if fmt == "openai_chat":
            at = len(history)
            history.append({"role": "assistant", "content": None, "tool_calls": [chat_call(i) for i in ids]})
            for i in ids:
                results.append((len(history), at, i))
                history.append(tool_msg(i, f"{n}:{i}"))
        elif fmt == "anthropic":
            at = len(history)
            history.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": i, "name": "g", "input": {}} for i in ids]})
            results += [((len(history), k), at, i) for k, i in enumerate(ids)]
            history.append({"role": "user", "content": [result_block(i, f"{n}:{i}") for i in ids]})
        else:
            start = len(history)
            history += [{"type": "function_call", "call_id": i, "name": "g", "arguments": "{}"} for i in ids]
            for k, i in enumerate(ids):
                results.append((len(history), start + k, i))
                history.append({"type": "function_call_output", "call_id": i, "output": f"{n}:{i}"})
    return history, results


def _without(history: list, where) -> list:
    """``history`` without the result at ``where`` (an index; Anthropic: (message, block))."""
    if isinstance(where, int):
        return history[:where] + history[where + 1:]
    message, block = where
    content = history[message]["content"][:block] + history[message]["content"][block + 1:]
    return history[:message] + [{**history[message], "content": content or "go on"}] + history[message + 1:]


def _twice(history: list, where) -> list:
    if isinstance(where, int):
        return history[:where + 1] + [dict(history[where])] + history[where + 1:]
    message, block = where
    content = history[message]["content"]
    content = content[:block + 1] + [dict(content[block])] + content[block + 1:]
    return history[:message] + [{**history[message], "content": content}] + history[message + 1:]


def _answers(fmt: str, messages: list) -> list[str]:
    """Each result's text, in order (a placeholder's as "ABORTED")."""
    if fmt == "anthropic":
        texts = [b["content"] for m in messages if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "tool_result"]
    else:
        texts = [m["content"] if fmt == "openai_chat" else m["output"] for m in messages
                 if m.get("role") == "tool" or m.get("type") == "function_call_output"]
    return ["ABORTED" if t.startswith("Error [ABORTED]") else t for t in texts]


TURNS = st.lists(st.lists(st.sampled_from(["call_0", "call_1", "call_2"]), min_size=1, max_size=3, unique=True),
                 min_size=2, max_size=5)


@settings(max_examples=int(300 * SCALE), derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), turns=TURNS, data=st.data())
def test_a_lost_result_of_a_reused_id_gets_its_placeholder_and_no_other_result_moves(fmt, turns, data):
    """Ids repeat across turns; one result is lost: exactly its call gets a placeholder, every other
    result stays with its own turn's call. One result written twice: exactly the copy is dropped."""
    history, results = _turns(fmt, turns)
    n = data.draw(st.integers(0, len(results) - 1))
    where, at_call, call_id = results[n]
    repaired = repair_history(_without(history, where), fmt)
    assert [(r.kind, r.call_id, r.position) for r in repaired.repairs] == [("missing_result", call_id, at_call)]
    want = _answers(fmt, history)
    want[n] = "ABORTED"
    got = _answers(fmt, repaired.messages)  # Responses: the placeholder right after its call, the rest in place
    assert got == want if fmt != "openai_responses" else sorted(got) == sorted(want)
    check_messages(fmt, repaired.messages)
    repaired = repair_history(_twice(history, where), fmt)
    assert [(r.kind, r.call_id) for r in repaired.repairs] == [("duplicate_result", call_id)]
    assert repaired.messages == history


# 4. Responses: calls on the server

OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "42"}


@pytest.mark.parametrize("history", [
    [OUTPUT],  # previous_response_id: the outputs alone
    [OUTPUT, {**OUTPUT, "call_id": "call_2"}, {"role": "user", "content": "and?"}],
    [{"type": "item_reference", "id": "fc_1"}, OUTPUT],
    [{"type": "custom_tool_call_output", "call_id": "call_c", "output": "x"}],
])
def test_responses_outputs_whose_calls_are_on_the_server_are_kept(history):
    repaired = repair_history(history, "openai_responses")
    assert repaired.ok and repaired.messages == history


def test_responses_with_an_item_reference_a_call_in_the_input_is_still_repaired():
    call = {"type": "function_call", "call_id": "call_9", "name": "g", "arguments": "{}"}
    history = [{"type": "item_reference", "id": "fc_1"}, OUTPUT, call]
    repaired = repair_history(history, "openai_responses")
    assert kinds(repaired) == [("missing_result", "call_9")]
    assert repaired.messages[:3] == history and repaired.messages[3]["call_id"] == "call_9"
    check_messages("openai_responses", repaired.messages)


def test_responses_an_orphan_in_an_input_holding_its_calls_is_still_dropped():
    call = {"type": "function_call", "call_id": "call_9", "name": "g", "arguments": "{}"}
    history = [call, {**OUTPUT, "call_id": "call_9"}, OUTPUT]
    repaired = repair_history(history, "openai_responses")
    assert kinds(repaired) == [("orphan_result", "call_1")] and repaired.messages == history[:2]


# 5. Chat: an empty tool_calls list

def test_chat_an_empty_tool_calls_list_is_dropped_and_reported():
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "hi", "tool_calls": []},
               {"role": "user", "content": "b"}]
    repaired = repair_history(history, "openai_chat")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("empty_tool_calls_removed", 1)]
    assert repaired.messages[1] == {"role": "assistant", "content": "hi"}
    check_messages("openai_chat", repaired.messages)
    assert history[1]["tool_calls"] == []  # the input is never changed


def test_chat_an_assistant_message_of_only_an_empty_tool_calls_list_is_removed():
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": []},
               {"role": "user", "content": "b"}, chat_turn("c", "g"), tool_msg("c", "ok")]
    repaired = repair_history(history, "openai_chat")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("empty_tool_calls_removed", 1),
                                                                ("empty_message_removed", 1)]
    assert repaired.messages == [history[0], *history[2:]]


# 6. every change reported

def test_anthropic_text_before_the_tool_results_is_moved_after_them_and_reported():
    history = [{"role": "user", "content": "a"}, use_turn("t0", "f"),
               {"role": "user", "content": [{"type": "text", "text": "note"}, result_block("t0", "r")]}]
    repaired = repair_history(history, "anthropic")
    assert [(r.kind, r.position) for r in repaired.repairs] == [("reordered_results", 2)]
    assert repaired.messages[2]["content"] == [result_block("t0", "r"), {"type": "text", "text": "note"}]
    check_messages("anthropic", repaired.messages)


def test_results_all_in_place_in_another_order_are_kept_as_they_are():
    """Neither API asks for results in call order: all there, they stay as given (the repair used
    to put them in call order without saying so)."""
    chat = [{"role": "assistant", "content": None, "tool_calls": [chat_call("a"), chat_call("b")]},
            tool_msg("b", "B"), tool_msg("a", "A")]
    repaired = repair_history(chat, "openai_chat")
    assert repaired.ok and repaired.messages == chat
    anthropic = [{"role": "assistant", "content": [{"type": "tool_use", "id": i, "name": "g", "input": {}}
                                                   for i in "ab"]},
                 {"role": "user", "content": [result_block("b", "B"), result_block("a", "A")]}]
    repaired = repair_history(anthropic, "anthropic")
    assert repaired.ok and repaired.messages == anthropic


def test_results_among_which_one_is_repaired_are_put_in_call_order_and_reported():
    chat = [{"role": "assistant", "content": None, "tool_calls": [chat_call(i) for i in "abc"]},
            tool_msg("b", "B"), tool_msg("a", "A"), {"role": "user", "content": "x"}, tool_msg("c", "C")]
    repaired = repair_history(chat, "openai_chat")
    assert sorted(r.kind for r in repaired.repairs) == ["moved_result", "reordered_results"]
    assert [m.get("tool_call_id") for m in repaired.messages[1:4]] == ["a", "b", "c"]


def test_a_moved_result_or_a_placeholder_among_results_in_order_is_no_reordering():
    history = [{"role": "assistant", "content": None, "tool_calls": [chat_call(i) for i in "abc"]},
               tool_msg("a", "A"), tool_msg("c", "C"), {"role": "user", "content": "x"}]
    assert kinds(repair_history(history, "openai_chat")) == [("missing_result", "b")]
    assert kinds(repair_history(history + [tool_msg("b", "B")], "openai_chat")) == [("moved_result", "b")]


IDS = st.sampled_from(["a", "b", ""])


@st.composite
def any_history(draw, fmt: str) -> list:
    """Messages or items of ``fmt`` in any order: calls, results (also of no call, twice, early),
    text, empty text blocks, null arguments, empty tool_calls lists, item references."""
    out: list = []
    for _ in range(draw(st.integers(0, 8))):
        ids = draw(st.lists(IDS, max_size=3))
        if fmt == "openai_chat":
            kind = draw(st.sampled_from(["user", "calls", "result", "result", "empty"]))
            if kind == "calls":
                arguments = draw(st.sampled_from(["{}", None]))
                out.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "g", "arguments": arguments}} for i in ids]
                    or [CUSTOM]})
            elif kind == "result":
                out.append(tool_msg(draw(IDS), draw(st.sampled_from(["x", "y"]))))
            elif kind == "empty":
                out.append({"role": "assistant", "content": draw(st.sampled_from([None, "hi"])), "tool_calls": []})
            else:
                out.append({"role": "user", "content": "u"})
        elif fmt == "anthropic":
            role = draw(st.sampled_from(["user", "assistant"]))
            blocks = []
            for i in ids:
                block = draw(st.sampled_from(["use", "result", "text", "blank"]))
                blocks.append({"type": "tool_use", "id": i, "name": "g", "input": {}} if block == "use" and
                              role == "assistant" else result_block(i, "r") if block in ("use", "result")
                              else {"type": "text", "text": " " if block == "blank" else "t"})
            out.append({"role": role, "content": blocks or "words"})
        else:
            kind = draw(st.sampled_from(["user", "call", "custom", "output", "output", "reference"]))
            call_id = draw(IDS)
            out.append({"role": "user", "content": "u"} if kind == "user" else
                       {"type": "item_reference", "id": "fc_1"} if kind == "reference" else
                       {"type": "function_call", "call_id": call_id, "name": "g",
                        "arguments": draw(st.sampled_from(["{}", None]))} if kind == "call" else
                       {"type": "custom_tool_call", "call_id": call_id, "name": "c", "input": "i"} if kind == "custom"
                       else {"type": draw(st.sampled_from(["function_call_output", "custom_tool_call_output"])),
                             "call_id": call_id, "output": "o"})
    return out


@settings(max_examples=int(600 * SCALE), derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fmt=st.sampled_from(FORMATS), data=st.data())
def test_a_history_reported_ok_is_the_history_as_given(fmt, data):
    """Every change is reported: ``ok`` means the messages are the history. One repair is enough
    (the repaired history needs none), and what it gives passes the SDK types."""
    history = data.draw(any_history(fmt))
    repaired = repair_history(history, fmt)
    if repaired.ok:
        assert repaired.messages == history
    again = repair_history(repaired.messages, fmt)
    assert again.ok, again.repairs
    check_messages(fmt, repaired.messages)


# also found: a message dict holding the SDK's own tool calls or blocks raised AttributeError

def test_a_message_dict_holding_sdk_calls_or_blocks_is_read():
    from anthropic.types import ToolUseBlock
    from openai.types.chat import ChatCompletionMessageToolCall

    call = ChatCompletionMessageToolCall(id="a", type="function", function={"name": "g", "arguments": "{}"})
    repaired = repair_history([{"role": "assistant", "content": None, "tool_calls": [call]}], "openai_chat")
    assert kinds(repaired) == [("missing_result", "a")]
    assert repaired.messages[0]["tool_calls"] == [chat_call("a")]
    block = ToolUseBlock(id="t", type="tool_use", name="g", input={})
    history = [{"role": "assistant", "content": [block]}, {"role": "user", "content": [result_block("t", "x")]}]
    repaired = repair_history(history, "anthropic")
    assert repaired.ok and repaired.messages[0]["content"] == [{"type": "tool_use", "id": "t", "name": "g",
                                                                "input": {}}]


def test_anthropic_one_result_block_listed_twice_is_a_reported_duplicate():
    block = result_block("t", "x")
    history = [use_turn("t", "g"), {"role": "user", "content": [block, block]}]
    repaired = repair_history(history, "anthropic")
    assert kinds(repaired) == [("duplicate_result", "t")] and repaired.messages[1]["content"] == [block]


# 7. Anthropic: a response with no content block left

@pytest.mark.parametrize("content", [[], [{"type": "text", "text": " \n"}], [{"type": "text", "text": ""}]])
def test_anthropic_a_response_with_no_block_left_gives_no_assistant_message(content):
    response = {"id": "msg_1", "type": "message", "role": "assistant", "content": content, "stop_reason": "end_turn"}
    assert get_adapter("anthropic").assistant_messages(response) == []
    # as history repair does with such a message
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": content},
               {"role": "user", "content": "b"}]
    assert repair_history(history, "anthropic").messages == [history[0], history[2]]


def test_anthropic_stream_with_no_block_gives_no_assistant_message():
    events = [{"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                                                    "content": [], "model": "x"}},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, {"type": "message_stop"}]
    assert get_adapter("anthropic_stream").assistant_messages(events) == []
