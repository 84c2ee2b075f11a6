"""``toolfleet run``: execute the tool calls of a recorded model response or stream and print their
results (a table with a live view, or ``--json``), and reading the recorded file it is given
(:func:`_read_payload`: a .json response, a .jsonl stream, or server-sent events).

Registered on :data:`toolfleet.cli.app` (first of its commands) when :mod:`toolfleet.cli` is imported;
the dispatcher and the adapters are imported inside the command, so ``toolfleet --help`` stays cheap.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.markup import escape

from .cli import BrokerOpt, NamespaceOpt, PolicyOpt, RedisOpt, ToolsOpt, _fail, _policy, _settings, app, err, out, where
from .cli_words import FORMAT_HELP, check_format, cli_words
from .errors import BatchRejected, ToolfleetError

if TYPE_CHECKING:
    from .settings import Settings


@app.command()
def run(
    response: Annotated[Path, typer.Argument(
        help="A recorded model response (.json) or stream (.jsonl, one event a line), in any provider format.",
        exists=True, dir_okay=False)],
    workspace: Annotated[Path, typer.Option("--workspace", "-w", help="Directory the tools work in (required: "
                                            "file tools and commands act there).", exists=True, file_okay=False)],
    cancel_after: Annotated[
        Optional[float], typer.Option("--cancel-after", help="Cancel the turn after S seconds.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    fmt: Annotated[Optional[str], typer.Option(
        "--format", help=FORMAT_HELP + " (default: from the file).", callback=check_format)] = None,
    timeout_s: Annotated[Optional[float], typer.Option(
        "--timeout", help="Give up after S seconds: the turn is cancelled (nothing of it runs later), its results "
        "so far are printed, and the exit status is 1.")] = None,
    redis_url: RedisOpt = None,
    namespace: NamespaceOpt = None,
    tools: ToolsOpt = None,
    policy: PolicyOpt = None,
    session: Annotated[
        Optional[str], typer.Option("--session", help="Session id: loop detection across runs, and the "
                                    "session of stateful tools (open one with `toolfleet sessions --open ID "
                                    "--tools MODULE`).")
    ] = None,
    broker_url: BrokerOpt = None,
) -> None:
    """Execute the tool calls of a recorded model response or stream and print their results.

    The tools are those the live workers publish (their full specs: no tool code is imported here);
    --tools modules are used where the live workers run the same version of them.

    With --json: ``messages`` are the results in the same provider's shape, ``assistant`` the
    model's own message(s) to put before them in the next request. Calls the policy asks about
    wait until approved or denied from another terminal (`toolfleet approve TURN CALL`); the
    commands to do so are printed."""
    import signal

    from .dispatcher import Dispatcher
    from .dispatcher.adapters import detect, detect_event, get_adapter
    from .dispatcher.adapters.base import results_for
    from .progress import live_progress
    from .tools.registry import Registry, default_registry
    from .view import print_results

    # SIGTERM ends the process through SystemExit, so the exit hook cancels the turn (nothing of
    # it runs later); a process killed outright leaves that to the turn's lease (turn_lease_s).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings = _settings(redis_url, namespace, broker_url)
    payload = _read_payload(response)
    warnings: list[str] = []
    try:
        adapter = get_adapter(fmt) if fmt else detect(payload)
        if not adapter.streamed and isinstance(payload, list) and payload and detect_event(payload[0]):
            adapter = get_adapter(f"{adapter.name}_stream")  # --format chat for a recorded chat stream
        # without --tools: the live workers' published specs (no tool code imported); with
        # --tools: those modules' specs where the live workers run the same version (published.py)
        registry = Registry.from_catalog(settings, default_registry(tools)) if tools else None
        dispatcher = Dispatcher(settings, registry, _policy(policy))
        options = {"workspace": str(workspace.resolve()), "session_id": session}
        started = time.monotonic()  # the run's time, --timeout and --cancel-after count from the submit
        if adapter.streamed:
            # a recorded stream that cannot be read is refused whole, before anything runs
            adapter.replay(payload if isinstance(payload, list) else [payload])
            with dispatcher.open_stream(format=adapter.name, **options) as stream:
                for event in payload if isinstance(payload, list) else [payload]:
                    stream.feed(event)
            turn, warnings = stream.turn, stream.warnings
        else:
            turn = dispatcher.submit_response(payload, format=adapter.name, **options)
    except BatchRejected as exc:
        if as_json:
            error = {"reason": exc.reason, "message": cli_words(str(exc)), "call_ids": list(exc.call_ids),
                     "pointer": getattr(exc, "pointer", "")}
            print(json.dumps({"turn_id": None, "error": error, "results": [], "messages": []}, indent=2))
        else:
            err.print(f"[bold red]batch refused:[/] {escape(cli_words(str(exc)))}", soft_wrap=True)
        raise typer.Exit(2) from None
    except ToolfleetError as exc:
        _fail(exc)
    from .cli_policy import announce_pending

    announce_pending(turn, err)
    # at once, with --json too (on stderr: stdout stays one JSON document), so the turn can be
    # cancelled from another terminal while it runs (issue 15, point 4)
    print(f"turn {turn.turn_id}: {len(turn.calls)} call(s); cancel it from anywhere with "
          f"`toolfleet cancel {turn.turn_id}{where(settings)}`", file=sys.stderr, flush=True)
    other_keys = _warn_other_keys(dispatcher, turn)
    if other_keys:  # in --json's "warnings" too: programs reading stdout see it (a newcomer's note)
        warnings = [*warnings, other_keys]
    cancelled_at: list[float] = []
    if cancel_after is not None:
        def _cancel() -> None:
            cancelled_at.append(time.monotonic())
            turn.cancel(f"cancelled after {cancel_after:g} s (--cancel-after)")
        timer = threading.Timer(max(cancel_after - (time.monotonic() - started), 0.0), _cancel)
        timer.daemon = True
        timer.start()
    gave_up: str | None = None
    left_s = None if timeout_s is None else max(timeout_s - (time.monotonic() - started), 0.0)
    try:
        if as_json:
            results = turn.results(left_s)
        else:
            results = live_progress(turn, out, left_s, lambda: dispatcher.ledger.audit.read(turn.turn_id))
    except TimeoutError as exc:
        # Giving up cancels the turn (Turn.results): nothing of it runs later. Print its results
        # as they are once the cancel has settled (final within cancel_grace_s), then exit 1.
        if not cancelled_at:
            cancelled_at.append(time.monotonic())  # the cancel of giving up: final_after_cancel_s counts from it
        missing = len(turn.calls) - len(_recorded(turn))
        results = _results_after_giving_up(turn, settings)
        ran = sum(1 for r in results if r.attempts)  # not `started`: that is the elapsed time's start
        gave_up = (f"{exc}; {missing} call(s) had no result yet when you gave up"
                   + ("" if ran else f"; none had started: is a worker serving these tools? `toolfleet tools"
                      f"{where(settings)}` lists what the live workers serve"))
    except ToolfleetError as exc:
        results = _recorded(turn)
        if not results:
            _fail(exc)
        gave_up = str(exc)
    finished = time.monotonic()
    if gave_up is None and not cancelled_at:
        elsewhere = _cancelled_elsewhere(dispatcher, turn, results)
        if elsewhere:
            warnings = [*warnings, elsewhere]
    if as_json:
        plan = turn.plan
        doc = {
            "turn_id": turn.turn_id,
            "format": turn.adapter.name,
            "results": [r.model_dump(mode="json") for r in results],
            "assistant": turn.assistant_messages(),
            "messages": results_for(turn.adapter, results, turn.response),
            "plan": {"waves": plan.waves(), "deps": {k: sorted(v) for k, v in plan.deps.items()}},
            "warnings": warnings,
            "elapsed_s": round(finished - started, 3),
            "final_after_cancel_s": round(finished - cancelled_at[0], 3) if cancelled_at else None,
        }
        if gave_up is not None:
            doc["error"] = {"reason": "gave_up", "message": gave_up}
        print(_json_text(doc))
    else:
        for warning in warnings:
            err.print(f"[yellow]warning:[/] {escape(warning)}")  # provider text: not markup
        print_results(out, turn, results, finished - started, finished - cancelled_at[0] if cancelled_at else None)
    dispatcher.close()
    if gave_up is not None:
        _fail(ToolfleetError(gave_up))


def _cancelled_elsewhere(dispatcher: Any, turn: Any, results: list[Any]) -> str | None:
    """What to tell when another process cancelled the turn (``toolfleet cancel``,
    ``Dispatcher.cancel``) and some of its calls were stopped or did not run; None otherwise, or
    when Redis cannot say. The exit status stays 0, as after ``--cancel-after``: the turn ended as
    someone asked, each call with its result (before, nothing said why the calls did not run)."""
    import redis

    from .models import ErrorCode

    stopped = [r.call_id for r in results if r.error is not None
               and r.error.code in (ErrorCode.CANCELLED, ErrorCode.NOT_EXECUTED)]
    if not stopped:
        return None
    try:
        reason = dispatcher.ledger.cancel_reason(turn.turn_id)
    except redis.RedisError:
        return None
    if reason is None:
        return None
    return (f"the turn was cancelled while it ran, not by this command ({reason!r}): "
            f"{len(stopped)} call(s) were stopped or did not run")


def _recorded(turn: Any) -> list[Any]:
    """The results the turn holds now, in model order (calls without one are left out)."""
    return [r for r in (turn.result(c.id) for c in turn.calls) if r is not None]


def _results_after_giving_up(turn: Any, settings: Settings) -> list[Any]:
    """After a give-up (the turn was cancelled): its final results, waiting at most
    ``cancel_grace_s`` + 3 s for the cancel to settle; else those recorded so far."""
    try:
        return turn.results(settings.cancel_grace_s + 3.0, cancel_on_timeout=False)
    except (TimeoutError, ToolfleetError):
        return _recorded(turn)


def _json_text(doc: Any) -> str:
    """``doc`` as JSON text that stdout can always write: non-ASCII kept as is, unless some text
    (from the response file: a lone surrogate) is not valid Unicode; then everything is escaped."""
    text = json.dumps(doc, indent=2, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(doc, indent=2, ensure_ascii=True, default=str)
    return text


def _read_payload(path: Path) -> Any:
    """A .json file's one value, or a .jsonl file's events (one JSON value a line) as a list.
    A .json file that holds several lines of JSON values is read as events too, and so is a stream
    saved as server-sent events (``data: {...}`` lines; comments, ``event:`` lines and ``[DONE]``
    skipped). Exits with code 2 and says where for a file that cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(ToolfleetError(f"cannot read {path}: {exc}"), 2)
    lines = [(n, line) for n, line in enumerate(_LINE_END.split(text), 1) if _event_text(line) is not None]
    line_no = 0
    try:
        if path.suffix == ".jsonl" or text.lstrip().startswith(("data:", ":", "event:")):
            events = []
            for line_no, line in lines:  # noqa: B007 (line_no is read by the except below)
                events.append(json.loads(_event_text(line)))
            return events
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            if len(lines) > 1:
                events = []
                for line_no, line in lines:  # noqa: B007 (line_no is read by the except below)
                    events.append(json.loads(_event_text(line)))
                return events
            raise
    except (ValueError, RecursionError) as exc:  # not JSON, a number past the digit limit, too deep
        where = f" (line {line_no})" if line_no else ""
        what = "nests too deep" if isinstance(exc, RecursionError) else f"is not JSON ({exc})"
        _fail(ToolfleetError(f"cannot read {path}{where}: it {what}; expected a provider response saved as "
                             "JSON (chat completion, Responses or Anthropic message) or a .jsonl stream"), 2)


