"""Tools whose calls always touch the same resources, or none (``resources=[]``). A newcomer's
find: ``@tool(access="read", resources=[])`` ("touches no files") was accepted, then taken for a
resource function that fails, so every call touched everything: a later ``write_file`` waited for
the read. A list is now a fixed set of resources (:func:`toolfleet.tools.resources.fixed`), published
in the catalog as is (``{"fixed": [...]}``), so a dispatcher that knows the tool only from there
(``toolfleet run``) plans it the same way; anything else that is not a function is refused."""

from __future__ import annotations

import json

import pytest

from toolfleet import tool
from toolfleet.dispatcher.plan import PlanItem, conflicts
from toolfleet.errors import ConfigurationError
from toolfleet.tools.published import describe, spec_from_description
from toolfleet.tools.resources import EVERYTHING, fixed, resolve
from toolfleet.tools.spec import tool_from_schema


def weather(city: str) -> str:
    """The weather.

    Args:
        city: a city.
    """
    return f"sunny in {city}"


WRITE = PlanItem("w", "write", frozenset({"fs:notes/out.txt"}))


@pytest.mark.parametrize("given, expected", [([], frozenset()), (("api:weather",), frozenset({"api:weather"})),
                                             ({"b:2", "a:1"}, frozenset({"a:1", "b:2"}))])
def test_a_list_of_resources_is_what_every_call_touches_here_and_from_the_catalog(given, expected):
    spec = tool(access="read", resources=given)(weather)
    from_catalog = spec_from_description(json.loads(json.dumps(describe(spec))))
    for planned in (spec, from_catalog):
        assert resolve(planned.resources, {"city": "Oslo"}) == expected
    assert describe(spec)["resources"] == {"fixed": sorted(expected)}
    write_after = PlanItem("r", "write", resolve(from_catalog.resources, {"city": "Oslo"}))
    assert not conflicts(write_after, WRITE)  # a write that touches nothing of the workspace


def test_fixed_with_no_resource_touches_nothing_and_a_schema_tool_takes_a_list_too():
    assert resolve(fixed(), {}) == frozenset()
    spec = tool_from_schema("ping", {"type": "object", "properties": {}}, access="read", resources=[])
    assert resolve(spec.resources, {}) == frozenset()


@pytest.mark.parametrize("bad", ["api:weather", 3, [1, 2], {"a": 1}])
def test_resources_that_are_neither_a_function_nor_a_list_of_strings_are_refused(bad):
    with pytest.raises(ConfigurationError, match="resources must be a function"):
        tool(access="read", resources=bad)(weather)
    with pytest.raises(ConfigurationError, match="resources must be a function"):
        tool_from_schema("ping", {"type": "object", "properties": {}}, resources=bad)


def test_a_resource_function_published_as_code_is_still_everything_from_the_catalog():
    spec = tool(access="read", resources=lambda a: [])(weather)
    assert resolve(spec_from_description(describe(spec)).resources, {"city": "x"}) == frozenset({EVERYTHING})
