"""Workers run only what a dispatcher of the fleet signed (issue 18; docs/signing.md).

Messages are sent straight to the broker by a plain Celery client that knows only the Redis URL and
a queue name (what an attacker on the network has), against a real prefork worker. The tool is
``tally``, which appends a line to ``tally.txt`` in the workspace the moment it starts: zero
executions means no file. Each dropped message is counted in ``<ns>:security:dropped``; the tests
join on that counter (or on a later call's result), never on a sleep.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from toolfleet import Dispatcher, Settings
from toolfleet.errors import ConfigurationError
from toolfleet.keys import ATTEMPTS, Keys, run_field
from toolfleet.signing import FleetKeys, canonical, generate_key, key_id, sign, verify
from toolfleet.worker.app import TASK_NAME

from .conftest import FLEET_KEY, ROOT, TEST_TOOLS, make_registry
from .faults import call, wait_started, wait_until

WAIT_S = 30.0


# ---- helpers ----

def attacker(settings: Settings) -> Celery:
    """A plain Celery client: the broker URL and nothing else of toolfleet's."""
    app = Celery("attacker", broker=settings.broker)
    app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry_on_startup=True)
    return app


def with_keys(settings: Settings, **update: Any) -> Settings:
    """``settings`` with other keys, validated (``model_copy`` would keep plain strings)."""
    return Settings.model_validate({**settings.model_dump(), **update})


def live_turn(settings: Settings, turn_id: str) -> None:
    """What an attacker who can write to Redis also does: make the ledger say the turn is live and
    armed, so that only the signature stands between the message and the handler."""
    client = redis.Redis.from_url(settings.redis_url)
    keys = Keys(settings.namespace)
    client.set(keys.turn_armed(turn_id), "1", ex=600)
    client.set(keys.turn_lease(turn_id), "attacker", ex=600)


def envelope(turn_id: str, call_id: str, workspace: Path, text: str, **extra: Any) -> dict[str, Any]:
    now = time.time()
    doc = {"turn_id": turn_id, "call_id": call_id, "name": "tally", "arguments": {"text": text},
           "workspace": str(workspace), "session_id": None, "time_limit_s": 10.0,
           "idempotency_key": f"{turn_id}:{call_id}", "submitted_at": now}
    doc.update(extra)
    return doc


def signed_message(keys: FleetKeys, ns: str, turn_id: str, call_id: str, workspace: Path, text: str,
                   *, kill_grace_s: float = 1.0) -> dict[str, Any]:
    """The send_task options of a message signed the way the dispatcher signs (submit.py)."""
    env = envelope(turn_id, call_id, workspace, text, expires_at=time.time() + 120, key_id=keys.current_id)
    queue, tid = f"{ns}.tally", f"{turn_id}:{call_id}"
    soft, hard = 10.5, 10.5 + kill_grace_s
    env["signature"] = sign(keys, task=TASK_NAME, task_id=tid, queue=queue, limits=[soft, hard], envelope=env)
    return {"kwargs": {"envelope": env}, "task_id": tid, "queue": queue, "soft_time_limit": soft,
            "time_limit": hard}


def dropped(settings: Settings) -> dict[str, int]:
    raw = redis.Redis.from_url(settings.redis_url).hgetall(Keys(settings.namespace).security_dropped)
    return {k.decode(): int(v) for k, v in raw.items()}


def wait_dropped(settings: Settings, total: int) -> dict[str, int]:
    wait_until(lambda: dropped(settings).get("total", 0) >= total, WAIT_S, f"{total} dropped messages")
    return dropped(settings)


def tallies(workspace: Path) -> list[str]:
    path = workspace / "tally.txt"
    return path.read_text().splitlines() if path.exists() else []


def nothing_recorded(settings: Settings, turn_id: str) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    keys = Keys(settings.namespace)
    for key in (keys.turn_runs(turn_id), keys.turn_results(turn_id), keys.turn_events(turn_id)):
        assert not client.exists(key), key


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    target = tmp_path / "ws"
    target.mkdir()
    return target


