"""History repair is linear in the history (toolfleet/dispatcher/history.py), with what it did
before: no Redis needed. The reference is ``_Results.take`` as it was: every result of an id
looked at from the first at each call of that id."""

from __future__ import annotations

import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.dispatcher.history import repair_history
from toolfleet.dispatcher.history_pairing import Results as _Results


class Searching(_Results):
    def take(self, call_id: str) -> tuple[int, Any] | None:
        for position, result in self.by_id.get(call_id, ()):
            if id(result) not in self.taken:
                self.taken.add(id(result))
                return position, result
        return None


objects = [{"n": i} for i in range(4)]  # one object may be listed twice (a message holding a block twice)
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", ""]), st.integers(0, 3)),
    st.tuples(st.just("take"), st.sampled_from(["a", "b", "", "c"]), st.just(0)),
), max_size=40)


@settings(max_examples=500, deadline=None)
@given(steps)
def test_take_hands_out_what_the_search_handed_out(ops):
    new, old = _Results(), Searching()
    for position, (op, call_id, n) in enumerate(ops):
        if op == "add":
            new.add(call_id, position, objects[n])
            old.add(call_id, position, objects[n])
        else:
            assert new.take(call_id) == old.take(call_id)
    new_repairs, old_repairs = [], []
    new.leftovers({"a", ""}, new_repairs)
    old.leftovers({"a", ""}, old_repairs)
    assert new_repairs == old_repairs


def test_a_history_whose_calls_share_one_id_is_repaired_in_linear_time():
    """8,000 chat calls all with the id "" took 12.4 s (2,000: 0.28 s); Anthropic's 8.0 s."""
    n = 8_000
    chat: list[Any] = [{"role": "user", "content": "go"}]
    anthropic: list[Any] = [{"role": "user", "content": "go"}]
    for _ in range(n):
        chat += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": "", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "", "content": "ok"}]
        anthropic += [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}]
    responses: list[Any] = [{"role": "user", "content": "go"}]
    for k in range(n):  # every other call lost its output: those get placeholders
        responses.append({"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"})
        if k % 2:
            responses.append({"type": "function_call_output", "call_id": "", "output": "ok"})
    started = time.perf_counter()
    assert repair_history(chat, "openai_chat").ok
    assert repair_history(anthropic, "anthropic").ok
    assert len(repair_history(responses, "openai_responses").repairs) == n // 2
    assert time.perf_counter() - started < 8.0
