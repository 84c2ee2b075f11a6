"""``toolfleet up | down``: the local stack (Redis, workers, Flower) of :mod:`.stack`.

Imported by :mod:`.cli` at its end (it reuses the CLI's options and helpers); importing it
registers the commands on the CLI's ``app``.
"""

from __future__ import annotations

import os
import shlex
from typing import Annotated

import typer
from rich.markup import escape

from . import stack
from .cli import NamespaceOpt, ToolsOpt, _fail, app, out
from .errors import ToolfleetError
from .stack_state import home


@app.command()
def up(
    workers: Annotated[int, typer.Option("--workers", "-n", help="Worker processes (prefork).")] = 2,
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Run in the background; stop with `toolfleet down`.")
    ] = False,
    flower_port: Annotated[int, typer.Option(help="Flower's port.")] = 5555,
    no_flower: Annotated[bool, typer.Option("--no-flower", help="Do not start Flower.")] = False,
    namespace: NamespaceOpt = None,
    tools: ToolsOpt = None,
    ready_timeout_s: Annotated[float, typer.Option(
        "--ready-timeout", help="Seconds to wait for the stack to be ready (workers' tools in the catalog, "
        "Flower answering); past that, what started is stopped and the part not ready is named.")
    ] = stack.START_TIMEOUT_S,
) -> None:
    """Start a local stack: Redis (reused if one answers at REDIS_URL; else a private one, at
    REDIS_URL's port when it is set and local), workers, Flower. Returns (with -d) once the
    workers serve their tools and Flower answers."""
    try:
        state = stack.up(
            workers=workers,
            flower_port=None if no_flower else flower_port,
            namespace=namespace,
            tool_modules=tools or [],
            console=out,
            ready_timeout_s=ready_timeout_s,
        )
    except ToolfleetError as exc:
        _fail(exc)
    if detach:
        # a stack of another home is stopped only with that home set (a newcomer's find: the demo's
        # `up` said plain `toolfleet down`, which found no stack and left its 5 processes running)
        where = "" if "TOOLFLEET_HOME" not in os.environ else f"TOOLFLEET_HOME={shlex.quote(str(home()))} "
        out.print(f"stack is ready in the background (namespace {state['namespace']}); stop it with "
                  f"[bold]{escape(where)}toolfleet down[/]")
        return
    out.print("stack is running; press Ctrl-C to stop it")
    try:
        stack.wait(state)
    except KeyboardInterrupt:
        pass
    finally:
        stack.down(console=out)


@app.command()
def down() -> None:
    """Stop the local stack started by `toolfleet up -d`."""
    stack.down(console=out)