# ---- the examples: forged, tampered, wrong key, replayed ----

def test_forged_message_from_a_plain_celery_client_never_runs(settings, start_worker, ws):
    """The issue's attack: a made-up envelope sent with `send_task` to the tool's queue, the ledger
    made to say the turn is live. Unsigned, signed with a made-up signature, or with a signature
    of a key the fleet does not have: dropped, counted, nothing in the ledger, no execution."""
    start_worker(concurrency=1)
    client = attacker(settings)
    turn = "forged-turn"
    live_turn(settings, turn)
    queue = f"{settings.namespace}.tally"
    client.send_task(TASK_NAME, kwargs={"envelope": envelope(turn, "x1", ws, "unsigned")},
                     task_id=f"{turn}:x1", queue=queue)
    client.send_task(TASK_NAME, kwargs={"envelope": envelope(turn, "x2", ws, "made-up", key_id=key_id(FLEET_KEY),
                                                             expires_at=time.time() + 60, signature="A" * 43)},
                     task_id=f"{turn}:x2", queue=queue)
    stranger = FleetKeys.of(generate_key())
    client.send_task(TASK_NAME, **signed_message(stranger, settings.namespace, turn, "x3", ws, "stranger"))
    client.send_task(TASK_NAME, args=["not", "an", "envelope"], task_id=f"{turn}:x4", queue=queue)
    counts = wait_dropped(settings, 4)
    assert counts == {"total": 4, "unsigned": 1, "bad_signature": 1, "unknown_key": 1, "malformed": 1}
    assert tallies(ws) == []
    nothing_recorded(settings, turn)


def test_the_same_forged_message_runs_on_a_worker_told_to_run_unsigned(settings, start_worker, ws):
    """The control: the forged message of the test above is a real attack: a worker started with
    --insecure-no-signing runs it (so the signature check is what stops it)."""
    insecure = with_keys(settings, fleet_key=None, insecure_no_signing=True)
    start_worker(concurrency=1, settings=insecure)
    turn = "forged-turn"
    live_turn(settings, turn)
    attacker(settings).send_task(TASK_NAME, kwargs={"envelope": envelope(turn, "x1", ws, "unsigned")},
                                 task_id=f"{turn}:x1", queue=f"{settings.namespace}.tally")
    wait_until(lambda: tallies(ws) == ["unsigned"], WAIT_S, "the unsigned call to run")
    assert dropped(settings) == {}


def test_tampered_messages_never_run_and_the_untouched_one_does(settings, start_worker, ws):
    """A validly signed message with one thing changed (arguments, tool, turn id, call id,
    workspace, time limit in the envelope or in the headers, the queue, the expiry, the key id)
    is dropped; the same message untouched runs once (the helper signs as the dispatcher does)."""
    start_worker(concurrency=1)
    client = attacker(settings)
    keys = settings.fleet_keys
    turn = "t-" + uuid.uuid4().hex[:8]
    live_turn(settings, turn)
    other = ws.parent / "elsewhere"
    other.mkdir()
    tamperings = {
        "arguments": lambda m: m["kwargs"]["envelope"].update(arguments={"text": "rm -rf"}),
        "tool": lambda m: m["kwargs"]["envelope"].update(name="append_line"),
        "turn id": lambda m: m["kwargs"]["envelope"].update(turn_id="other-turn"),
        "call id": lambda m: m["kwargs"]["envelope"].update(call_id="other-call"),
        "workspace": lambda m: m["kwargs"]["envelope"].update(workspace=str(other)),
        "envelope time limit": lambda m: m["kwargs"]["envelope"].update(time_limit_s=600.0),
        "hard limit header": lambda m: m.update(time_limit=3600.0),
        "expiry": lambda m: m["kwargs"]["envelope"].update(expires_at=time.time() + 10**6),
        "key id": lambda m: m["kwargs"]["envelope"].update(key_id="0" * 12),
        "task id": lambda m: m.update(task_id=f"{turn}:zz"),
        "queue": lambda m: m.update(queue=f"{settings.namespace}.wait_read"),
    }
    for n, (what, change) in enumerate(tamperings.items()):
        message = signed_message(keys, settings.namespace, turn, f"c{n}", ws, f"tampered {what}")
        change(message)
        client.send_task(TASK_NAME, **message)
    counts = wait_dropped(settings, len(tamperings))
    assert counts["total"] == len(tamperings) and set(counts) <= {"total", "bad_signature", "unknown_key"}
    assert tallies(ws) == [] and not (other / "tally.txt").exists()
    nothing_recorded(settings, turn)
    client.send_task(TASK_NAME, **signed_message(keys, settings.namespace, turn, "ok", ws, "untouched"))
    wait_until(lambda: tallies(ws) == ["untouched"], WAIT_S, "the untouched message to run")
    assert dropped(settings)["total"] == len(tamperings)


