"""Stored session state loads back as it was saved (docs/sessions.md, "Storage and integrity").

A tester's find: a NaN in a float field was saved as JSON null, and every later call of the session
failed ("not a valid ..."): the state was lost. Now NaN and the infinities round-trip, and a value
whose JSON form would not load back (or would load back as something else) is refused at the save,
the previous state kept: the properties below hold for any value of the state types tried.

Second find: in a session with two states, writing one let the other's key expire on its own, and
the next call got a fresh default while the session was open. Now a save renews every key of the
session, and a state the session lists whose key is gone is "not open ... expired", never a default.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import pytest
import redis as redis_lib
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, Json, computed_field

from toolfleet import Dispatcher, Settings, ToolCall, default_registry
from toolfleet.errors import ToolFailure
from toolfleet.keys import Keys
from toolfleet.tools.state import JsonRandom, SessionState, SessionStore

from .tools_for_sessions import COUNTER, METER, Counter, Meter

# ---- state types: ones that always round-trip, and the siblings of the NaN case ----


@dataclass
class Floats:
    x: float = 0.0
    xs: list[float] = field(default_factory=list)
    by_name: dict[str, float] = field(default_factory=dict)


class FloatModel(BaseModel):
    x: float = 0.0
    xs: list[float] = []


@dataclass
class Kinds:  # typed fields: each loads back as itself
    tags: frozenset[str] = frozenset()
    blob: bytes = b""
    at: datetime.datetime | None = None
    pair: tuple[int, str] = (0, "")
    rng: JsonRandom = field(default_factory=lambda: random.Random(0))


@dataclass
class Loose:  # an untyped field: a set, tuple, datetime or bytes in it has no JSON form of its own
    data: Any = None


class Aliased(BaseModel):  # dumped under another name than it loads from: the value would be lost
    model_config = ConfigDict(serialize_by_alias=True)
    x: int = Field(0, serialization_alias="y")


class WithExtra(BaseModel):
    model_config = ConfigDict(extra="allow")
    x: int = 0


class Computed(BaseModel):  # a computed field (refused on load with extra="forbid"): left out of the JSON
    model_config = ConfigDict(extra="forbid")
    x: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return 2 * self.x


class Hidden(BaseModel):  # a field left out of the JSON: loads back as its default
    x: int = 0
    secret: str = Field("", exclude=True)


class Required(BaseModel):  # a required field left out of the JSON: does not load at all
    secret: str = Field(exclude=True)


class Embedded(BaseModel):  # a field that holds JSON text
    payload: Json[list[int]] = "[]"  # type: ignore[assignment]


def norm(value: Any) -> Any:
    """A comparable form of a state (this test's own, independent of the store's check): NaN equals
    NaN, sets compare unordered, a list and a tuple alike, objects by type and fields."""
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, random.Random):
        return ("rng", value.getstate())
    if isinstance(value, BaseModel):
        return (type(value).__name__, norm(dict(value.__dict__)), norm(value.__pydantic_extra__ or {}))
    if is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, norm({f.name: getattr(value, f.name) for f in fields(value)}))
    if isinstance(value, dict):
        return ("dict", sorted((repr(k), type(k).__name__, norm(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("seq", [norm(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return ("set", sorted(repr(norm(v)) for v in value))
    return (type(value).__name__, value)


floats = st.floats(allow_nan=True, allow_infinity=True)
json_leaf = st.none() | st.booleans() | st.integers(-2**53, 2**53) | floats | st.text(max_size=8)
any_data = st.recursive(
    json_leaf | st.datetimes(timezones=st.just(datetime.UTC)) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    | st.frozensets(st.integers(0, 9), max_size=3) | st.tuples(inner, inner),
    max_leaves=8)
offsets = st.integers(-23 * 60, 23 * 60).map(lambda m: datetime.timezone(datetime.timedelta(minutes=m)))

ALWAYS = st.one_of(  # values that must be stored and load back equal
    st.builds(Meter, total=floats, log=st.lists(st.text(max_size=5), max_size=3)),
    st.builds(Floats, x=floats, xs=st.lists(floats, max_size=4), by_name=st.dictionaries(st.text(max_size=3), floats)),
    st.builds(FloatModel, x=floats, xs=st.lists(floats, max_size=4)),
    st.builds(Kinds, tags=st.sets(st.text(max_size=4), max_size=4),  # a set assigned to a frozenset field
              blob=st.text(max_size=6).map(str.encode),
              at=st.none() | st.datetimes(timezones=st.none() | offsets),
              pair=st.tuples(st.integers(), st.text(max_size=4)),
              rng=st.integers(0, 2**32).map(random.Random)),
    st.builds(Embedded, payload=st.lists(st.integers(-9, 9), max_size=3).map(json.dumps)),
    st.builds(Computed, x=st.integers(0, 3)),
)
MAYBE = st.one_of(  # values that may have no faithful JSON form: stored only if they load back equal
    ALWAYS,
    st.builds(Loose, data=any_data),
    st.builds(Kinds, blob=st.binary(max_size=6)),  # bytes that are not UTF-8
    st.builds(Aliased, x=st.integers(-3, 3)),
    st.integers(-3, 3).flatmap(lambda x: st.just(WithExtra(x=x, more=[1.5, "a"], tags={1, 2}))),
    st.builds(Hidden, x=st.integers(0, 3), secret=st.text(max_size=3)),
    st.builds(Required, secret=st.text(max_size=3)),
)


def state_of(value: Any) -> SessionState:
    return SessionState("s", type(value))


@given(ALWAYS)
@hsettings(max_examples=300, deadline=None)
def test_values_with_a_json_form_round_trip_nan_and_infinity_included(value: Any) -> None:
    state = state_of(value)
    assert norm(state.load(state.dump(value))) == norm(value)


@given(MAYBE)
@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_state_is_stored_only_if_it_loads_back_as_it_was(value: Any) -> None:
    state = state_of(value)
    try:
        raw = state.dump(value)
    except ToolFailure as exc:  # refused: a clear reason, and nothing to store
        assert "session state 's'" in exc.message and ("load back" in exc.message or "JSON" in exc.message)
        return
    assert norm(state.load(raw)) == norm(value)  # what is stored loads, and loads as it was


@pytest.mark.parametrize("value, reason", [
    (Loose(data={1, 2}), "at $.data: a set is loaded back as list"),
    (Loose(data=datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)), "datetime is loaded back as str"),
    (Aliased(x=3), "at $.x: 3 is loaded back as 0"),
    (Required(secret="k"), "does not validate"),
    (Hidden(x=1, secret="k"), "at $.secret"),
    (Kinds(blob=b"\xff"), "cannot be stored as JSON"),
])
def test_the_refusal_says_where_and_why(value: Any, reason: str) -> None:
    with pytest.raises(ToolFailure) as caught:
        state_of(value).dump(value)
    assert reason in caught.value.message, caught.value.message


# ---- the store: a refused save keeps the previous state; every key of a session lives as long ----


@pytest.fixture
def store(settings: Settings) -> Iterator[SessionStore]:
    client = redis_lib.Redis.from_url(settings.redis_url)
    yield SessionStore(client, Keys(settings.namespace))
    client.close()


LOOSE = SessionState("loose", Loose)


def test_a_save_that_would_not_load_back_keeps_the_previous_state(store: SessionStore) -> None:
    store.open("keep", {LOOSE: Loose(data=[1, 2]), METER: Meter(total=1.5)}, ttl_s=60)
    loaded = store.load(LOOSE, "keep")
    with pytest.raises(ToolFailure, match="load back"):
        store.save(LOOSE, "keep", loaded, Loose(data={"when": datetime.datetime.now(datetime.UTC)}))
    again = store.load(LOOSE, "keep")
    assert (again.version, again.value) == (1, Loose(data=[1, 2]))  # as before the refused save
    meter = store.load(METER, "keep")
    meter.value.total = math.inf
    assert store.save(METER, "keep", meter, meter.value) == 2
    assert store.load(METER, "keep").value.total == math.inf
    store.close("keep")


def test_saving_one_state_renews_every_key_of_the_session(store: SessionStore) -> None:
    """ttl_s=2: the counter is saved every 0.4 s for 3.2 s; the meter, never written, is still what
    the session was opened with (it used to expire and load as a fresh Meter at version 0)."""
    store.open("two", {COUNTER: Counter(count=100), METER: Meter(total=5.0, log=["opened"])}, ttl_s=2)
    for _ in range(8):
        loaded = store.load(COUNTER, "two")
        loaded.value.count += 1
        store.save(COUNTER, "two", loaded, loaded.value)
        time.sleep(0.4)
    meter = store.load(METER, "two")
    assert (meter.version, meter.value) == (1, Meter(total=5.0, log=["opened"]))
    assert store.sessions()[0]["states"]["meter"]["version"] == 1
    time.sleep(2.5)  # no save: the whole session expires, every key of it
    with pytest.raises(ToolFailure, match="not open"):
        store.load(METER, "two")
    assert not store.redis.exists(store.state_key("two", "meter"), store.state_key("two", "counter"))


def test_a_listed_state_whose_key_is_gone_is_not_loaded_as_a_default(store: SessionStore) -> None:
    store.open("gone", {COUNTER: None, METER: Meter(total=2.0)}, ttl_s=60)
    store.redis.delete(store.state_key("gone", "meter"))  # as if it had expired on its own
    with pytest.raises(ToolFailure, match="not open.*'meter' expired"):
        store.load(METER, "gone")
    assert store.load(COUNTER, "gone").version == 1  # the other state is untouched
    store.close("gone")
    store.open("late", {COUNTER: None}, ttl_s=60)  # a state the session was opened without: its default
    assert store.load(METER, "late").version == 0
    store.close("late")


# ---- through real workers ----


def test_nan_through_a_worker(settings: Settings, start_worker) -> None:
    """meter_add("nan") used to answer ok and store null: every later call of the session failed."""
    start_worker(args=["--tools", "tests.tools_for_sessions"])
    with Dispatcher(settings, default_registry(["tests.tools_for_sessions"])) as d:
        sid = d.open_session(state={"meter": {"total": 1.0}})

        def run(turn: str, name: str, args: dict) -> Any:
            call = ToolCall(id=f"{turn}c", name=name, arguments=json.dumps(args), index=0)
            return d.submit([call], session_id=sid).results(timeout_s=90)[0]

        assert run("a", "meter_add", {"x": "nan"}).content == "nan"
        got = run("b", "meter_get", {})
        assert got.ok and got.content == "nan ['nan']", got.content
        assert run("c", "meter_add", {"x": "-inf"}).content == "nan"
        got = run("d", "meter_get", {})
        assert got.ok and got.content == "nan ['nan', '-inf']", got.content
        d.close_session(sid)


def test_a_second_state_outlives_writes_to_the_first_through_a_worker(settings: Settings, start_worker) -> None:
    """ttl_s=3 and 4 s of writes to the counter only: the meter used to expire and load as a fresh
    Meter (0.0) while the session was open."""
    start_worker(args=["--tools", "tests.tools_for_sessions"])
    with Dispatcher(settings, default_registry(["tests.tools_for_sessions"])) as d:
        sid = d.open_session(state={"meter": {"total": 5.0, "log": ["opened"]}, "counter": {"count": 100}}, ttl_s=3)

        def run(turn: str, name: str, args: dict) -> Any:
            call = ToolCall(id=f"{turn}c", name=name, arguments=json.dumps(args), index=0)
            return d.submit([call], session_id=sid).results(timeout_s=90)[0]

        for i in range(8):
            assert run(f"b{i}", "bump", {}).content == f"count={101 + i}"
            time.sleep(0.5)
        got = run("m", "meter_get", {})
        assert got.ok and got.content == "5.0 ['opened']", got.content
        d.close_session(sid)
