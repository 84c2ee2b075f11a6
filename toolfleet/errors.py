"""Exceptions raised by toolfleet's public API.

Tree::

    ToolfleetError
    ├── ConfigurationError      a tool or setting is declared wrongly (raised at registration)
    ├── BatchRejected           the whole batch cannot be run (duplicate call ids, unreadable payload)
    ├── BrokerUnavailable       Redis (broker or result store) does not answer
    │   └── BrokerRefused       Redis answers but refuses the login or a command (ACL rules)
    ├── TurnNotFound            no turn with that id is known to the result store
    └── NotPending              approve/deny named a call that is not waiting for approval

A tool call that fails is *not* an exception: it becomes a ``ToolResult`` with ``status="error"``
and one of the codes in :class:`toolfleet.models.ErrorCode`. Exceptions are for the caller's mistakes
and for a broken environment. Errors of Celery, redis-py and jsonschema are translated at the
boundary (``raise ... from exc``) and never reach the caller untranslated.
"""

from __future__ import annotations

import re


class ToolfleetError(Exception):
    """Root of every exception toolfleet raises."""


class ConfigurationError(ToolfleetError):
    """Raised when a tool or a setting is declared wrongly, at registration time."""


class BatchRejected(ToolfleetError):
    """Raised when a batch cannot be run at all; nothing was submitted.

    ``reason`` is a short machine-readable word (``duplicate_call_id``, ``unreadable_payload``),
    ``call_ids`` the ids involved, if any, and ``pointer`` where in the payload the problem is (a
    JSON pointer, RFC 6901, e.g. ``/choices/0/message/tool_calls/2/id``; for a stream the first
    token is the event's position), or ``""`` when it is not at one place.
    """

    def __init__(self, message: str, *, reason: str, call_ids: tuple[str, ...] = (), pointer: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.call_ids = call_ids
        self.pointer = pointer


class BrokerUnavailable(ToolfleetError):
    """Raised when Redis (or the Celery broker) does not answer at ``url``; the message names the
    URL (password masked) and says how to start one. When raised by a submit, nothing of the batch
    runs: calls already sent are never armed (see :mod:`toolfleet.ledger`)."""

    def __init__(self, url: str, detail: str = "") -> None:
        self.url = shown_url(url)
        if self.url.startswith(("redis", "unix")):
            what, start = "Redis", ("Start one with `toolfleet up` (local stack), `redis-server --port "
                                    f"{_port_of(self.url)}`, or point REDIS_URL at a running Redis.")
        else:
            what, start = "The broker", "Start it, or point TOOLFLEET_BROKER_URL at a running broker."
        message = f"{what} is not answering at {self.url}" + (f" ({detail})" if detail else "") + ". " + start
        super().__init__(message)


# user:password@ after a scheme's // (the password up to the last @ before white space or ";", so
# one holding "/", "?", "#" or "@" is masked whole), or at the start of a URL without a scheme
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://|^\s*)([^\s;:/@]*):([^\s;]*)@")
_QUERY_PARAM = re.compile(r"([?&])([^=&#\s;]+)=([^&#\s;]*)")  # name=value in a query string


def shown_url(url: str) -> str:
    """``url`` with its password masked: kombu's ``maybe_sanitize_url``, then every ``user:password@``
    left (kombu raises ``ValueError`` for a port that is no number or a list of hosts, returns a URL
    without a scheme as it was, and masks only the first of a failover list ``a;b``) masked here,
    the user kept, and a secret-named query parameter (``?password=``) left in it. Never raises."""
    from kombu.utils.url import maybe_sanitize_url

    from .tools.secret_shapes import is_secret_name

    try:
        shown = maybe_sanitize_url(url)
    except ValueError:
        shown = url
    shown = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:**@", shown)
    # redis-py takes the password as a query parameter too (?password=): kept by the URLs kombu cannot parse
    return _QUERY_PARAM.sub(lambda m: f"{m[1]}{m[2]}=**" if is_secret_name(m[2]) else m[0], shown)


def shown_url_with_query(url: str) -> str:
    """:func:`shown_url` (which drops the query) with ``url``'s query parameters after it, those
    named like a secret (``password=``, ``token=``...) masked: what an error about a URL's options
    (``ssl_cert_reqs=``) shows. Never raises."""
    from urllib.parse import parse_qsl, urlsplit

    from .tools.secret_shapes import is_secret_name

    try:
        query = parse_qsl(urlsplit(url).query, keep_blank_values=True)
    except ValueError:
        query = []
    shown = shown_url(url).split("?", 1)[0]
    return shown + ("?" + "&".join(f"{k}={'**' if is_secret_name(k) else v}" for k, v in query) if query else "")


def _port_of(url: str) -> int:
    """The TCP port of a Redis URL (6379 when it names none, or is not TCP)."""
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).port or 6379
    except ValueError:
        return 6379