def test_rotation_new_key_signs_old_key_still_accepted_then_removed(settings, start_worker, ws):
    """Rotation: the dispatcher signs with the new key; a worker given new + old runs its calls and
    a message signed with the old key. A worker given only the new key drops the old key's message."""
    old_key, new_key = generate_key(), generate_key()
    old = FleetKeys.of(old_key)
    rotated = with_keys(settings, fleet_key=new_key, fleet_keys_previous=(old_key,))
    start_worker(concurrency=1, settings=rotated)
    with Dispatcher(with_keys(settings, fleet_key=new_key), make_registry()) as dispatcher:
        result = dispatcher.run([call("a", "tally", text="new key")], workspace=str(ws))[0]
    assert result.ok, result.content
    turn = "t-" + uuid.uuid4().hex[:8]
    live_turn(settings, turn)
    attacker(settings).send_task(TASK_NAME, **signed_message(old, settings.namespace, turn, "b", ws, "old key"))
    wait_until(lambda: tallies(ws) == ["new key", "old key"], WAIT_S, "the old key's message to run")
    assert dropped(settings) == {}


def test_old_key_after_it_was_removed_never_runs(settings, start_worker, ws):
    """Once the old key is removed from the workers, its messages are dropped (unknown key)."""
    old_key, new_key = generate_key(), generate_key()
    start_worker(concurrency=1, settings=with_keys(settings, fleet_key=new_key))
    turn = "t-" + uuid.uuid4().hex[:8]
    live_turn(settings, turn)
    attacker(settings).send_task(TASK_NAME, **signed_message(FleetKeys.of(old_key), settings.namespace, turn, "b",
                                                             ws, "old key"))
    assert wait_dropped(settings, 1) == {"total": 1, "unknown_key": 1}
    assert tallies(ws) == []
    nothing_recorded(settings, turn)


def test_expired_message_never_runs(settings, start_worker, ws):
    """A signed message past its ``expires_at`` (+ the clock skew margin) is dropped, even if the
    ledger was rewritten to call its turn live: a replay is bounded in time without the ledger."""
    start_worker(concurrency=1)
    keys = settings.fleet_keys
    turn = "t-" + uuid.uuid4().hex[:8]
    live_turn(settings, turn)
    env = envelope(turn, "old", ws, "expired", expires_at=time.time() - 30, key_id=keys.current_id)
    queue, tid = f"{settings.namespace}.tally", f"{turn}:old"
    env["signature"] = sign(keys, task=TASK_NAME, task_id=tid, queue=queue, limits=[10.5, 11.5], envelope=env)
    attacker(settings).send_task(TASK_NAME, kwargs={"envelope": env}, task_id=tid, queue=queue,
                                 soft_time_limit=10.5, time_limit=11.5)
    assert wait_dropped(settings, 1) == {"total": 1, "expired": 1}
    assert tallies(ws) == []


