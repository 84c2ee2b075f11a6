"""``Dispatcher.submit`` / ``run`` take the calls as :class:`ToolCall` objects or as dicts in
their shape; anything else is a ``TypeError`` that says what to pass. Found by a newcomer: the
README's ``dispatcher.submit(calls, ...)`` with dicts failed deep inside with ``AttributeError:
'dict' object has no attribute 'id'``, which does not point at the fix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from toolfleet import ErrorCode
from toolfleet.dispatcher.wire import tool_calls
from toolfleet.models import ToolCall


def test_dicts_run_as_calls_paired_by_id_in_model_order(worker, dispatcher, workspace):
    """A real worker: dicts with an object or a JSON text as arguments run as the calls they
    describe; a bad one is that call's error result, the others still run."""
    (workspace / "a.txt").write_text("alpha\n")
    calls = [{"id": "d1", "name": "read_file", "arguments": {"path": "a.txt"}},
             {"id": "d2", "name": "read_file", "arguments": '{"path": "a.txt"}'},
             {"id": "d3", "name": "read_file", "arguments": {"limit": "ten"}},
             ToolCall(id="d4", name="read_file", arguments={"path": "a.txt"}, index=3)]
    results = dispatcher.run(calls, workspace=str(workspace), timeout_s=60)
    assert [r.call_id for r in results] == ["d1", "d2", "d3", "d4"]
    assert [r.ok for r in results] == [True, True, False, True]
    assert "alpha" in results[0].content and "alpha" in results[3].content
    assert results[2].code is ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("calls", ["read_file", b"x", {"id": "c1", "name": "read_file"}, [42], [("c1", "read_file")],
                                   [None]])
def test_what_is_not_a_call_says_what_to_pass(dispatcher, calls):
    with pytest.raises(TypeError, match="ToolCall"):
        dispatcher.submit(calls)


@given(st.lists(st.one_of(
    st.dictionaries(st.sampled_from(["id", "name", "arguments", "index", "input", "type"]),
                    st.one_of(st.none(), st.integers(), st.text(max_size=5),
                              st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)), max_size=5),
    st.integers(), st.text(max_size=5), st.none()), max_size=5))
def test_any_list_becomes_calls_or_a_clear_error(items):
    """Whatever the list holds: ToolCalls in order (a dict's index defaults to its position), or
    ``TypeError`` / pydantic's ``ValidationError``, never an ``AttributeError`` from deep inside."""
    try:
        calls = tool_calls(items)
    except (TypeError, ValidationError):
        return
    assert all(isinstance(c, ToolCall) for c in calls) and len(calls) == len(items)
    for position, (call, item) in enumerate(zip(calls, items, strict=True)):
        assert call.index == item.get("index", position)
