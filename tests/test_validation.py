"""Validation of calls against tools: the messages a model acts on."""

from __future__ import annotations

from toolfleet import ErrorCode, ToolCall
from toolfleet.tools.files import read_file
from toolfleet.tools.validation import check_arguments, parse_arguments, unknown_tool


def test_empty_arguments_mean_no_arguments():
    assert parse_arguments(ToolCall(id="a", name="list_dir", arguments="")) == {}


def test_unparsable_json_says_where_parsing_stopped():
    result = parse_arguments(ToolCall(id="a", name="read_file", arguments='{"path": "README.md"'))
    assert result.code is ErrorCode.INVALID_ARGUMENT
    assert "line 1 column" in result.content and "README.md" in result.content


def test_every_violation_is_reported_with_where_given_and_fix():
    result = check_arguments(read_file, "a", {"file": "README.md", "limit": "ten"})
    assert result.code is ErrorCode.INVALID_ARGUMENT
    text = result.content
    assert "/path: required parameter 'path' is missing" in text
    assert '/limit: expected an integer, given "ten"' in text
    assert "unknown parameter(s) 'file'" in text
    assert "3 problem(s)" in text


def test_no_silent_coercion():
    assert check_arguments(read_file, "a", {"path": "x", "offset": "2"}) is not None
    assert check_arguments(read_file, "a", {"path": "x", "offset": 2}) is None


def test_unknown_tool_lists_the_closest_names():
    result = unknown_tool(ToolCall(id="a", name="read_fil"), ["read_file", "write_file", "grep"])
    assert result.code is ErrorCode.UNKNOWN_TOOL
    assert "did you mean read_file" in result.content