class Recorder:
    """Wraps a dispatcher's ``send_task`` to keep each message's exact options (to replay them)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.sent: dict[str, dict[str, Any]] = {}
        original = dispatcher.app.send_task

        def send_task(name: str, **options: Any) -> Any:
            if name == TASK_NAME:
                self.sent[options["kwargs"]["envelope"]["call_id"]] = json.loads(json.dumps(
                    {k: options[k] for k in ("kwargs", "task_id", "queue", "soft_time_limit", "time_limit",
                                             "priority")}))
            return original(name, **options)

        dispatcher.app.send_task = send_task  # type: ignore[method-assign]


def test_replayed_messages_never_run_twice(settings, start_worker, dispatcher, ws):
    """A message the dispatcher signed, captured and sent again: within its live turn after the
    call ran (the claim is once: ``done``), and after the turn is over (``ended``). Zero more
    executions; the replays are processed before a later call (one worker process, FIFO)."""
    start_worker(concurrency=1)
    recorder = Recorder(dispatcher)
    turn = dispatcher.open_turn(workspace=str(ws))
    turn.add_calls([call("a", "tally", text="once")])
    wait_until(lambda: turn.result("a") is not None, WAIT_S, "the first call's result")
    assert turn.result("a").ok and tallies(ws) == ["once"]
    replayer = attacker(settings)
    replayer.send_task(TASK_NAME, **recorder.sent["a"])  # within the live turn
    turn.add_calls([call("b", "tally", text="after live replay")])
    turn.close()
    assert all(r.ok for r in turn.results(timeout_s=WAIT_S))
    assert tallies(ws) == ["once", "after live replay"]
    replayer.send_task(TASK_NAME, **recorder.sent["a"])  # after the turn is over
    replayer.send_task(TASK_NAME, **recorder.sent["b"])
    later = dispatcher.run([call("c", "tally", text="later turn")], workspace=str(ws))[0]
    assert later.ok, later.content
    assert tallies(ws) == ["once", "after live replay", "later turn"]
    assert dropped(settings) == {}  # valid signatures: refused by the ledger's claim, not dropped


@pytest.mark.parametrize("tool", ["tally", "wait_read"])
def test_replay_of_a_running_call_neither_runs_nor_displaces_it(settings, start_worker, dispatcher, ws, tool):
    """A byte-identical copy of a message delivered while its call runs (a second worker process
    free), for a write and for a read (which the worker-loss rules would run again): the claim
    answers ``running`` (the holder is live and this message was not sent after it), so the
    handler runs once (one attempt in the ledger) and the running execution keeps the call."""
    start_worker(concurrency=2)
    recorder = Recorder(dispatcher)
    turn = dispatcher.open_turn(workspace=str(ws))
    arguments = {"text": "slow", "seconds": 2.0} if tool == "tally" else {"label": "slow", "seconds": 2.0}
    turn.add_calls([call("a", tool, **arguments)])
    wait_started(dispatcher, turn.turn_id, "a")
    attacker(settings).send_task(TASK_NAME, **recorder.sent["a"])
    turn.close()
    (result,) = turn.results(timeout_s=WAIT_S)
    assert result.ok and result.attempts == 1, result.content
    later_args = {"text": "later"} if tool == "tally" else {"label": "later"}
    later = dispatcher.run([call("c", tool, **later_args)], workspace=str(ws))[0]  # after the copy (FIFO)
    assert later.ok, later.content
    attempts = redis.Redis.from_url(settings.redis_url).hget(Keys(settings.namespace).turn_runs(turn.turn_id),
                                                             run_field(ATTEMPTS, "a"))
    assert int(attempts) == 1
    if tool == "tally":
        assert tallies(ws) == ["slow", "later"]


# ---- the key never leaks; no key, no start ----

def test_the_key_is_in_no_message_and_no_repr(settings, ws):
    """The message on the broker (what Flower and anyone reading the queue see: headers with the
    kwargsrepr, and the body) carries the signature and the key id, never the key; settings and
    keys show it masked."""
    queued = with_keys(settings, require_live_worker=False)  # no worker: the message stays queued
    client = redis.Redis.from_url(settings.redis_url)
    queue = f"{settings.namespace}.tally"

    def messages() -> list[bytes]:
        return [m for q in client.keys(queue + "*") for m in client.lrange(q, 0, -1)]

    with Dispatcher(queued, make_registry()) as dispatcher:
        turn = dispatcher.open_turn(workspace=str(ws))
        turn.add_calls([call("a", "tally", text="hi")])
        wait_until(messages, WAIT_S, "the message queued")
        (raw,) = messages()
        turn.cancel()
    message = json.loads(raw)
    body = base64.b64decode(message["body"]) if message["properties"].get("body_encoding") == "base64" \
        else message["body"].encode()
    envelope_sent = json.loads(body)[1]["envelope"]
    assert envelope_sent["key_id"] == key_id(FLEET_KEY) and envelope_sent["signature"]
    assert FLEET_KEY.encode() not in raw + body
    for shown in (repr(settings), str(settings), settings.model_dump_json(), repr(settings.fleet_keys)):
        assert FLEET_KEY not in shown


def test_a_worker_without_a_key_refuses_to_start(settings):
    """Secure by default: no key and no --insecure-no-signing: the worker exits at once, naming
    what to set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_FLEET_KEY")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "toolfleet", "worker", "--redis-url", settings.redis_url,
                           "--namespace", settings.namespace, "--tools", TEST_TOOLS], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "TOOLFLEET_FLEET_KEY" in done.stderr and "--insecure-no-signing" in done.stderr