class BrokerBusy(BrokerUnavailable):
    """Raised when Redis answers but refuses writes for a while, past the caller's retry budget:
    out of memory at ``maxmemory`` (``OOM``), a read-only replica after a failover
    (``READONLY``), a cluster without a master for a slot, a script holding the server, a failed
    snapshot (``MISCONF``). The message names the URL (password masked), Redis's reply and what
    usually ends it (:func:`toolfleet.redis_client.busy`)."""

    def __init__(self, url: str, detail: str = "") -> None:
        ToolfleetError.__init__(
            self, f"Redis at {shown_url(url)} answers but refuses writes for now ({detail}). Give it "
            "memory (maxmemory, with the policy noeviction: docs/deploying.md), point the URL at the current "
            "master, or wait for the cluster to elect one."
        )
        self.url = shown_url(url)


class BrokerRefused(BrokerUnavailable):
    """Raised when Redis answers but refuses: a wrong user or password (``WRONGPASS``), or an ACL
    user without the right to a command, key or channel (``NOPERM``). The message names the URL
    (password masked), Redis's reason and where the rules of each role are (docs/deploying.md)."""

    def __init__(self, url: str, detail: str = "") -> None:
        ToolfleetError.__init__(
            self, f"Redis at {shown_url(url)} refused this process ({detail}). Check the user and "
            "password in the URL, and that the user has its role's ACL rules (docs/deploying.md)."
        )
        self.url = shown_url(url)


class TurnNotFound(ToolfleetError):
    """Raised when a turn id is not known to the result store (never submitted, or expired)."""


class TurnExists(ToolfleetError):
    """Raised by an exclusive open of a turn id (:meth:`~toolfleet.ledger.Ledger.open_turn`) that
    another process opened first: nothing of this open was written."""


class NotPending(ToolfleetError):
    """Raised by ``approve``/``deny`` when the call is not waiting for a decision.

    ``reason``: ``unknown`` (the policy did not ask about it), ``finished`` (it has its result),
    ``cancelled`` (its turn was cancelled) or ``decided`` (someone answered first).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ToolFailure(ToolfleetError):
    """Raised by a tool handler to fail its call with a specific error code.

    The worker turns it into the call's error result (it never escapes the worker):
    ``code`` (an :class:`~toolfleet.models.ErrorCode` value, default ``EXECUTION_ERROR``),
    ``message`` (what went wrong), ``hint`` (how to fix it) and ``output`` (partial output kept,
    for example what a command printed before it was stopped).
    """

    code = "EXECUTION_ERROR"

    def __init__(self, message: str, hint: str = "", *, code: str | None = None, output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.output = output
        if code is not None:
            self.code = code


class StaleFence(ToolFailure):
    """Raised by :meth:`ToolContext.check_fence` when this execution no longer holds its call (its
    fencing token is stale: a newer execution claimed it, the caller already has its answer, the
    turn was cancelled, or its deadline passed). The step that was about to happen must not
    happen; the execution's outcome is refused and kept only as a late note for the operator."""

    code = "OUTCOME_UNKNOWN"


class PermissionDenied(ToolFailure):
    """Raised when policy refuses a call (a path outside the workspace, a command not allowed)."""

    code = "PERMISSION_DENIED"


class ToolTimeout(ToolFailure):
    """Raised by a handler that stopped its own work at the call's deadline."""

    code = "TIMEOUT"


class CallCancelled(BaseException):
    """Raised inside a handler when its turn is cancelled and the grace period is over.

    A ``BaseException`` on purpose (like dramatiq's time-limit interrupt): a handler's
    ``except Exception`` must not swallow it. ``output`` carries what the handler produced so far.
    """

    def __init__(self, message: str = "the turn was cancelled", output: str = "") -> None:
        super().__init__(message)
        self.output = output
