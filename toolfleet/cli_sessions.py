"""``toolfleet sessions``: list the open sessions with stored state, open one, close one
(issue 13, item 2). Imported by :mod:`.cli` at its end; importing it registers the command."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .cli import NamespaceOpt, RedisOpt, ToolsOpt, _fail, _settings, app, out
from .errors import ToolfleetError

if TYPE_CHECKING:  # not at import: `toolfleet --help` imports no pydantic (tests/test_newcomer.py)
    from .settings import Settings


@app.command()
def sessions(
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
    open_id: Annotated[Optional[str], typer.Option(
        "--open", help="Open this session id with the initial states of the --tools modules' "
        "tools.")] = None,
    tools: ToolsOpt = None,
    state: Annotated[Optional[list[str]], typer.Option(
        "--state", help="With --open: NAME=JSON, a state's initial value (repeatable).")] = None,
    ttl_s: Annotated[Optional[int], typer.Option(
        "--ttl-s", help="With --open: expiry after the last save (s).")] = None,
    close: Annotated[Optional[str], typer.Option(
        "--close", help="Close this session (its states are deleted, its live shell ended).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """List the open sessions: those with stored state (id, age, expiry, each state's version and
    size) and those with a live shell (the worker holding it, its idle expiry); or open or close
    one. Exit 1 with a clear error when Redis does not answer or a value is bad (an empty id too)."""
    from .keys import Keys
    from .redis_client import connect
    from .tools.state import SessionStore

    try:
        settings = _settings(redis_url, namespace)
        client = connect(settings.ledger)
        store = SessionStore(client, Keys(settings.namespace), url=settings.redis_url,
                             default_ttl_s=settings.result_ttl_s)
        for option, given in (("--open", open_id), ("--close", close)):
            if given is not None and not given.strip():
                raise ToolfleetError(f"{option}: give a session id (it was empty)")
        if open_id:
            from .dispatcher.sessions import open_session
            from .tools.registry import default_registry

            initial = {}
            for item in state or []:
                name, sep, text = item.partition("=")
                if not sep:
                    raise ToolfleetError(f"--state {item!r}: expected NAME=JSON")
                try:
                    initial[name] = json.loads(text)
                except ValueError as exc:
                    raise ToolfleetError(f"--state {name}: not JSON ({exc})") from exc
            open_session(store, default_registry(tools or []), open_id, state=initial, ttl_s=ttl_s)
            out.print(escape(f"opened session {open_id}"))  # ids and names are text, not markup
            return
        if close:
            import redis

            from .dispatcher.affinity import close_live_session
            from .errors import BrokerUnavailable

            stored = store.close(close)
            try:
                live = close_live_session(settings, close) is not None  # its holder ends the shell
            except redis.RedisError as exc:
                raise BrokerUnavailable(settings.ledger, str(exc)) from exc
            out.print(escape(f"closed session {close}" if stored or live else f"session {close} was not open"))
            return
        listed = _with_live_shells(settings, store.sessions())
    except ToolfleetError as exc:
        _fail(exc)
        return
    if as_json:
        print(json.dumps(listed, indent=2))
        return
    table = Table("session", "age", "expires in", "states (version, bytes)", "live shell (worker, idle expiry)")
    now = time.time()
    for s in listed:
        states = ", ".join(f"{n} (v{v['version']}, {v['size_bytes']} B)" for n, v in s["states"].items())
        shell = s["live_shell"]
        held = "-" if shell is None else (f"{shell['worker']}{'' if shell['worker_alive'] else ' (gone)'}, "
                                          f"{shell['idle_expires_in_s']} s")
        stored = s["opened_at"] is not None
        table.add_row(escape(s["session_id"]), f"{now - s['opened_at']:.0f} s" if stored else "-",
                      f"{s['expires_in_s']} s" if stored else "-", escape(states or "-"), escape(held))
    out.print(table if listed else "no open sessions")


def _with_live_shells(settings: Settings, stored: list[dict]) -> list[dict]:
    """``stored`` (:meth:`SessionStore.sessions`) with each one's ``live_shell`` (the
    :func:`~toolfleet.dispatcher.affinity.live_sessions` entry, or None), then the sessions that have
    a live shell and no stored state (``opened_at``, ``touched_at``, ``ttl_s``, ``expires_in_s``
    None, ``states`` empty), by id. BrokerUnavailable when Redis does not answer."""
    import redis

    from .dispatcher.affinity import live_sessions
    from .errors import BrokerUnavailable

    try:
        shells = live_sessions(settings)
    except redis.RedisError as exc:
        raise BrokerUnavailable(settings.ledger, str(exc)) from exc
    listed = [{**s, "live_shell": shells.pop(s["session_id"], None)} for s in stored]
    return listed + [{"session_id": sid, "opened_at": None, "touched_at": None, "ttl_s": None, "expires_in_s": None,
                      "states": {}, "live_shell": shell} for sid, shell in sorted(shells.items())]