def test_a_dispatcher_without_a_key_refuses_to_start(settings):
    with pytest.raises(ConfigurationError, match="TOOLFLEET_FLEET_KEY") as refused:
        Dispatcher(with_keys(settings, fleet_key=None), make_registry())
    assert "with_local_fleet_key()" in str(refused.value)  # the fix where `toolfleet up` made the key


def test_keys_from_the_environment_and_a_key_file(tmp_path):
    current, old = generate_key(), generate_key()
    path = tmp_path / "fleet.key"
    path.write_text(f"# comment\n{current}\n\n{old}\n")
    from_file = Settings.from_env({"TOOLFLEET_FLEET_KEY_FILE": str(path)})
    from_env = Settings.from_env({"TOOLFLEET_FLEET_KEY": current, "TOOLFLEET_FLEET_KEYS_PREVIOUS": f" {old} ,"})
    for s in (from_file, from_env):
        assert s.fleet_keys.current_id == key_id(current)
        assert s.fleet_keys.accepted_ids == sorted({key_id(current), key_id(old)})
    with pytest.raises(ConfigurationError, match="not both"):
        Settings.from_env({"TOOLFLEET_FLEET_KEY_FILE": str(path), "TOOLFLEET_FLEET_KEY": current})
    with pytest.raises(ConfigurationError, match="cannot read"):
        Settings.from_env({"TOOLFLEET_FLEET_KEY_FILE": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="at least 32"):
        Settings(fleet_key="short")
    assert Settings.from_env({"TOOLFLEET_INSECURE_NO_SIGNING": "1"}).require_signing("worker") is None


# ---- property: any mutation of a signed envelope is refused ----

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
KEYS = FleetKeys.of("k" * 40)
BASE = dict(task=TASK_NAME, task_id="t:c", queue="ns.tally", limits=[10.5, 11.5])


def _signed(arguments: dict[str, Any]) -> dict[str, Any]:
    env = {"turn_id": "t", "call_id": "c", "name": "tally", "arguments": arguments, "workspace": "/w",
           "session_id": None, "time_limit_s": 10.0, "idempotency_key": "t:c", "submitted_at": 1.0,
           "expires_at": time.time() + 3600, "key_id": KEYS.current_id}
    env["signature"] = sign(KEYS, envelope=env, **BASE)
    return env


def _mutate(doc: Any, path: list[Any], value: Any, delete: bool) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        out = dict(doc)
        if delete and not rest:
            out.pop(head, None)
        else:
            out[head] = _mutate(doc.get(head), rest, value, delete)
        return out
    if isinstance(doc, list) and isinstance(head, int) and head < len(doc):
        out = list(doc)
        out[head] = _mutate(doc[head], rest, value, delete)
        return out
    return value


def _paths(doc: Any, prefix: list[Any]) -> list[list[Any]]:
    found = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += _paths(v, prefix + [k])
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += _paths(v, prefix + [i])
    return found


@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=st.dictionaries(st.text(max_size=5), JSON, max_size=4), data=st.data())
def test_any_mutation_of_a_signed_envelope_is_refused(arguments, data):
    env = _signed(arguments)
    assert verify(KEYS, envelope=env, **BASE) is None
    what = data.draw(st.sampled_from(["envelope", "task_id", "queue", "limits"]))
    if what == "envelope":
        paths = [p for p in _paths(env, []) if p and p[0] != "signature"]
        path = data.draw(st.sampled_from(paths))
        delete = data.draw(st.booleans())
        mutated = _mutate(env, path, data.draw(JSON), delete)
        assume(canonical(envelope=mutated, **BASE) != canonical(envelope=env, **BASE))
        assert verify(KEYS, envelope=mutated, **BASE) is not None
    else:
        new = data.draw(JSON if what == "limits" else st.text(max_size=12))
        assume(new != BASE[what] and json.dumps(new) != json.dumps(BASE[what]))
        assert verify(KEYS, envelope=env, **{**BASE, what: new}) is not None


