"""Issue 11, case 4: text Redis and JSON cannot carry (lone surrogates, control characters) is
stopped before anything is sent, and no turn leaves a thread behind or a loop that never ends."""

from __future__ import annotations

import json
import threading
import time

import pytest

from toolfleet import BrokerUnavailable, ErrorCode, ToolCall
from toolfleet.dispatcher.wire import MAX_CALL_ID_CHARS
from toolfleet.errors import BatchRejected, ToolfleetError

from .faults import call

BAD_IDS = ["call_\ud800", "call\x00nul", "call\nline", "x" * (MAX_CALL_ID_CHARS + 1),
           # credential-shaped ids would be Celery task ids, unmasked in Flower and the audit trail
           "ghp_" + "Zb3" * 12, "sk-ant-api03-" + "A1b2" * 10]


def driver_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("toolfleet-turn-") and t.is_alive()]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_bad_call_id_refuses_the_batch_before_anything_is_sent(dispatcher, worker, workspace, bad_id):
    before = set(driver_threads())
    response = {"id": "r", "object": "chat.completion", "model": "m", "choices": [{"index": 0, "finish_reason":
                "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_ok", "type": "function",
                     "function": {"name": "wait_read", "arguments": '{"label": "a"}'}},
                    {"id": bad_id, "type": "function",
                     "function": {"name": "wait_read", "arguments": '{"label": "b"}'}}]}}]}
    with pytest.raises(BatchRejected) as caught:
        dispatcher.submit_response(response, workspace=str(workspace))
    assert caught.value.reason == "bad_call_id"
    assert bad_id.strip("x") == "" or bad_id[:8] not in str(caught.value)  # a credential-shaped id is not echoed
    assert set(driver_threads()) <= before, "a refused submit left its driver thread behind"


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_a_bad_turn_id_is_refused_before_anything_is_written(dispatcher, bad_id):
    """A turn id is the other half of every call's task id (``<turn>:<call>``: Flower, task events,
    the worker's log, the JSON result log): a caller's own turn id that is credential-shaped, holds
    a control character or is past the length limit is refused as a call id is (it went to Flower
    unmasked), and nothing of the turn is written."""
    from toolfleet.keys import Keys

    with pytest.raises(ToolfleetError) as caught:
        dispatcher.submit([call("c", "wait_read", label="a")], turn_id=bad_id)
    assert bad_id.strip("x") == "" or bad_id[:8] not in str(caught.value)
    key = Keys(dispatcher.settings.namespace).turn_calls(bad_id.encode("utf-8", "surrogatepass").decode("latin-1"))
    assert not dispatcher.ledger.redis.exists(key)


def gateway_call_id(n: int, size: int = 2400, tail: bytes = b"") -> str:
    """A call id as LiteLLM writes it in front of Gemini 3 (BerriAI/litellm#16895): the model's
    thought signature, standard base64, after ``__thought__`` (about 950 characters there, "multiple
    KB" in other reports); Gemini refuses the next request unless the id comes back unchanged.
    ``tail``: the signature's last bytes (they pick the base64's last characters)."""
    import base64

    signature = base64.b64encode(bytes((n * 7 + i * 31) % 256 for i in range(size)) + tail).decode()
    return f"call_{n:024x}__thought__{signature}"


def gateway_chat_turn(dispatcher, workspace, ids: list[str]):
    """A Gemini Chat Completions response through LiteLLM: one ``wait_read`` call per id, submitted."""
    response = {"id": "r", "object": "chat.completion", "model": "gemini-3-pro-preview", "choices": [
        {"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": "wait_read", "arguments": json.dumps({"label": f"l{n}"})}}
            for n, cid in enumerate(ids)]}}]}
    return dispatcher.submit_response(response, workspace=str(workspace))


def test_a_gateways_long_call_ids_run_and_their_results_pair_with_them(dispatcher, worker, workspace):
    """A batch whose ids carry a Gemini thought signature (LiteLLM's Chat Completions, 3,240
    characters here) was refused whole, ``bad_call_id`` "longer than 256": no call of any such
    response ever ran. Its calls run and each result goes back under its own id, unchanged."""
    ids = [gateway_call_id(0), gateway_call_id(1)]
    turn = gateway_chat_turn(dispatcher, workspace, ids)
    results = turn.results(60)
    assert [r.call_id for r in results] == ids and all(r.ok for r in results), [r.content for r in results]
    assert [m["tool_call_id"] for m in turn.messages()] == ids
    assert [c["id"] for c in turn.assistant_messages()[0]["tool_calls"]] == ids


def test_a_gateway_id_whose_signature_ends_like_a_password_assignment_runs(dispatcher, worker, workspace):
    """About one random thought signature in 500 ends ``...Pw==`` (camel-case ``Pw``, the
    password name, then ``=``, then the padding ``=`` as its "value"), so the credential-shape check
    refused the batch whole (``bad_call_id``): none of that response's calls ran. Padding is no
    secret: the ids run, unchanged."""
    ids = [gateway_call_id(0, size=696, tail=b"\0\0\x1a?"), gateway_call_id(1)]  # base64 padding: ...AAAaPw==
    assert ids[0].endswith("aPw==")
    turn = gateway_chat_turn(dispatcher, workspace, ids)
    results = turn.results(60)
    assert [r.call_id for r in results] == ids and all(r.ok for r in results), [r.content for r in results]
    assert [m["tool_call_id"] for m in turn.messages()] == ids


