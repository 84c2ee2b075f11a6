"""A whole number sent as a float for an ``integer`` parameter (``2.0``, ``1e1``: JSON Schema 2020-12
counts them as integers, and a model behind a gateway that re-encodes numbers as doubles sends them)
reaches the handler as an ``int``, as a breaker found: ``read_file(limit=2.0)`` raised ``TypeError`` in
the handler, five in a row opened read_file's circuit for every caller."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.models import ToolCall
from toolfleet.tools.registry import default_registry
from toolfleet.tools.validation import check_call, whole_numbers_as_int

from .faults import call

REGISTRY = default_registry(["tests.tools_for_tests"])


@given(st.integers(min_value=1, max_value=10_000), st.sampled_from(["{}.0", "{}e0", "{}.000"]))
@settings(max_examples=60, deadline=None)
def test_a_whole_float_for_an_integer_parameter_is_an_int(n, spelling):
    arguments = '{"path": "README.md", "limit": ' + spelling.format(n) + "}"
    spec, checked = check_call(REGISTRY, ToolCall(id="c", name="read_file", arguments=arguments))
    assert checked["limit"] == n and type(checked["limit"]) is int


def test_numbers_stay_numbers_and_nested_integers_are_followed():
    schema = {"type": "object", "$defs": {"N": {"type": "integer"}}, "properties": {
        "x": {"type": "number"}, "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "xs": {"type": "array", "items": {"$ref": "#/$defs/N"}},
        "m": {"type": "object", "additionalProperties": {"type": "integer"}}}}
    value = json.loads('{"x": 2.0, "n": 3.0, "xs": [1.0, 2.0], "m": {"a": 4.0}}')
    out = whole_numbers_as_int(schema, value, schema)
    assert out == {"x": 2.0, "n": 3, "xs": [1, 2], "m": {"a": 4}}
    assert type(out["x"]) is float and all(type(v) is int for v in (out["n"], *out["xs"], out["m"]["a"]))


def test_through_a_worker_whole_floats_run_and_do_not_open_the_circuit(dispatcher, worker, workspace):
    for n in range(6):
        [result] = dispatcher.run([call(f"f{n}", "read_file", path="README.md", limit=2.0)],
                                  workspace=str(workspace), timeout_s=60)
        assert result.ok and "lines 1-2 of" in result.content, result.content
