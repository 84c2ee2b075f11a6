"""The tool SDK and the built-in tools, called in-process (their distributed path is in
test_turn.py and the case tests)."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import Field

from toolfleet import ConfigurationError, PermissionDenied, Registry, ToolContext, ToolFailure, tool
from toolfleet.tools.command import run_command
from toolfleet.tools.files import edit_file, grep, list_dir, read_file, write_file
from toolfleet.tools.output import EMPTY_OUTPUT, fit_output


def ctx_for(workspace) -> ToolContext:
    return ToolContext(call_id="c", turn_id="t", tool_name="x", workspace=workspace)


def test_schema_comes_from_type_hints_and_docstring():
    @tool(access="read", resources=lambda a: [])
    def lookup(ctx: ToolContext, sku: str, limit: Annotated[int, Field(ge=1)] = 5, exact: bool = False) -> str:
        """Look up a stock item.

        Args:
            sku: Stock keeping unit.
            limit: How many rows.
        """
        return sku

    assert lookup.description == "Look up a stock item."
    assert lookup.context_param == "ctx"
    params = lookup.parameters
    assert params["required"] == ["sku"] and params["additionalProperties"] is False
    assert params["properties"]["sku"] == {"type": "string", "description": "Stock keeping unit."}
    assert params["properties"]["limit"]["minimum"] == 1
    assert "ctx" not in params["properties"]
    assert Registry([lookup]).chat_tools()[0]["function"]["name"] == "lookup"


def test_bad_declarations_are_refused_at_registration():
    with pytest.raises(ConfigurationError):
        tool(name="has space")(lambda: "")
    with pytest.raises(ConfigurationError):
        tool(access="delete")(lambda: "")  # type: ignore[arg-type]
    reg = Registry([read_file])
    with pytest.raises(ConfigurationError):
        reg.add(tool(name="read_file")(lambda: ""))


def test_paths_stay_inside_the_workspace(workspace, tmp_path):
    ctx = ctx_for(workspace)
    (tmp_path / "secret.txt").write_text("s3cret")
    (workspace / "link").symlink_to(tmp_path / "secret.txt")
    for path in ("../../etc/passwd", "/etc/passwd", "link", "src/../../secret.txt"):
        with pytest.raises(PermissionDenied):
            read_file(path=path, ctx=ctx)
    assert "inventory-service" in read_file(path=str(workspace / "README.md"), ctx=ctx)


def test_read_file_pages_by_line(workspace):
    ctx = ctx_for(workspace)
    text = read_file(path="logs/app.log", ctx=ctx, offset=2, limit=3)
    assert text.count("\n") >= 3 and "read on with offset=5" in text


def test_edit_file_needs_exactly_one_match(workspace):
    ctx = ctx_for(workspace)
    write_file(ctx=ctx, path="notes/a.txt", content="x\nx\ny\n")
    with pytest.raises(ToolFailure, match="occurs 2 times"):
        edit_file(ctx=ctx, path="notes/a.txt", old_string="x", new_string="z")
    with pytest.raises(ToolFailure, match="not found"):
        edit_file(ctx=ctx, path="notes/a.txt", old_string="q", new_string="z")
    edit_file(ctx=ctx, path="notes/a.txt", old_string="y", new_string="z")
    assert (workspace / "notes/a.txt").read_text() == "x\nx\nz\n"


def test_grep_and_list_dir(workspace):
    ctx = ctx_for(workspace)
    assert "src/inventory/store.py:" in grep(ctx=ctx, pattern="OutOfStock", path="src", glob="*.py")
    assert list_dir(ctx=ctx).splitlines()[0] == "config/"
    with pytest.raises(ToolFailure) as info:
        grep(ctx=ctx, pattern="(")
    assert info.value.code == "INVALID_ARGUMENT"


def test_run_command_reports_exit_status_with_output(workspace):
    ctx = ctx_for(workspace)
    assert run_command(ctx=ctx, command="echo hi").strip() == "hi"
    with pytest.raises(ToolFailure) as info:
        run_command(ctx=ctx, command="echo oops >&2; exit 3")
    assert "status 3" in info.value.message and "oops" in info.value.output


def test_output_budget_keeps_head_and_tail_and_says_the_cut():
    text = "HEAD" + "x" * 10_000 + "TAIL"
    fitted = fit_output(text, 1000)
    assert len(fitted) <= 1000
    assert fitted.startswith("HEAD") and fitted.endswith("TAIL")
    assert f"of {len(text)} characters cut" in fitted
    assert fit_output("", 100) == EMPTY_OUTPUT and fit_output("ok", 100) == "ok"


def test_a_wrapped_docstring_summary_stays_one_sentence():
    """A summary hard-wrapped onto a second line was sent as two paragraphs ('... symbolic\\n\\nlinks as
    ...') and `toolfleet tools` cut it at its first line (a newcomer's trial)."""
    from toolfleet.tools.spec import tool

    @tool
    def wrapped(city: str) -> str:
        """Tell the weather of a city, in degrees Celsius, from the forecast of the
        national service.

        Second paragraph, also
        wrapped once.

        - a list item
        - another

        Args:
            city: The city.
        """
        return city

    assert wrapped.description == (
        "Tell the weather of a city, in degrees Celsius, from the forecast of the national service.\n\n"
        "Second paragraph, also wrapped once.\n\n- a list item\n- another")
    from toolfleet.tools.registry import default_registry
    listed = default_registry([]).get("list_dir").description
    assert listed.startswith("List a directory") and "\n" not in listed.split(".")[0], listed
