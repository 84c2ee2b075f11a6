"""Responses output items of server-run tools go back with the fields the API requires even when
null (adapter level, no workers)."""

from __future__ import annotations

from toolfleet.dispatcher.adapters import get_adapter

from .sdk_types import check_messages

CODE = {"type": "code_interpreter_call", "id": "ci_1", "code": "print(1)", "container_id": "cntr_1",
        "outputs": None, "status": "completed"}  # outputs: null unless include=["code_interpreter_call.outputs"]
IMAGE = {"type": "image_generation_call", "id": "ig_1", "result": None, "status": "failed"}
CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "read_file", "arguments": "{}",
        "status": "completed"}


def test_required_null_fields_of_server_tool_items_are_kept():
    for name in ("openai_responses", "openai_responses_stream"):
        adapter = get_adapter(name)
        payload = {"output": [CODE, IMAGE, CALL]}
        if name.endswith("_stream"):
            payload = [{"type": "response.completed", "response": {"status": "completed", **payload}}]
        items = adapter.assistant_messages(payload)
        assert items[0]["outputs"] is None and items[0]["code"] == "print(1)", items[0]
        assert "result" in items[1] and items[1]["result"] is None, items[1]
        check_messages("openai_responses", items)


def test_a_null_code_is_kept_too_and_other_nulls_still_go():
    code = {**CODE, "code": None}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "status": None, "encrypted_content": None}
    items = get_adapter("openai_responses").assistant_messages({"output": [reasoning, code, CALL]})
    assert items[0] == {"type": "reasoning", "id": "rs_1", "summary": []}
    assert "code" in items[1] and items[1]["code"] is None
    check_messages("openai_responses", items)