_LINE_END = re.compile(r"\r\n|\r|\n")
"""Where a line of a recorded stream ends, as JSON Lines and server-sent events define it: CR, LF or
CRLF only. ``str.splitlines`` also breaks at U+2028, U+2029 and U+0085, which a JSON string may
hold unescaped (text the model wrote), and cut such an event in two ("not JSON")."""


def _event_text(line: str) -> str | None:
    """The JSON text of one stream line, or None for a line that holds no event (blank, an SSE
    comment or field other than ``data``, ``[DONE]``)."""
    line = line.strip()
    if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
        return None
    if line.startswith("data:"):
        line = line[5:].strip()
    return None if line in ("", "[DONE]") else line


def _warn_other_keys(dispatcher: Any, turn: Any) -> str:
    """Say (stderr) which live workers of another fleet key take from the queues of this turn's
    tools: each drops the calls it takes, sent again seconds later (a worker started by hand
    before `toolfleet down` and `up`; a newcomer's trial saw four reads take 19 s and no word).
    Returns the warning ("" if none)."""
    try:
        shared = dispatcher.availability.shared_with_other_keys()
    except Exception:  # noqa: BLE001 - a warning only
        return ""
    names = {c.name for c in turn.calls}
    workers = sorted({w for tool, ws in shared.items() if tool in names for w in ws})
    if not workers:
        return ""
    from .worker.catalog import other_key_warning

    warning = other_key_warning(
        workers, dispatcher.settings.namespace, "They take from the queues of this turn's tools: each call "
        "they take is sent again seconds later. Restart them with the fleet's key (a worker started by hand "
        "before `toolfleet down` and `up` holds the old one; docs/signing.md).")
    err.print("warning: " + warning, style="bold yellow", markup=False, soft_wrap=True)
    return warning
