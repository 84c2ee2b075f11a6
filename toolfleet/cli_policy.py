"""``toolfleet pending | approve | deny | rules | trace``: answering approvals and reading the audit
trail from any terminal (the state lives in Redis, so this need not be the process that submitted).

Imported by :mod:`.cli` at its end (it reuses the CLI's options and helpers); importing it
registers the commands on the CLI's ``app``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cli import NamespaceOpt, RedisOpt, _fail, _settings, app, err, out
from .errors import ToolfleetError

RememberOpt = Annotated[
    Optional[str],
    typer.Option("--remember", help="Keep the answer as a rule for this workspace: a command pattern such as "
                 "'git *', or 'tool' for the whole tool."),
]
ByOpt = Annotated[Optional[str], typer.Option("--by", help="Who answers (default: user@host).")]


def announce_pending(turn, console: Console) -> None:
    """Print, once the turn settles, the calls waiting for approval and how to answer them."""

    def watch() -> None:
        try:
            pending = turn.wait_settled()
        except Exception:  # the turn failed: results() reports it
            return
        if not pending:
            return
        console.print(f"[bold yellow]{len(pending)} call(s) wait for approval[/] (turn {turn.turn_id}):")
        for call in pending:
            console.print(f"  {escape(call.call_id)}  {call.name} {escape(json.dumps(call.arguments))}\n"
                          f"      why: {escape(call.reason)}")
        from .cli import where

        settings = getattr(turn, "_settings", None)
        opts = where(settings) if settings is not None else ""
        console.print(f"answer with: toolfleet approve {turn.turn_id} CALL_ID{opts}  |  "
                      f"toolfleet deny {turn.turn_id} CALL_ID --reason TEXT{opts}")

    threading.Thread(target=watch, name="toolfleet-pending", daemon=True).start()


def _remember(value: str | None) -> str | bool:
    if not value:
        return False
    return True if value == "tool" else value


def register(app: typer.Typer) -> None:  # noqa: C901 - one nested function per command
    """Add the policy commands to the CLI ``app``."""

    def approvals(redis_url: str | None, namespace: str | None):
        from .dispatcher.approvals import Approvals
        from .ledger import Ledger
        from .policy import RuleStore

        ledger = Ledger(_settings(redis_url, namespace))
        return Approvals(ledger, RuleStore(ledger.redis, ledger.keys, ledger.settings.redis_url))

    @app.command()
    def pending(
        turn_id: Annotated[str, typer.Argument(help="The turn.")],
        redis_url: RedisOpt = None,
        namespace: NamespaceOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List the calls of a turn waiting for a person's approval."""
        try:
            calls = approvals(redis_url, namespace).pending(turn_id)
        except ToolfleetError as exc:
            _fail(exc)
        if as_json:
            print(json.dumps([c.__dict__ for c in calls], indent=2, default=str))
            return
        if not calls:
            out.print(escape(f"no call of turn {turn_id} waits for approval"))
            return
        from rich.text import Text

        from .terminal import whole_width

        table = Table(title=f"turn {turn_id}: waiting for approval", show_lines=True)
        ids_and_tools = [c.call_id for c in calls] + [c.name for c in calls] + ["call id / tool"]
        table.add_column("call id / tool", overflow="fold", width=whole_width(ids_and_tools, out.width, 40))
        for column in ("arguments", "why"):
            table.add_column(column, overflow="fold")
        for c in calls:  # the id whole on its line, the tool under it (model-chosen text: never markup)
            table.add_row(Text(c.call_id) + Text("\n" + c.name, style="bold"), Text(json.dumps(c.arguments)),
                          Text(c.reason))
        out.print(table)

    @app.command()
    def approve(
        turn_id: Annotated[str, typer.Argument(help="The turn.")],
        call_id: Annotated[str, typer.Argument(help="The call waiting for approval.")],
        remember: RememberOpt = None,
        by: ByOpt = None,
        redis_url: RedisOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Let one held call run, in its place in the plan."""
        try:
            rule = approvals(redis_url, namespace).approve(turn_id, call_id, by=by, remember=_remember(remember))
        except ToolfleetError as exc:
            _fail(exc)
        said = f"; {rule.describe()} (rule {rule.id})" if rule else ""
        out.print(escape(f"approved {call_id} of turn {turn_id}{said}"))  # ids and patterns are text, not markup

    @app.command()
    def deny(
        turn_id: Annotated[str, typer.Argument(help="The turn.")],
        call_id: Annotated[str, typer.Argument(help="The call waiting for approval.")],
        reason: Annotated[str, typer.Option("--reason", help="Told to the model.")] = "a person denied it",
        remember: RememberOpt = None,
        by: ByOpt = None,
        redis_url: RedisOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Refuse one held call: its result is PERMISSION_DENIED with the reason."""
        try:
            rule = approvals(redis_url, namespace).deny(turn_id, call_id, reason, by=by, remember=_remember(remember))
        except ToolfleetError as exc:
            _fail(exc)
        said = f"; {rule.describe()} (rule {rule.id})" if rule else ""
        out.print(escape(f"denied {call_id} of turn {turn_id}{said}"))  # ids and patterns are text, not markup

    @app.command()
    def rules(
        forget: Annotated[Optional[str], typer.Option("--forget", help="Remove the rule with this id.")] = None,
        redis_url: RedisOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """List the remembered approval rules (or forget one)."""
        from .policy import RuleStore
        from .redis_client import connect

        settings = _settings(redis_url, namespace)
        try:
            from .keys import Keys

            store = RuleStore(connect(settings.ledger), Keys(settings.namespace), settings.redis_url)
            if forget:
                if not store.forget(forget):
                    _fail(ToolfleetError(f"no remembered rule {forget!r}"))
                out.print(escape(f"forgot rule {forget}"))
                return
            found = store.all()
        except ToolfleetError as exc:
            _fail(exc)
        if not found:
            out.print("no remembered rules")
            return
        table = Table(title="remembered rules")
        for column in ("id", "tool", "action", "pattern", "workspace", "by"):
            table.add_column(column, overflow="fold")
        for r in found:
            table.add_row(escape(r.id), escape(r.tool), r.action, escape(r.pattern or "(whole tool)"),
                          escape(r.workspace or "(all)"), escape(r.by))
        out.print(table)

    @app.command()
    def trace(
        turn_id: Annotated[str, typer.Argument(help="The turn.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the raw audit events as JSON.")] = False,
        width: Annotated[int, typer.Option("--width", help="Characters of the time axis.")] = 48,
        html_file: Annotated[Optional[Path], typer.Option(
            "--html", help="Write the turn as a self-contained HTML page (plan graph, timeline per call and "
            "worker, the cancel) to FILE.", dir_okay=False)] = None,
        redis_url: RedisOpt = None,
        namespace: NamespaceOpt = None,
    ) -> None:
        """Print a turn as a timeline: one row per call, its wait and run on a shared time axis
        (--html FILE: a page drawing its plan as a graph and its timeline per call and worker)."""
        from .audit import AuditLog
        from .keys import Keys
        from .redis_client import connect
        from .trace import build_timeline, print_timeline

        settings = _settings(redis_url, namespace)
        try:
            log = AuditLog(connect(settings.ledger), Keys(settings.namespace), settings.result_ttl_s)
            events = log.read(turn_id)
        except ToolfleetError as exc:
            _fail(exc)
        if as_json:
            print(json.dumps([{"id": e.stream_id, "type": e.type, "call_id": e.call_id, **e.data} for e in events],
                             indent=2))
            return
        if not events:
            err.print(escape(f"no audit trail for turn {turn_id} in namespace {settings.namespace} "
                             "(unknown or expired)"))
            raise typer.Exit(1)
        if html_file is not None:
            from .trace_html import render_html

            try:
                html_file.write_text(render_html(turn_id, events), encoding="utf-8")
            except OSError as exc:
                _fail(ToolfleetError(f"cannot write {html_file}: {exc}"))
            out.print(f"wrote {html_file} (open it in a browser)", markup=False, highlight=False)
            return
        print_timeline(out, build_timeline(turn_id, events), width=max(width, 10))


register(app)