def test_stream_valid_call_then_surrogate_id_ends_with_results(dispatcher, worker, workspace):
    """A valid call, then a call whose id holds a lone surrogate: the stream is refused at that
    call, and the turn still ends (the valid call has its result) instead of timing out."""
    stream = dispatcher.open_stream(format="openai_chat_stream", workspace=str(workspace))

    def chunk(index: int, call_id: str, label: str) -> dict:
        return {"id": "s", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {
            "tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": "wait_read", "arguments": f'{{"label": "{label}"}}'}}]},
            "finish_reason": None}]}

    stream.feed(chunk(0, "call_ok", "a"))
    with pytest.raises(BatchRejected) as caught:
        stream.feed(chunk(1, "call_\ud800", "b"))
        stream.close()
    assert caught.value.reason == "bad_call_id"
    began = time.monotonic()
    results = stream.turn.results(90)
    assert time.monotonic() - began < 10
    assert [r.call_id for r in results] == ["call_ok"]
    assert results[0].ok or results[0].code in (ErrorCode.NOT_EXECUTED, ErrorCode.CANCELLED)
    stream.turn._thread.join(5)
    assert not stream.turn._thread.is_alive()


def test_surrogates_in_name_or_arguments_are_call_errors(dispatcher, worker, workspace):
    calls = [call("good", "wait_read", label="a"),
             ToolCall(id="name", name="wait_\ud800read", arguments={"label": "a"}),
             ToolCall(id="argv", name="wait_read", arguments={"label": "a\udc80"}),
             ToolCall(id="raw", name="wait_read", arguments='{"label": "\\ud800"}'),
             ToolCall(id="key", name="wait_read", arguments={"label": "a", "\ud800": 1}),
             ToolCall(id="nul", name="wait_read", arguments={"label": "nul\x00inside"})]
    results = {r.call_id: r for r in dispatcher.run(calls, workspace=str(workspace), timeout_s=30)}
    assert results["good"].ok and results["nul"].ok, results
    assert results["name"].code is ErrorCode.UNKNOWN_TOOL and results["name"].name == "wait_\ufffdread"
    for cid in ("argv", "raw", "key"):
        assert results[cid].code is ErrorCode.INVALID_ARGUMENT, results[cid].content
        assert "lone surrogate" in results[cid].content


def test_persistent_redis_errors_end_the_turn_within_its_bound(dispatcher, worker, workspace, monkeypatch):
    """Every read of the turn's events fails (Redis gone for good): the turn ends within
    REDIS_GIVE_UP_S (shortened here) with BrokerUnavailable for the caller, a final result for
    each call, and its driver thread gone."""
    from toolfleet.dispatcher import turn_driver

    monkeypatch.setattr(turn_driver, "REDIS_GIVE_UP_S", 2.0)
    turn = dispatcher.submit([call("slow", "wait_read", label="a", seconds=8)], workspace=str(workspace))
    import redis

    def dead(*args, **kwargs):
        raise redis.ConnectionError("Redis went away (test)")

    monkeypatch.setattr(dispatcher.ledger, "events", dead)
    began = time.monotonic()
    with pytest.raises(BrokerUnavailable):
        turn.results(30)
    assert time.monotonic() - began < 2.0 + 3.0
    assert turn.result("slow").code is ErrorCode.OUTCOME_UNKNOWN
    turn._thread.join(5)
    assert not turn._thread.is_alive()
    turn.cancel()


def test_a_driver_fault_ends_the_turn_instead_of_looping(dispatcher, worker, workspace, monkeypatch):
    """A fault of ours inside a tick (any exception but a Redis error) is not retried forever."""
    turn = dispatcher.submit([call("slow", "wait_read", label="a", seconds=8)], workspace=str(workspace))

    def broken():
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(turn._watch, "tick", broken)
    began = time.monotonic()
    with pytest.raises(ToolfleetError, match="driver failed"):
        turn.results(30)
    assert time.monotonic() - began < 5
    turn._thread.join(5)
    assert not turn._thread.is_alive()
    turn.cancel()


def test_a_submit_the_broker_refuses_leaves_no_thread(dispatcher, worker, workspace, monkeypatch):
    """The broker refuses the batch (BrokerUnavailable): the caller gets the error, every call of
    the abandoned turn a final result, and its driver thread is gone."""
    before = set(driver_threads())

    def refuse(**kwargs):
        raise BrokerUnavailable(dispatcher.settings.redis_url, "refused (test)")

    monkeypatch.setattr(dispatcher.submitter, "send", refuse)
    with pytest.raises(BrokerUnavailable):
        dispatcher.submit([call("a", "wait_read", label="a"), call("b", "wait_read", label="b")],
                          workspace=str(workspace), turn_id="refused-turn")
    assert set(driver_threads()) <= before, "a failed submit left its driver thread behind"


def test_surrogates_in_turn_options_are_a_clear_error(dispatcher, workspace):
    for options in ({"session_id": "s\ud800"}, {"turn_id": "t\udc00"}, {"workspace": str(workspace) + "\ud800"}):
        with pytest.raises(ToolfleetError, match="lone surrogate"):
            dispatcher.submit([call("a", "wait_read", label="a")], **options)