def test_forged_health_check_is_dropped(settings, start_worker):
    """A health check flips a tool's breaker: an unsigned one from a plain client is dropped and
    counted; the dispatcher's own (signed) checks are in tests/test_availability.py."""
    start_worker(concurrency=1)
    attacker(settings).send_task("toolfleet.health_check", kwargs={"tool": "flaky"},
                                 queue=f"{settings.namespace}.flaky")
    assert wait_dropped(settings, 1) == {"total": 1, "unsigned": 1}


def test_keygen_prints_a_key_and_its_id():
    done = subprocess.run([sys.executable, "-m", "toolfleet", "keygen"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    key = done.stdout.strip()
    assert done.returncode == 0 and len(key) >= 32 and key_id(key) in done.stderr and key not in done.stderr


def test_a_non_ascii_signature_is_dropped_and_the_worker_lives_on(settings, start_worker, dispatcher, ws):
    """Found by an attack: `"signature": "é"` made hmac.compare_digest raise TypeError in the
    worker's main process, which died, and the unacked message killed every worker that took it
    next. Now it is one more dropped message; the worker then runs a real call. (The property test
    below only mutates signed envelopes into ASCII-safe shapes; this is the non-ASCII kind.)"""
    start_worker(concurrency=1)
    client = attacker(settings)
    turn = "forged-nonascii"
    live_turn(settings, turn)
    queue = f"{settings.namespace}.tally"
    for i, signature in enumerate(["é", "\udcff" * 3, "A" * 42 + "€"]):
        client.send_task(TASK_NAME, kwargs={"envelope": envelope(turn, f"n{i}", ws, "x", key_id=key_id(FLEET_KEY),
                                                                 expires_at=time.time() + 60, signature=signature)},
                         task_id=f"{turn}:n{i}", queue=queue)
    counts = wait_dropped(settings, 3)
    assert counts.get("bad_signature", 0) + counts.get("malformed", 0) == 3, counts
    [result] = dispatcher.run([call("after", "tally", text="after")], workspace=str(ws), timeout_s=60)
    assert result.ok, result.content  # the same worker, still alive
    assert tallies(ws) == ["after"]
