"""Odd session ids (unicode, very long, ``:``, ``{``, ``}``): every key of one session must share
one Redis Cluster slot, or the save script (``EVALSHA`` over the state and the session record, and
the other states it renews) fails ``CROSSSLOT`` on a cluster ledger and no write call of the
session can ever save. A hunt's find: an id starting with ``}`` (``"}x"``) made the hash tag
``{}`` empty, so Redis hashed each whole key: on the local three-master cluster ``open`` worked and
every save raised ``RedisClusterException: EVALSHA - all keys must map to the same key slot``. Such
an id is now refused at open, on any Redis (an id that works in development must work on the
production cluster). Real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib
from pydantic import BaseModel
from redis.crc import key_slot

from toolfleet.errors import ToolfleetError
from toolfleet.keys import Keys
from toolfleet.settings import Settings
from toolfleet.tools.state import SessionState, SessionStore


class Counter(BaseModel):
    count: int = 0


A, B = SessionState("a", Counter), SessionState("b", Counter)
IDS = ["plain", "é✓ünï", "x" * 10_000, "a:b:c", "{x}", "{}", "a}b", "x{", "*", "a\nb", "}x", "}", "}}{a}"]


@pytest.fixture
def store(settings: Settings) -> Iterator[SessionStore]:
    client = redis_lib.Redis.from_url(settings.redis_url)
    yield SessionStore(client, Keys(settings.namespace))
    client.close()


def _slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.mark.parametrize("sid", IDS)
def test_an_opened_sessions_keys_share_one_cluster_slot_or_the_id_is_refused(store, sid):
    keys = [store.meta_key(sid), store.state_key(sid, A.name), store.state_key(sid, B.name),
            store.keys.session_loop(sid)]
    if len({_slot(k) for k in keys}) > 1:
        with pytest.raises(ToolfleetError, match="cannot start with"):
            store.open(sid, {A: None, B: None})
        assert store.redis.exists(store.meta_key(sid)) == 0  # nothing left half-open
        return
    store.open(sid, {A: None, B: None})
    loaded = store.load(A, sid)
    assert store.save(A, sid, loaded, Counter(count=3)) == 2
    assert store.load(A, sid).value == Counter(count=3)
    assert store.close(sid)


def test_an_id_starting_with_a_closing_brace_is_refused_with_a_clear_error(store):
    with pytest.raises(ToolfleetError, match=r"session id '\}x' cannot start with '\}'"):
        store.open("}x", {A: None})


@pytest.mark.parametrize("tid", ["}x", "}"])
def test_a_turn_id_starting_with_a_closing_brace_is_refused_too(settings, tid):
    """The same flaw in the turn's keys (``<ns>:turn:{<id>}:...``): a caller's own turn id starting
    with ``}`` gave every key of the turn its own slot, so each ledger script of it failed
    ``CROSSSLOT`` on a cluster ledger."""
    from toolfleet import Dispatcher
    from toolfleet.tools.registry import default_registry

    keys = Keys(settings.namespace)
    assert len({_slot(keys.turn_calls(tid)), _slot(keys.turn_results(tid)), _slot(keys.turn_armed(tid))}) > 1
    with Dispatcher(settings, default_registry()) as dispatcher:
        with pytest.raises(ToolfleetError, match="cannot start with"):
            dispatcher.open_turn(turn_id=tid)
        assert not dispatcher.ledger.redis.exists(keys.turn_calls(tid))
        assert dispatcher.open_turn(turn_id="a}b").turn_id == "a}b"  # a brace elsewhere is one slot
