"""Every Redis key and queue name toolfleet uses, in one place.

All live under the settings' ``namespace`` (default ``toolfleet-<user>``, toolfleet/defaults.py). Keys one Lua script or
transaction touches together share a Redis Cluster hash tag (the part in ``{}``), so the ledger
can live on a cluster (docs/scaling.md): every key of a turn carries ``{<turn_id>}``, a session's
keys ``{<session_id>}``, the locks and their holds ``{locks}``.
"""

from __future__ import annotations

# the fields of Keys.turn_runs, by fact: fencing record, start record, attempts, re-sent at, decided
FENCE, STARTED, ATTEMPTS, SENT_AFTER, DECIDED = "f:", "s:", "n:", "x:", "d:"


def run_field(fact: str, call_id: str) -> str:
    """The field of ``call_id``'s ``fact`` (:data:`FENCE`, :data:`STARTED`, :data:`ATTEMPTS`,
    :data:`SENT_AFTER`, :data:`DECIDED`) in :meth:`Keys.turn_runs`."""
    return fact + call_id


def hash_tag_problem(what: str, value: str) -> str | None:
    """Why ``value`` (a turn or session id, ``what`` names it) cannot be a hash tag, or None: one
    that starts with ``}`` makes the tag ``{}`` empty, so each of its keys would hash to a slot of
    its own on a cluster and every script over them fail (``CROSSSLOT``); refused on any Redis, so
    an id that works in development works on the production cluster."""
    if value.startswith("}"):
        return (f"{what} {value!r} cannot start with '}}': its keys would not share one Redis Cluster slot, and "
                "the scripts over them would fail there; choose another id")
    return None


