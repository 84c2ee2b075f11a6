"""Secrets a careless tool quotes or logs, through a real worker: the call's own secret argument
values are masked in its error message (worker/redaction.py ``mask_known_secrets``), and

- before anything stores the result: the idempotency journal recorded the handler's result before
  that masking (worker/side_effects.py ``_journaled`` -> ``journal.finish``), so a journaled write
  whose failure quoted a declared ``sensitive`` value left that value in Redis for
  ``journal_ttl_s`` (now masked in ``execute._run_handler``);
- in the worker's log while the call runs: the log redaction knew only secret *shapes*, so a
  tool's own ``log.warning("%s", password)`` reached the worker log as it was (now
  ``redaction.call_secrets``, threads the handler starts included).
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from toolfleet import Dispatcher, ToolCall, default_registry
from toolfleet.keys import Keys
from toolfleet.redis_client import client_for
from toolfleet.worker.redaction import _redact_record, call_secrets, redacted_failure, running_call_secrets

WAIT_S = 60
TOOLS = "tests.tools_for_secrets"
PIN = "PinNoShape-40417"
PASSWORD = "PwNoShape-77316"


def call(cid: str, name: str, index: int, **arguments) -> ToolCall:
    return ToolCall(id=cid, name=name, arguments=json.dumps(arguments), index=index)


def namespace_dump(settings) -> str:
    """Every key of the test's namespace and its value, as text."""
    client = client_for(settings.ledger)
    out = []
    for key in client.scan_iter(match=f"{settings.namespace}[:.]*", count=500):
        kind = client.type(key).decode()
        if kind == "hash":
            value = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in client.hgetall(key).items()}
        elif kind == "string":
            value = client.get(key).decode(errors="replace")
        elif kind == "stream":
            value = [[i.decode(), {k.decode(): v.decode(errors="replace") for k, v in f.items()}]
                     for i, f in client.xrange(key)]
        elif kind == "list":
            value = [v.decode(errors="replace") for v in client.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(v.decode(errors="replace") for v in client.smembers(key))
        elif kind == "zset":
            value = [v.decode(errors="replace") for v in client.zrange(key, 0, -1)]
        else:
            value = kind
        out.append(json.dumps([key.decode(errors="replace"), value], default=str))
    return "\n".join(out)


def test_journal_entry_keeps_the_sensitive_value_the_error_message_masks(settings, start_worker, workspace):
    start_worker(tools=TOOLS)
    with Dispatcher(settings, default_registry([TOOLS])) as d:
        turn = d.submit([call("pay", "charge_card", 0, card="visa-1", pin=PIN)], workspace=str(workspace))
        [result] = turn.results(WAIT_S)
    # the result the ledger holds (and the model reads) has it masked, as docs/secrets.md promises
    assert result.error is not None and PIN not in result.error.message and "***" in result.error.message
    client = client_for(settings.ledger)
    journal = {k.decode(): v.decode() for key in client.scan_iter(match=f"{Keys(settings.namespace).ns}:journal:*")
               for k, v in client.hgetall(key).items()}
    assert journal, "charge_card is a journaled write: its entry should be there"
    # ...but the journal entry in Redis holds the handler's unmasked message
    assert PIN not in json.dumps(journal), journal
    assert PIN not in namespace_dump(settings)


def test_a_tool_logging_its_password_argument_is_masked_in_the_worker_log(settings, start_worker, workspace,
                                                                          tmp_path):
    log_path = tmp_path / "worker.log"
    worker = start_worker(tools=TOOLS, log_path=log_path)
    with Dispatcher(settings, default_registry([TOOLS])) as d:
        turn = d.submit([call("in", "sign_in", 0, user="alice", password=PASSWORD)], workspace=str(workspace))
        [result] = turn.results(WAIT_S)
    assert result.ok, result
    worker.stop()  # joined: every line is written
    log = worker.log_text()
    assert "sign_in: trying alice / " in log, log[-2000:]
    assert PASSWORD not in log, [line for line in log.splitlines() if PASSWORD in line]


def test_a_password_a_tool_quotes_url_encoded_is_masked_in_its_error(settings, start_worker, workspace):
    """A tool quoting the URL it built (requests' ``HTTPError``: ``... for url: https://...?p=...``)
    quotes its secret argument percent-encoded (``/`` as ``%2F``, a space as ``+``): the call's
    secret values were masked only as written, in JSON and as ``repr`` writes them."""
    from urllib.parse import quote, quote_plus

    password = "Pw/No+Shape 77&x"
    start_worker(tools=TOOLS)
    with Dispatcher(settings, default_registry([TOOLS])) as d:
        turn = d.submit([call("rep", "fetch_report", 0, user="alice", password=password)], workspace=str(workspace))
        [result] = turn.results(WAIT_S)
    assert result.error is not None and "reports.example.com/login?u=alice&p=***" in result.error.message, result
    stored = namespace_dump(settings)
    for form in (password, quote_plus(password), quote(password), quote(password, safe="")):
        assert form not in result.content and form not in stored, form


def logged(message: str, *args: object) -> str:
    """``message % args`` as the worker's log redaction leaves it."""
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, message, args, None)
    _redact_record(record)
    return record.getMessage()


