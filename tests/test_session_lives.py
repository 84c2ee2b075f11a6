"""A session id closed and opened again (or opened again with ``replace=True``: "reset the
conversation") while a write call of its first life runs: that call's save must not land in the
new life. A breaker's find: the save compared versions only, and a new life starts at version 1
again, so the old call's state replaced the new session's initial state (``{"count": 1000}``
became ``{"count": 1}``). Each open now draws a new epoch that the save compares too. Real Redis.
Also: ``ttl_s`` below one second (``EXPIRE 0`` deletes the key) is refused, not "opened" and gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib
from pydantic import BaseModel

from toolfleet.errors import ToolFailure, ToolfleetError
from toolfleet.keys import Keys
from toolfleet.settings import Settings
from toolfleet.tools.state import SessionState, SessionStore


class Counter(BaseModel):
    count: int = 0
    log: list[str] = []


COUNTER = SessionState("counter", Counter)


@pytest.fixture
def store(settings: Settings) -> Iterator[SessionStore]:
    client = redis_lib.Redis.from_url(settings.redis_url)
    yield SessionStore(client, Keys(settings.namespace))
    client.close()


@pytest.mark.parametrize("how", ["close-reopen", "replace"])
def test_a_call_of_a_sessions_first_life_saves_nothing_into_the_next(store, how):
    store.open("s1", {COUNTER: None})
    loaded = store.load(COUNTER, "s1")  # a write call loaded version 1 of the first life
    changed = loaded.value.model_copy(update={"count": 1, "log": ["first life"]})
    if how == "close-reopen":
        assert store.close("s1")
        store.open("s1", {COUNTER: Counter(count=1000, log=["second life"])})
    else:
        store.open("s1", {COUNTER: Counter(count=1000, log=["second life"])}, replace=True)
    assert store.load(COUNTER, "s1").version == loaded.version  # the versions alone cannot tell
    with pytest.raises(ToolFailure, match="opened again"):
        store.save(COUNTER, "s1", loaded, changed)
    assert store.load(COUNTER, "s1").value == Counter(count=1000, log=["second life"])
    fresh = store.load(COUNTER, "s1")  # a call of the second life saves as before
    assert store.save(COUNTER, "s1", fresh, fresh.value.model_copy(update={"count": 1001})) == fresh.version + 1


def test_a_state_the_session_was_opened_without_is_fenced_by_its_life_too(store):
    other = SessionState("other", Counter)
    store.open("s2", {COUNTER: None})
    loaded = store.load(other, "s2")  # not opened with it: initial(), version 0
    store.open("s2", {COUNTER: None}, replace=True)
    with pytest.raises(ToolFailure, match="opened again"):
        store.save(other, "s2", loaded, Counter(count=5))


@pytest.mark.parametrize("ttl_s", [0, -5, 0.0])
def test_a_ttl_that_would_delete_the_session_at_once_is_refused(store, ttl_s):
    with pytest.raises(ToolfleetError, match="positive"):
        store.open("s3", {COUNTER: None}, ttl_s=ttl_s)


def test_a_fractional_ttl_is_rounded_up_not_down_to_nothing(store):
    store.open("s4", {COUNTER: None}, ttl_s=0.5)
    assert store.load(COUNTER, "s4").version == 1
    assert store.redis.ttl(store.meta_key("s4")) == 1


def test_a_stop_that_lands_while_the_state_is_written_answers_as_the_stop(settings, start_worker, tmp_path):
    """A cancel's interrupt (after ``cancel_grace_s``) or the soft time limit landing while the
    worker makes the state's JSON (pydantic wraps it) was answered ``EXECUTION_ERROR`` "cannot be
    stored as JSON ... keep the state to JSON-able fields" (a breaker's find): now ``CANCELLED`` and
    ``TIMEOUT``, and nothing is stored either way. A real prefork worker."""
    from toolfleet import Dispatcher, ErrorCode
    from toolfleet.tools.registry import default_registry

    from .faults import call, wait_until

    modules = ["tests.tools_for_session_saves"]
    start_worker(args=["--tools", "tests.tools_for_session_saves"], concurrency=1)
    with Dispatcher(settings, default_registry(modules)) as dispatcher:
        sid = dispatcher.open_session()
        gate = str(tmp_path / "cancel")
        turn = dispatcher.submit([call("c1", "gated_bump", gate=gate)], session_id=sid)
        wait_until(lambda: (tmp_path / "cancel.at").exists(), 30, "the save at its gate")
        turn.cancel()
        [cancelled] = turn.results(timeout_s=60)
        [timed_out] = dispatcher.run([call("c2", "gated_bump_1s", gate=str(tmp_path / "never"))], session_id=sid,
                                     timeout_s=60)
        [count] = dispatcher.run([call("p", "gated_count", nonce="p")], session_id=sid, timeout_s=60)
    assert cancelled.code is ErrorCode.CANCELLED, cancelled
    assert timed_out.code is ErrorCode.TIMEOUT, timed_out
    assert count.content == "0"


class _SaveLandsDuring(redis_lib.Redis):
    """A client that runs ``action`` once, right after the first command on ``meta`` that reads the
    session's state list (``HGET ... states``) or is a script on it: where a write call of another
    process could save between that read and the deletes that follow it."""

    meta: str = ""
    action: Any = None

    def execute_command(self, *args: Any, **options: Any) -> Any:
        result = super().execute_command(*args, **options)
        name = str(args[0]).upper()
        on_meta = (name == "HGET" and args[1:3] == (self.meta, "states")) or \
            (name in ("EVALSHA", "EVAL") and len(args) > 3 and args[3] == self.meta)
        if on_meta and self.action is not None:
            action, self.action = self.action, None
            action()
        return result


@pytest.mark.parametrize("how", ["close-reopen", "replace"])
def test_a_state_first_saved_while_the_session_closes_is_not_left_for_its_next_life(settings, how):
    """A hunt's find: ``close`` read the states the record lists, then deleted them; a write call
    saving a state the session was opened without (so not listed yet) in between listed it and left
    its key behind, and the session opened again under the id (without that state) loaded it: the
    first life's ``{"count": 42}`` at version 1, which the new life's next save then built on. Same
    for ``open(replace=True)``. Close and open are now one script each."""
    other = SessionState("other", Counter)
    plain = redis_lib.Redis.from_url(settings.redis_url)
    racing = _SaveLandsDuring.from_url(settings.redis_url)
    keys = Keys(settings.namespace)
    first, store = SessionStore(plain, keys), SessionStore(racing, keys)
    store.open("s5", {COUNTER: None})
    loaded = first.load(other, "s5")  # a write call of the first life, on the state not opened with

    def save() -> None:
        try:
            first.save(other, "s5", loaded, Counter(count=42, log=["first life"]))
        except ToolFailure:
            pass  # after the close: refused, as it should be

    racing.meta, racing.action = store.meta_key("s5"), save
    if how == "close-reopen":
        assert store.close("s5")
        store.open("s5", {COUNTER: None})
    else:
        store.open("s5", {COUNTER: None}, replace=True)
    assert racing.action is None  # the save ran in the window
    again = store.load(other, "s5")
    assert (again.value, again.version) == (Counter(), 0)  # the new life starts it fresh
    assert store.save(other, "s5", again, Counter(count=1)) == 1
    plain.close()
    racing.close()
