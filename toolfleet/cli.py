"""``toolfleet worker | run | cancel | tools`` (``run`` from :mod:`.cli_run`; and, from :mod:`.cli_stack`,
``up | down``; from :mod:`.cli_policy`, ``pending | approve | deny | rules | trace``).

Environment variables are read here, at the edge: ``REDIS_URL``, ``TOOLFLEET_BROKER_URL``,
``TOOLFLEET_NAMESPACE``, ``TOOLFLEET_POLICY`` (a policy file); when none is set and
``toolfleet up`` started a private Redis, its URL is taken from the stack's state file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape

from . import stack
from .cli_words import FORMAT_ALIASES, FORMATS, check_format, cli_words, one_line, plain_argument_names
from .defaults import DEFAULT_REDIS_URL
from .errors import ToolfleetError
from .terminal import make_console

if TYPE_CHECKING:
    from .settings import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Run LLM tool calls on Celery workers.")
out = make_console()  # a terminal's width; 120 columns (or $COLUMNS) when piped
err = make_console(stderr=True)

RedisOpt = Annotated[
    Optional[str],
    typer.Option("--redis-url", help="Redis URL (default: $REDIS_URL, the local stack's, or redis://127.0.0.1:6379/0)."),
]
NamespaceOpt = Annotated[
    Optional[str],
    typer.Option("--namespace", help="Key and queue prefix (default: $TOOLFLEET_NAMESPACE, else toolfleet-<user>)."),
]
ToolsOpt = Annotated[Optional[list[str]], typer.Option("--tools", help=(
    "A tool module to import: a dotted name (importable from sys.path) or the path of a .py file "
    "(repeatable)."))]
PolicyOpt = Annotated[
    Optional[Path],
    typer.Option("--policy", help="Policy file, TOML or JSON (default: $TOOLFLEET_POLICY, else everything allowed).",
                 dir_okay=False),
]
BrokerOpt = Annotated[
    Optional[str],
    typer.Option("--broker-url", help="Celery broker, e.g. amqp://guest:guest@127.0.0.1:5672// "
                 "(default: $TOOLFLEET_BROKER_URL, else the Redis URL)."),
]


def _settings(redis_url: str | None, namespace: str | None, broker_url: str | None = None,
              insecure_no_signing: bool = False) -> Settings:
    """Settings from the environment and options; a running local stack fills in its Redis URL
    and its fleet key (when the environment names none)."""
    import os

    from .settings import Settings

    if not redis_url and not os.environ.get("REDIS_URL"):
        redis_url = stack.running_redis_url()
    try:
        return Settings.from_env(stack.with_local_fleet_key(), redis_url=redis_url, namespace=namespace,
                                 broker_url=broker_url, insecure_no_signing=insecure_no_signing or None)
    except ToolfleetError as exc:  # an unreadable key file, both key sources
        _fail(exc)
        raise
    except ValueError as exc:  # a bad value in the environment or an option: one line naming it
        _fail(ToolfleetError(f"invalid setting: {one_line(exc)}"))
        raise  # unreachable: _fail exits


def _policy(path: Path | None):  # -> Policy | None
    import os

    from .policy import Policy

    chosen = path or (Path(os.environ["TOOLFLEET_POLICY"]) if os.environ.get("TOOLFLEET_POLICY") else None)
    return Policy.load(chosen) if chosen else None


def _fail(exc: Exception, code: int = 1) -> None:
    """Print ``error: MESSAGE`` on stderr as one line (not wrapped at 80 columns when piped; the
    message's brackets are text, not markup), in the CLI's words, secrets masked (a ``--mcp``
    command's DSN with its password, quoted by a server that would not start), and exit with ``code``."""
    from .tools.redact import redact_text

    err.print(f"[bold red]error:[/] {escape(redact_text(cli_words(str(exc))))}", soft_wrap=True)
    raise typer.Exit(code)


def where(settings: Settings) -> str:
    """The options a printed follow-up command needs to reach the same turn: ``--namespace`` always
    (the default is only right for the default namespace), ``--redis-url`` when it is not the default
    and carries no password, neither before ``@`` nor as a query parameter (a password is never printed)."""
    from urllib.parse import parse_qsl, urlsplit

    from .tools.secret_shapes import is_secret_name

    extra = f" --namespace {settings.namespace}"
    url = settings.redis_url
    try:
        secret_query = any(is_secret_name(name) for name, _ in parse_qsl(urlsplit(url).query))
    except ValueError:
        secret_query = True
    if url != DEFAULT_REDIS_URL and "@" not in url and not secret_query:
        extra += f" --redis-url {url}"
    return extra


from . import cli_run  # noqa: E402,F401,I001  (registers `run` on `app`: first, as its commands are listed)


def _all_answered(ledger: Any, turn_id: str) -> bool:
    try:
        calls, results = ledger.calls(turn_id), ledger.results(turn_id)
    except ToolfleetError:
        return False
    return bool(calls) and set(calls) <= set(results)


@app.command()
def cancel(
    turn_id: Annotated[str, typer.Argument(help="The turn to cancel.")],
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Cancel a running turn from any process or machine."""
    from .ledger import Ledger

    try:
        ledger = Ledger(_settings(redis_url, namespace))
        n = ledger.cancel(turn_id, "cancelled with `toolfleet cancel`")
    except ToolfleetError as exc:
        _fail(exc)
    shown = escape(turn_id)  # the caller's text (Dispatcher.open_turn(turn_id=...)), not markup
    if n < 0:
        out.print(f"turn {shown} was already cancelled")
    elif n == 0 and _all_answered(ledger, turn_id):
        out.print(f"turn {shown} had already finished: every call has its result; nothing was stopped")
    else:
        out.print(f"turn {shown} cancelled: {n} call(s) will not start; running calls are being stopped")


@app.command("tools")
def tools_cmd(
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help="Print the request's `tools` list for a provider format: " + ", ".join(FORMATS[:3])
        + " (or a short name: " + ", ".join(FORMAT_ALIASES) + ").", callback=check_format)] = None,
    local: Annotated[bool, typer.Option(
        "--local", help="With --format: describe the built-in tools plus --tools, not the live workers'.")] = False,
    tools: ToolsOpt = None,
) -> None:
    """List the tools the live workers serve, or (--format) print them as a provider's tools list.

    With --format the tools are those the live workers of the namespace publish; when no worker is
    live (or Redis does not answer, or with --local or --tools) they are the built-in tools plus
    --tools modules. Where they came from is said on stderr."""
    from .dispatcher.adapters import get_adapter
    from .redis_client import connect
    from .tools.registry import default_registry
    from .view import print_catalog
    from .worker.catalog import live_catalog

    settings = _settings(redis_url, namespace)
    if fmt is not None:
        try:
            adapter = get_adapter(fmt)
            entries = [] if local or tools else _live_entries(settings)
            if entries:
                source: Any = list({t["name"]: t for e in entries for t in e["tools"]}.values())
                err.print(f"tools of {len(entries)} live worker(s) in namespace {settings.namespace!r}")
            else:
                source = default_registry(tools or [])
                err.print("built-in tools" + (f" plus {', '.join(tools)}" if tools else "")
                          + ("" if local or tools else " (no live worker)"))
        except ToolfleetError as exc:
            _fail(exc)
        print(json.dumps(adapter.tools(source), indent=2, ensure_ascii=False))
        return
    try:
        entries = live_catalog(settings, connect(settings.ledger))
    except ToolfleetError as exc:
        _fail(exc)
    if as_json:
        print(json.dumps(entries, indent=2))
    else:
        print_catalog(out, entries, settings.namespace)


def _live_entries(settings: Settings) -> list[dict[str, Any]]:
    """The live workers' catalog entries, or [] when Redis does not answer."""
    from .redis_client import connect
    from .worker.catalog import live_catalog

    try:
        return live_catalog(settings, connect(settings.ledger))
    except ToolfleetError:
        return []


from . import cli_worker  # noqa: E402,F401,I001  (registers `worker` on `app`)
from . import cli_mcp  # noqa: E402,F401,I001  (registers `mcp serve` on `app`)
from . import cli_stack  # noqa: E402,F401,I001  (registers up, down on `app`)
from . import cli_policy  # noqa: E402,F401,I001  (registers pending, approve, deny, rules, trace on `app`)
from . import cli_sessions  # noqa: E402,F401,I001  (registers sessions on `app`)
from . import cli_keys  # noqa: E402,F401,I001  (registers keygen on `app`)


def main() -> None:
    """The ``toolfleet`` command. Arguments read ``TURN_ID`` in usage lines, not typer's
    ``{turn_id}`` (issue 15, point 7)."""
    import typer.main

    command = typer.main.get_command(_only(sys.argv[1] if len(sys.argv) > 1 else None))
    plain_argument_names(command)
    command(prog_name="toolfleet")


def _only(name: str | None) -> typer.Typer:
    """``app`` with only the command (or group) ``name`` when there is one by that name: typer
    builds every command's parameters from its signature before running one (~0.1 s for all of
    them); the others are not needed to run this one. ``app`` itself for ``--help``, no name, or
    a name that is no command (click then says so, listing them)."""
    import copy

    commands = [c for c in app.registered_commands if (c.name or c.callback.__name__.replace("_", "-")) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not commands and not groups:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    only.callback()(_group)  # a group still (typer runs a lone command as the program itself)
    return only


def _group() -> None:
    """Run LLM tool calls on Celery workers."""


if __name__ == "__main__":
    sys.exit(main())
