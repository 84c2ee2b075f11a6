"""A worker that holds another fleet key drops every call it takes (tests/test_signing.py): a
dispatcher must not send it calls and wait for an answer that never comes (a newcomer's trial:
a worker started by hand before `toolfleet down` and `up`, which make a new key, left
`toolfleet run` resending a call every 9 s). Workers publish the key ids they accept in their
catalog (worker/catalog.py ``key_ids``); the dispatcher counts a tool served only by a worker
that accepts its key, and answers ``TOOL_UNAVAILABLE`` at once, saying why, otherwise."""

from __future__ import annotations

import json
import subprocess
import sys

import redis

from toolfleet import Dispatcher, ErrorCode
from toolfleet.keys import Keys
from toolfleet.signing import generate_key, key_id
from toolfleet.worker.catalog import accepts, key_mismatch

from .conftest import ROOT, make_registry
from .faults import call, wait_until
from .test_signing import with_keys


def test_a_tool_served_only_by_workers_of_another_key_is_refused_at_once(settings, start_worker, workspace):
    other = generate_key()
    worker = start_worker(concurrency=1, settings=with_keys(settings, fleet_key=other))
    entry = json.loads(redis.Redis.from_url(settings.redis_url).get(Keys(settings.namespace).catalog(worker.name)))
    assert entry["key_ids"] == [key_id(other)]  # fingerprints, never the key
    with Dispatcher(settings, make_registry()) as dispatcher:
        [result] = dispatcher.run([call("a", "tally", text="x")], workspace=str(workspace), timeout_s=30)
    assert result.error is not None and result.error.code == "TOOL_UNAVAILABLE", result.content
    assert "another fleet key" in result.content and worker.name in result.content, result.content
    assert other not in result.content


def test_a_worker_of_the_same_key_serves_beside_one_of_another(settings, start_worker, workspace, caplog, capsys):
    """The call still runs; the dispatcher logs, and `toolfleet run` says, that a worker of another
    key takes from the tool's queue (a newcomer's trial: four reads took 19 s with no word why)."""
    from toolfleet.cli_run import _warn_other_keys

    other = start_worker(concurrency=1, settings=with_keys(settings, fleet_key=generate_key()))
    start_worker(concurrency=1)
    with Dispatcher(settings, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("a", "tally", text="x")], workspace=str(workspace))
        [result] = turn.results(60)
        assert dispatcher.availability.shared_with_other_keys()["tally"] == [other.name]
        warning = _warn_other_keys(dispatcher, turn)  # also in `run --json`'s "warnings"
    assert other.name in warning and "another fleet key" in warning, warning
    assert result.ok, result.content
    assert any(other.name in r.getMessage() and "another fleet key" in r.getMessage() for r in caplog.records)
    said = " ".join(capsys.readouterr().err.split())
    assert other.name in said and "hold another fleet key" in said, said


def test_a_worker_says_at_start_which_live_workers_hold_another_key(settings, start_worker, tmp_path):
    first = start_worker(concurrency=1, settings=with_keys(settings, fleet_key=generate_key()))
    log = tmp_path / "second.log"
    second = start_worker(concurrency=1, log_path=log, name="same")
    text = second.log_text()
    assert "hold another fleet key" in text and first.name in text, text
    assert "already serves namespace" not in text


def test_accepts_reads_old_catalogs_and_unsigned_workers():
    kid = key_id(generate_key())
    assert accepts({"worker": "old"}, kid)  # a catalog from before key_ids: taken to accept
    assert accepts({"key_ids": None}, kid) and accepts({"key_ids": None}, None)  # runs unsigned messages
    assert accepts({"key_ids": [kid]}, kid) and not accepts({"key_ids": [kid]}, None)
    assert not accepts({"key_ids": []}, kid)  # no key: drops everything
    assert key_mismatch([{"worker": "a", "key_ids": ["x"]}, {"worker": "b", "key_ids": [kid]}], kid) == ["a"]


def test_the_default_node_name_is_unique_on_the_host():
    """Two `toolfleet worker` without --hostname were both celery@<host>: the second overwrote the
    first's catalog (a newcomer's trial: half the calls got TOOL_UNAVAILABLE)."""
    out = subprocess.run([sys.executable, "-m", "toolfleet", "worker", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert "worker<pid>@<host>" in out.stdout, out.stdout


def test_up_says_which_live_workers_hold_another_key(settings):
    """`toolfleet up` on a Redis where workers of the namespace hold another key (a demo with a home of
    its own, or a worker started by hand before `down` and `up`) says so, naming them."""
    import io

    from rich.console import Console

    from toolfleet.stack_neighbours import _warn_other_keys

    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    keys = Keys(settings.namespace)
    ours, theirs = key_id(generate_key()), key_id(generate_key())
    for name, ids in (("stack@h", [ours]), ("byhand@h", [theirs]), ("same@h", [ours, theirs]), ("open@h", None)):
        client.sadd(keys.workers, name)
        client.set(keys.catalog(name), json.dumps({"worker": name, "key_ids": ids}), ex=60)
    out = io.StringIO()
    _warn_other_keys(client, keys, {"worker": "stack@h", "key_ids": [ours]}, settings.namespace,
                     Console(file=out, width=300))
    assert "byhand@h" in out.getvalue() and "same@h" not in out.getvalue() and "open@h" not in out.getvalue()
    quiet = io.StringIO()
    client.delete(keys.catalog("byhand@h"))
    _warn_other_keys(client, keys, {"worker": "stack@h", "key_ids": [ours]}, settings.namespace,
                     Console(file=quiet, width=300))
    assert quiet.getvalue() == ""


def test_a_resend_after_a_worker_of_another_key_dropped_the_call_says_so(settings, start_worker, workspace, caplog):
    """A newcomer's trial: two local stacks in one namespace, each with its own fleet key, their
    workers under one node name (so the catalog showed one of them): each batch took 18 to 36 s,
    and the dispatcher's only words were "a frozen or dead worker holds its message". The worker
    of the other key had taken the call and dropped it unrun. The resend now says that this can be
    the cause, with the namespace's count of dropped messages. Here the fleet scales from zero
    (``require_live_worker`` off), so the dispatcher sends to a queue only that worker serves."""
    import logging

    start_worker(concurrency=1, settings=with_keys(settings, fleet_key=generate_key()))
    scaling = settings.model_copy(update={"require_live_worker": False})
    resent = "left its queue"
    with caplog.at_level(logging.WARNING, logger="toolfleet.dispatcher.watchdog"), \
            Dispatcher(scaling, make_registry()) as dispatcher:
        turn = dispatcher.submit([call("a", "tally", text="x")], workspace=str(workspace))
        try:
            wait_until(lambda: any(resent in r.getMessage() for r in caplog.records), 60, "the dispatcher's resend")
        finally:
            turn.cancel()
        [result] = turn.results(30)
    said = next(r.getMessage() for r in caplog.records if resent in r.getMessage())
    assert "holding another fleet key" in said and "failed a worker's fleet signature check" in said, said
    assert result.code is ErrorCode.NOT_EXECUTED, result
    assert not (workspace / "tally.txt").exists()