class Keys:
    """Key builder for one namespace."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace

    # --- per turn (the ledger) ---
    def turn_calls(self, turn_id: str) -> str:
        """Hash call_id -> tool name: the calls of the turn (set at submit)."""
        return f"{self.ns}:turn:{{{turn_id}}}:calls"

    def turn_results(self, turn_id: str) -> str:
        """Hash call_id -> ToolResult JSON: the first (and only) result recorded per call."""
        return f"{self.ns}:turn:{{{turn_id}}}:results"

    def turn_armed(self, turn_id: str) -> str:
        """String: set once the dispatcher sent every call of the turn's first group; a worker
        runs no call of a turn that is not armed (so a half-submitted turn never runs)."""
        return f"{self.ns}:turn:{{{turn_id}}}:armed"

    def turn_cancelled(self, turn_id: str) -> str:
        """String: set when the turn is cancelled (value: reason)."""
        return f"{self.ns}:turn:{{{turn_id}}}:cancelled"

    def turn_ended(self, turn_id: str) -> str:
        """String: set when the turn is over (all results in, cancelled, given up, abandoned): a
        worker's claim refuses its calls from then on (value: why)."""
        return f"{self.ns}:turn:{{{turn_id}}}:ended"

    def turn_lease(self, turn_id: str) -> str:
        """String with a TTL of ``turn_lease_s`` (Redis's clock), renewed by the turn's live
        dispatcher: once it lapses (the dispatcher vanished) a worker's claim refuses the turn's calls."""
        return f"{self.ns}:turn:{{{turn_id}}}:lease"

    def turn_events(self, turn_id: str) -> str:
        """Stream of the turn's events (started, result, cancel), read by the dispatcher."""
        return f"{self.ns}:turn:{{{turn_id}}}:events"

    def turn_audit(self, turn_id: str) -> str:
        """Stream: the turn's audit trail (planned, submitted, started, finished, approved, denied,
        cancelled), redacted; written by every side, never read by the turn's driver."""
        return f"{self.ns}:turn:{{{turn_id}}}:audit"

    def turn_pending(self, turn_id: str) -> str:
        """Hash call_id -> JSON (tool, arguments redacted, reason, workspace): calls held for approval."""
        return f"{self.ns}:turn:{{{turn_id}}}:pending"

    def turn_decisions(self, turn_id: str) -> str:
        """Hash call_id -> JSON (decision approved|denied, by, reason, at): the first decision wins."""
        return f"{self.ns}:turn:{{{turn_id}}}:decisions"

    def turn_runs(self, turn_id: str) -> str:
        """Hash of each call's executions, one field per fact (prefix + call_id, so one read or
        write of a claim touches one key; :func:`run_field`):

        - ``f:<call_id>`` -> "token deadline_ms pid sent_at [dead]": the fencing token of the
          execution that holds the call (its latest claim), its deadline on the Redis clock, its
          process id and when its message was sent;
        - ``s:<call_id>`` -> JSON {worker, pid, started_at}: set once a handler began the call;
        - ``n:<call_id>`` -> how many times a worker began the call (redeliveries count);
        - ``x:<call_id>`` -> unix s: the call was sent again then; older messages of it are superseded;
        - ``d:<call_id>`` -> ``1``: the call got a result no claim of it made (the dispatcher's own, a
          denial): a claim that finds it refuses the call (``done``) without reading the results
          hash, which it reads only for a call begun before or a turn whose ``runs`` Redis lost;
        - ``turn`` -> ``open``: written with the hash's time to live when the turn opens.
        """
        return f"{self.ns}:turn:{{{turn_id}}}:runs"

    def turn_late(self, turn_id: str) -> str:
        """Hash "call_id token" -> result JSON: outcomes a stale execution reported after the
        caller's answer (kept for the operator, never the call's result; ``toolfleet trace``)."""
        return f"{self.ns}:turn:{{{turn_id}}}:late"

    @property
    def fence_counter(self) -> str:
        """Counter of the namespace's fencing tokens (claims, journal leases, locks): INCR only."""
        return f"{self.ns}:fence"

    def cancel_channel(self, turn_id: str) -> str:
        """Pub/sub channel workers listen on to stop a turn's running calls."""
        return f"{self.ns}:cancel:{turn_id}"

    @property
    def cancel_pattern(self) -> str:
        return f"{self.ns}:cancel:*"

    @property
    def breaker_failed_channel(self) -> str:
        """Pub/sub channel: a tool's name each time its breaker counts a failure (pool processes
        listen, so a call that worked resets the count: toolfleet/worker/breaker_notices.py)."""
        return f"{self.ns}:breaker-failed"

    # --- policy ---
    @property
    def policy_rules(self) -> str:
        """Hash rule id -> JSON: remembered approval rules (no time to live)."""
        return f"{self.ns}:policy:rules"

    def session_loop(self, session_id: str) -> str:
        """Hash (sig, count, at): the last call signature of a session and how often it repeated."""
        return f"{self.ns}:session:{{{session_id}}}:loop"

    def output(self, ref: str) -> str:
        """String (with a time to live): the whole output of a call whose result was cut."""
        return f"{self.ns}:output:{ref}"

    # --- side effects ---
    def journal(self, tool: str, key: str) -> str:
        """Hash: the idempotency journal entry of one execution key of one tool."""
        return f"{self.ns}:journal:{tool}:{key}"

    def breaker(self, tool: str) -> str:
        """Hash: the circuit breaker of one tool (state, times); tagged by the tool, so it shares
        its slot with :meth:`breaker_failures`."""
        return f"{self.ns}:breaker:{{{tool}}}"

    def breaker_failures(self, tool: str) -> str:
        """String: the breaker's run of consecutive failures (absent: none). A string, not a field
        of :meth:`breaker`, so a worker's claim reads it in the same ``MGET`` as the turn's flags
        and its result resets it only when it is there (:mod:`toolfleet.breaker`)."""
        return f"{self.breaker(tool)}:failures"

    @property
    def locks(self) -> str:
        """Hash: resource locks across turns, field = workspace + newline + resource,
        value = owner turn id + space + lease end (ms, Redis clock). Tagged ``{locks}``: its
        ``:hold`` companion must share its cluster slot."""
        return f"{self.ns}:{{locks}}"

    # --- fleet ---
    def catalog(self, worker: str) -> str:
        """String (JSON, with a time to live): the tools one live worker serves."""
        return f"{self.ns}:catalog:{worker}"

    @property
    def catalog_pattern(self) -> str:
        return f"{self.ns}:catalog:*"

    @property
    def workers(self) -> str:
        """Set: names of workers that published a catalog (dead ones are dropped lazily)."""
        return f"{self.ns}:workers"

    @property
    def tools_seen(self) -> str:
        """Hash: tool name -> JSON ``{"tool": describe(), "worker", "at"}``, written by each worker
        as it starts, kept ``TOOLS_SEEN_TTL_S`` after the last (:mod:`toolfleet.worker.catalog`): a
        tool no live worker serves now is known, its calls ``TOOL_UNAVAILABLE``, not ``UNKNOWN_TOOL``."""
        return f"{self.ns}:tools:seen"

    @property
    def workers_ready(self) -> str:
        """List: a worker pushes its name here once it consumes (tests and `up` join on it)."""
        return f"{self.ns}:workers:ready"

    @property
    def security_dropped(self) -> str:
        """Hash reason -> count (and ``total``): call messages workers dropped because their
        signature did not verify (toolfleet/worker/authenticity.py)."""
        return f"{self.ns}:security:dropped"

    # --- live sessions (toolfleet/worker/affinity.py) ---
    def live_holder(self, session_id: str) -> str:
        """String (TTL: the idle TTL): the worker that holds the session's shell."""
        return f"{self.ns}:live:holder:{session_id}"

    @property
    def live_holders_pattern(self) -> str:
        """SCAN pattern of every ``live_holder`` key of the namespace (``toolfleet sessions`` lists
        the live shells with it)."""
        return f"{self.ns}:live:holder:*"

    def live_worker(self, worker: str) -> str:
        """String (TTL: two heartbeats): set while ``worker`` can hold live sessions."""
        return f"{self.ns}:live:worker:{worker}"

    @property
    def live_workers(self) -> str:
        """Set: workers that consume a queue of their own (``<ns>.w.<worker>``)."""
        return f"{self.ns}:live:workers"

    def queue(self, tool_queue: str) -> str:
        """Celery queue name of a tool's queue."""
        return f"{self.ns}.{tool_queue}"