def test_a_running_call_s_secret_values_are_masked_in_its_threads_and_forgotten_after():
    arguments = {"user": "alice", "password": PASSWORD, "config": {"headers": {"X-Api-Key": "NoShapeKey-123"}},
                 "card": "visa-1", "pin": PIN}
    seen: list[str] = []
    with call_secrets(arguments, ("pin",)):
        assert logged("trying %s / %s", "alice", PASSWORD) == "trying alice / ***"
        thread = threading.Thread(target=lambda: seen.append(logged("key %s pin %s", "NoShapeKey-123", PIN)))
        thread.start()
        thread.join()
    assert seen == ["key *** pin ***"]  # a plain thread the handler starts: no context variable reaches it
    assert running_call_secrets() == ()
    assert logged("after: %s", PASSWORD) == f"after: {PASSWORD}"  # nothing to mask once the call is over

    with pytest.raises(RuntimeError), call_secrets({"password": PASSWORD}):
        raise RuntimeError("the handler failed")
    assert running_call_secrets() == ()


def test_secrets_of_overlapping_calls_are_each_masked_until_their_own_call_ends():
    with call_secrets({"token": "FirstNoShape-1"}):
        with call_secrets({"token": "SecondNoShape-2"}):
            assert logged("%s %s", "FirstNoShape-1", "SecondNoShape-2") == "*** ***"
        assert logged("%s %s", "FirstNoShape-1", "SecondNoShape-2") == "*** SecondNoShape-2"
    assert running_call_secrets() == ()


def test_a_task_failure_quoting_a_declared_sensitive_argument_is_masked():
    """The task body failing outside the handler (Flower's exception/traceback): the traceback was
    redacted with the secret-named argument values only, not the tool's declared ``sensitive`` ones."""
    envelope = {"name": "charge_card", "arguments": {"card": "visa-1", "pin": PIN}}
    try:
        raise RuntimeError(f"could not record the call for {envelope['arguments']}")
    except RuntimeError as exc:
        raised = redacted_failure(exc, envelope, ("pin",))
    assert PIN not in str(raised) and "visa-1" in str(raised)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0?password={pw}",
                                 "redis://127.0.0.1:6379/0?db=0&password={pw}&socket_timeout=5",
                                 "redis://alice@127.0.0.1:6379/0?password={pw}"])
def test_a_redis_password_given_as_a_query_parameter_is_not_in_what_inspect_conf_shows(url):
    """``celery inspect conf`` (Flower's worker page calls it: its Config tab) shows the worker's
    Celery settings; Celery masks the result backend's ``user:password@`` but keeps its query, so a
    ``REDIS_URL`` with ``?password=`` (which redis-py, the ledger and Celery's backend all take) went
    to Flower whole. The worker's (and Flower's own) result backend carries it as ``:password@``."""
    from types import SimpleNamespace

    from celery.worker.control import conf

    from toolfleet import Settings
    from toolfleet.monitor import monitor_app
    from toolfleet.worker.app import create_app

    secret = "Qp9-zz%2Fword"
    settings = Settings(redis_url=url.format(pw=secret), broker_url="redis://127.0.0.1:6379/1",
                        fleet_key="f" * 40, namespace="conf-check")
    for app in (create_app(settings), monitor_app(settings)):
        shown = json.dumps(conf(SimpleNamespace(app=app)))
        assert "Qp9-zz" not in shown, shown
        assert "127.0.0.1:6379" in shown  # the backend is still named
        params = app.backend.connparams  # the same login as before, what redis-py would read
        assert params["password"] == "Qp9-zz/word" and params["host"] == "127.0.0.1", params
        if "alice" in url:
            assert params["username"] == "alice"
