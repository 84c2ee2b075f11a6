"""Validation of calls against tools (docs/design.md, "The path of one batch", step 2): the messages a model acts on.

Pure checks of toolfleet.tools.validation, which both the dispatcher and the worker use."""

from __future__ import annotations

import pytest

from toolfleet import ErrorCode, Registry, ToolCall, default_registry, tool_from_schema
from toolfleet.tools.files import read_file
from toolfleet.tools.validation import check_arguments, check_call, parse_arguments, unknown_tool

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "minLength": 1},
        "api_key": {"type": "string"},
        "express": {"type": "boolean"},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
                               "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "priority": {"enum": ["low", "normal", "high"]},
    },
    "required": ["customer", "items"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    reg = default_registry()
    reg.add(tool_from_schema("place_order", ORDER_SCHEMA, description="Place an order."))
    return reg


def check(registry: Registry, name: str, arguments) -> object:
    return check_call(registry, ToolCall(id="c1", name=name, arguments=arguments))


def errors_of(result) -> dict[str, dict]:
    assert result.code == ErrorCode.INVALID_ARGUMENT, result
    return {e["pointer"]: e for e in result.data["errors"]}


def test_every_problem_is_reported_at_once_with_pointer_given_wants_and_fix(registry):
    result = check(registry, "place_order", {
        "items": [{"sku": "ABC-1", "qty": 2}, {"sku": "bad", "qty": "3", "colour": "red"}],
        "priority": "urgent",
        "express": "true",
    })
    errors = errors_of(result)
    assert set(errors) == {"/customer", "/items/1/sku", "/items/1/qty", "/items/1/colour", "/priority", "/express"}
    assert errors["/customer"]["given"] == "nothing" and "add the required parameter" in errors["/customer"]["fix"]
    assert errors["/items/1/qty"]["wants"] == "an integer ≥ 1"
    assert "without the quotes" in errors["/items/1/qty"]["fix"]  # "3" is not coerced, the fix says how
    assert errors["/express"]["given"] == '"true" (a string)'
    assert "true, without the quotes" in errors["/express"]["fix"]
    assert "matching /^[A-Z]{3}-[0-9]+$/" in errors["/items/1/sku"]["wants"]
    assert errors["/items/1/colour"]["fix"] == 'remove "colour".'
    assert errors["/priority"]["wants"] == 'one of "low", "normal", "high"'
    for pointer, error in errors.items():
        assert pointer in result.content and error["fix"] in result.content
    assert result.content.startswith("Error [INVALID_ARGUMENT]: the arguments of place_order have 6 problems")


def test_every_violation_is_reported_with_where_given_and_fix():
    result = check_arguments(read_file, "a", {"file": "README.md", "limit": "ten"})
    assert result.code is ErrorCode.INVALID_ARGUMENT
    text = result.content
    assert "/path: given nothing; wants a string" in text
    assert '/limit: given "ten" (a string); wants an integer from 1 to 10000' in text
    assert '/file: given "README.md"; wants no parameter by this name' in text
    assert "have 3 problems" in text


def test_no_silent_coercion():
    assert check_arguments(read_file, "a", {"path": "x", "offset": "2"}) is not None
    assert check_arguments(read_file, "a", {"path": "x", "offset": 2}) is None


def test_types_are_never_coerced(registry):
    for given in ("10", 10.5, True, None):
        assert errors_of(check(registry, "read_file", {"path": "a", "limit": given}))["/limit"]["keyword"] == "type"
    ok = {"path": "a", "limit": 10}
    assert check(registry, "read_file", ok) == (registry.get("read_file"), ok)


def test_secrets_are_masked_and_long_values_shortened(registry):
    key = "sk-proj-" + "A1b2C3d4" * 6
    result = check(registry, "place_order", {"customer": "x" * 500, "items": [{"sku": "ABC-1", "qty": 1}],
                                             "api_key": 12345, "priority": f"Bearer {key}"})
    errors = errors_of(result)
    assert errors["/api_key"]["given"] == "<hidden: an integer>"
    assert key not in result.content and "12345" not in result.content and "***" in errors["/priority"]["given"]
    unknown = errors_of(check(registry, "read_file", {"path": "a", "password": "hunter2"}))
    assert "hunter2" not in str(unknown) and unknown["/password"]["given"] == "<hidden: a string of 7 chars>"
    shown = errors_of(check(registry, "read_file", {"path": ["y" * 300]}))["/path"]["given"]
    assert len(shown) < 120 and "(304 chars)" in shown


def test_a_misnamed_parameter_gets_a_rename_fix(registry):
    errors = errors_of(check(registry, "read_file", '{"file": "README.md"}'))
    assert errors["/file"]["fix"] == 'rename "file" to the required "path", or remove it.'
    typo = errors_of(check(registry, "read_file", {"path": "a", "limitt": 3}))
    assert typo["/limitt"]["fix"] == 'rename "limitt" to "limit".'


@pytest.mark.parametrize("name, first", [("readFile", "read_file"), ("functions.read_file", "read_file"),
                                         ("read_fil", "read_file"), ("ListDir", "list_dir"), ("greppp", "grep")])
def test_unknown_tool_lists_the_closest_names_first(registry, name, first):
    result = check(registry, name, "{}")
    assert result.code == ErrorCode.UNKNOWN_TOOL
    assert result.data["closest"][0] == first
    assert result.error.hint.startswith(f"did you mean {first}")
    assert "place_order" in result.error.hint  # and every tool that exists


def test_unknown_tool_lists_the_closest_names():
    result = unknown_tool(ToolCall(id="a", name="read_fil"), ["read_file", "write_file", "grep"])
    assert result.code is ErrorCode.UNKNOWN_TOOL
    assert "did you mean read_file" in result.content


def test_unparsable_json_says_where_parsing_stopped(registry):
    truncated = check(registry, "read_file", '{"path": "README.md", "limit": [1, 2')
    assert "ends at line 1 column 37 (character 36 of 36)" in truncated.content
    assert "1 object ('}' missing) and 1 array (']' missing) never closed" in truncated.content
    assert truncated.content.count("parsing stopped after") == 1
    stray = check(registry, "read_file", '{"path": "a" "limit": 3}')
    assert "Expecting ',' delimiter at line 1 column 14 (character 13 of 24)" in stray.content
    assert "parsing stopped after '{\"path\": \"a\" ', before '\"limit\": 3}'" in stray.content
    quotes = check(registry, "read_file", "{'path': 'a'}")
    assert "double quotes" in quotes.error.hint
    secret = check(registry, "read_file", '{"path": "a", "api_key": "sk-ant-' + "x" * 30 + '"')
    assert "xxxxxxxxxx" not in secret.content


@pytest.mark.parametrize("raw, words", [
    ('{"path": "a", "path": "b"}', "given twice"),
    ('{"path": "a", "limit": NaN}', "NaN is not a JSON value"),
    ('"{\\"path\\": \\"a\\"}"', "JSON string that holds JSON"),
    ('["a"]', "must be a JSON object, not an array"),
])
def test_json_is_read_strictly(registry, raw, words):
    result = check(registry, "read_file", raw)
    assert result.code == ErrorCode.INVALID_ARGUMENT and words in result.content


def test_empty_arguments_mean_no_arguments(registry):
    assert parse_arguments(ToolCall(id="a", name="list_dir", arguments="")) == {}
    assert check(registry, "list_dir", "")[1] == {}
    assert check(registry, "list_dir", "  \n")[1] == {}


def test_json_null_arguments_mean_no_arguments(registry):
    """Groq writes the call of a tool without parameters as ``arguments: "null"``
    (langchain-ai/langchain#33896, "it sends arguments: 'null' (JSON null)"): it was INVALID_ARGUMENT
    "must be a JSON object, not null", a call the model wrote right and could not write otherwise.
    JSON null means no arguments, as empty text and a missing field do; a tool with required
    parameters then says which are missing. Any other non-object is still refused."""
    assert parse_arguments(ToolCall(id="a", name="list_dir", arguments="null")) == {}
    assert check(registry, "list_dir", " null\n")[1] == {}
    missing = check(registry, "read_file", "null")
    assert missing.code == ErrorCode.INVALID_ARGUMENT and "path" in missing.content
    for raw in ('"null"', "[null]", "0", "false"):
        assert check(registry, "list_dir", raw).code == ErrorCode.INVALID_ARGUMENT, raw
