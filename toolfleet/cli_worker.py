"""``toolfleet worker``: a Celery worker (prefork pool) serving the tools, checked before it starts:
its settings, its fleet key (docs/signing.md), its Redis rights (docs/deploying.md) and its sandbox
(docs/sandbox.md).

Imported by :mod:`.cli` at its end (it reuses the CLI's options and helpers); importing it
registers the command on the CLI's ``app``.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Optional

import typer

from .cli import BrokerOpt, NamespaceOpt, PolicyOpt, RedisOpt, ToolsOpt, _fail, _policy, _settings, app, err
from .cli_words import one_line
from .errors import ToolfleetError
from .keys import Keys


@app.command()
def worker(
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
    tools: ToolsOpt = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Worker processes.")] = 2,
    hostname: Annotated[Optional[str], typer.Option(
        help="Celery node name, e.g. tools@%h (default: worker<pid>@<host>, its own on the host: two workers "
        "of one name would overwrite each other's tool catalog).")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "INFO",
    policy: PolicyOpt = None,
    broker_url: BrokerOpt = None,
    sandbox: Annotated[Optional[str], typer.Option(
        "--sandbox", help='What run_command runs in: "bwrap" (bubblewrap, default) or "none" (unsandboxed, '
        "on purpose only; default: $TOOLFLEET_SANDBOX).")] = None,
    network: Annotated[Optional[str], typer.Option(
        "--network", help='Network of sandboxed commands: "none" (default) or "host" '
        "(default: $TOOLFLEET_SANDBOX_NETWORK).")] = None,
    no_builtins: Annotated[bool, typer.Option("--no-builtins", help="Serve only the --tools modules' tools.")] = False,
    replace: Annotated[Optional[list[str]], typer.Option(
        "--replace", help="A built-in tool that a --tools module's tool of the same name replaces "
        "(repeatable).")] = None,
    mcp: Annotated[Optional[list[str]], typer.Option("--mcp", help="Host a stdio MCP server, NAME=COMMAND "
                                                     "(repeatable): its tools are served as NAME__tool.")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        "--metrics-port", envvar="TOOLFLEET_METRICS_PORT", help="Serve Prometheus metrics of this worker node "
        "on this port (/metrics; docs/observability.md).")] = None,
    result_log: Annotated[str, typer.Option(
        "--result-log", envvar="TOOLFLEET_RESULT_LOG", help='One line per call result: "text" (default, '
        'through the worker log at INFO) or "json" (one object a line).')] = "text",
    result_log_file: Annotated[Optional[str], typer.Option(
        "--result-log-file", envvar="TOOLFLEET_RESULT_LOG_FILE", help="Append the result lines to this file "
        "(default: stderr).")] = None,
    insecure_no_signing: Annotated[bool, typer.Option(
        "--insecure-no-signing", help="Run call messages without a fleet signature (on purpose only: whoever "
        "can write to the broker can then run tools here). Default: a fleet key is required "
        "($TOOLFLEET_FLEET_KEY or $TOOLFLEET_FLEET_KEY_FILE; docs/signing.md).")] = False,
) -> None:
    """Run a worker (prefork pool) serving the built-in tools plus --tools modules (--no-builtins:
    only the modules'; --replace NAME: a module's tool NAME in the built-in's place).

    It first runs a trivial command in the sandbox: if that fails, run_command is not served
    (the reason is printed) unless --sandbox none was chosen explicitly. It refuses to start
    without a fleet key unless --insecure-no-signing is given (docs/signing.md)."""
    from .access import check_worker_access
    from .redis_client import connect
    from .tools.registry import default_registry
    from .tools.sandbox import serve_sandboxed
    from .worker.app import create_app

    try:
        settings = _settings(redis_url, namespace, broker_url, insecure_no_signing)
        if sandbox or network:
            settings = settings.model_copy(update={k: v for k, v in (("sandbox", sandbox),
                                                                     ("sandbox_network", network)) if v})
            settings = type(settings).model_validate(settings.model_dump())  # check the overridden values
    except ValueError as exc:  # pydantic's ValidationError: a wrong value in the environment or options
        _fail(ToolfleetError(f"invalid setting: {one_line(exc)}"))
    try:
        keys = settings.require_signing("worker")
        if keys is None:
            err.print("warning: fleet signing is off (--insecure-no-signing): any message that reaches this "
                      "worker's queues runs", style="bold yellow", markup=False)
        # Redis refusing this worker's user a right it needs stops it here, with Redis's reason
        check_worker_access(connect(settings.redis_url), settings)
        if settings.ledger != settings.redis_url:  # the ledger on a cluster of its own (docs/scaling.md)
            connect(settings.ledger)
        registry, message = serve_sandboxed(
            default_registry(tools or [], builtins=not no_builtins, replace=replace or []), settings)
        if message:
            err.print(message, style="bold yellow", markup=False)
        if mcp:  # toolfleet.integrations.mcp_host (the `mcp` extra)
            from .cli_mcp import host_servers
            host_servers(registry, mcp)
        rules = _policy(policy)
        celery_app = create_app(settings, registry, rules)
        from .observe.worker_setup import setup_worker_observability  # traces, metrics, result log

        setup_worker_observability(celery_app, celery_app.toolfleet, metrics_port=metrics_port,
                                   result_log=result_log, result_log_file=result_log_file)
    except ValueError as exc:
        _fail(ToolfleetError(f"invalid option: {exc}"))
    except ToolfleetError as exc:
        _fail(exc)
    keys = Keys(settings.namespace)
    argv = [
        "worker",
        "--pool=prefork",  # with conf.worker_pool set, Celery takes toolfleet's prefork subclass
        f"--concurrency={concurrency}",
        f"--queues={','.join(keys.queue(q) for q in registry.queues())}",
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
    ]
    argv.append(f"--hostname={hostname or f'worker{os.getpid()}@%h'}")
    _warn_neighbours(settings, hostname)
    celery_app.worker_main(argv)


def _warn_neighbours(settings: Any, hostname: str | None) -> None:
    """Say (stderr) which live workers of the namespace would drop this worker's dispatchers' calls
    (another fleet key: they share its queues), and whether one already has this node name."""
    import socket

    from .worker.catalog import key_mismatch, live_catalog, other_key_warning, signing_key_id

    try:
        entries = live_catalog(settings)
    except Exception:  # noqa: BLE001 - a warning only: the worker's own start says what is wrong
        return
    others = key_mismatch(entries, signing_key_id(settings))
    if others:
        err.print("warning: " + other_key_warning(
            others, settings.namespace, "Give every worker and dispatcher of a namespace the same key "
            "(docs/signing.md), or this worker a namespace of its own (--namespace)."),
            style="bold yellow", markup=False)
    name = (hostname or "").replace("%h", socket.gethostname())
    if name and any(e.get("worker") == name for e in entries):
        err.print(f"warning: a live worker named {name!r} already serves namespace {settings.namespace!r}: the "
                  "two overwrite each other's tool catalog. Give this one its own name (--hostname NAME@%h).",
                  style="bold yellow", markup=False)
