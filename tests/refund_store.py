"""A small domain store for the refund demo: a SQLite file in the turn's workspace.

``refunds`` holds one row per refund *paid* (a real payment API does not deduplicate: paying twice
pays twice), each with the idempotency key it was paid under, so a probe can look it up.
``handler_runs`` holds one row per time the refund handler was entered, so tests can count
executions; ``notes`` is written by a plain (neither idempotent nor journaled) write tool.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

DB_NAME = "bank.sqlite"


def connect(workspace: Path | str) -> sqlite3.Connection:
    db = sqlite3.connect(Path(workspace) / DB_NAME, timeout=30, isolation_level=None)
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS refunds (id INTEGER PRIMARY KEY, key TEXT, order_id TEXT, amount_cents INTEGER);
        CREATE TABLE IF NOT EXISTS handler_runs (id INTEGER PRIMARY KEY, key TEXT, pid INTEGER);
        CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT);
        """
    )
    return db


def record_run(workspace: Path | str, key: str, pid: int) -> None:
    with connect(workspace) as db:
        db.execute("INSERT INTO handler_runs (key, pid) VALUES (?, ?)", (key, pid))


def pay(workspace: Path | str, key: str, order_id: str, amount_cents: int) -> int:
    with connect(workspace) as db:
        return int(db.execute(
            "INSERT INTO refunds (key, order_id, amount_cents) VALUES (?, ?, ?)", (key, order_id, amount_cents)
        ).lastrowid)


def find(workspace: Path | str, key: str) -> tuple[int, int] | None:
    """(refund id, amount) of the refund paid under ``key``, if any."""
    with connect(workspace) as db:
        row = db.execute("SELECT id, amount_cents FROM refunds WHERE key = ? ORDER BY id LIMIT 1", (key,)).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def counts(workspace: Path | str) -> dict[str, dict[str, int]]:
    """``{"refunds": {key: n}, "runs": {key: n}}``."""
    with connect(workspace) as db:
        refunds = dict(db.execute("SELECT key, COUNT(*) FROM refunds GROUP BY key").fetchall())
        runs = dict(db.execute("SELECT key, COUNT(*) FROM handler_runs GROUP BY key").fetchall())
    return {"refunds": refunds, "runs": runs}


def add_note(workspace: Path | str, text: str) -> None:
    with connect(workspace) as db:
        db.execute("INSERT INTO notes (text) VALUES (?)", (text,))


def notes(workspace: Path | str) -> list[str]:
    with connect(workspace) as db:
        return [r[0] for r in db.execute("SELECT text FROM notes ORDER BY id")]
