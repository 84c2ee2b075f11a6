"""Whole outputs of calls whose result was cut, kept in Redis, and the ``read_output`` tool.

When a result is over its tool's budget, the model reads head and tail
(:func:`toolfleet.tools.output.fit_output`) and a reference such as ``out_3f2a9c1b7d4e5f60``; the whole
text is stored under ``<ns>:output:<ref>`` as a list of 64 KiB-character chunks (so a page is read
without moving the rest) with a time to live (``Settings.output_ttl_s``). ``read_output(ref,
offset, limit)`` pages through it by character offsets.

An output is read only where it was made: the workspace (its real path on the worker) and the
session id of the call that stored it are kept with it, and ``read_output`` from another workspace
or session is refused as if the reference did not exist. A reference is not a bearer token across
tenants: one quoted in a shared document or a log does not give a turn of another workspace the
text of this workspace's files and commands (the file tools are confined beneath the turn's own
workspace; this keeps stored outputs to it too).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Annotated

import redis
from pydantic import Field

from ..errors import ToolFailure
from ..keys import Keys
from .context import ToolContext
from .spec import tool

CHUNK_CHARS = 65_536
READ_LIMIT_MAX = 20_000
READ_LIMIT_DEFAULT = 10_000


class OutputStore:
    """Saves and pages whole outputs in one namespace."""

    def __init__(self, client: redis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_s = ttl_s

    def save(self, text: str, *, turn_id: str = "", call_id: str = "", tool: str = "",
             workspace: str | Path | None = None, session_id: str | None = None) -> str:
        """Store ``text`` and return its reference, readable from ``workspace`` and ``session_id``
        only. Raises ``redis.RedisError`` if Redis refuses (the caller falls back to an output
        without a reference)."""
        ref = f"out_{secrets.token_hex(8)}"
        key = self.keys.output(ref)
        meta = json.dumps({"chars": len(text), "turn_id": turn_id, "call_id": call_id, "tool": tool,
                           "scope": scope(workspace, session_id)})
        pipe = self.redis.pipeline(transaction=True)
        pipe.rpush(key, meta, *[text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)])
        pipe.expire(key, self.ttl_s)
        pipe.execute()
        return ref

    def read(self, ref: str, offset: int, limit: int, *, workspace: str | Path | None = None,
             session_id: str | None = None) -> tuple[str, int] | None:
        """``(text[offset:offset + limit], total characters)``, or ``None`` for an unknown or expired
        reference, or one stored from another workspace or session."""
        key = self.keys.output(ref)
        meta = self.redis.lindex(key, 0)
        if meta is None:
            return None
        info = json.loads(meta)
        if "scope" in info and info["scope"] != scope(workspace, session_id):  # (stored before scopes: any)
            return None
        total = int(info["chars"])
        if offset >= total or limit <= 0:
            return "", total
        first, last = offset // CHUNK_CHARS, (min(offset + limit, total) - 1) // CHUNK_CHARS
        chunks = self.redis.lrange(key, first + 1, last + 1)
        text = "".join(c.decode("utf-8") for c in chunks)
        start = offset - first * CHUNK_CHARS
        return text[start : start + limit], total


def scope(workspace: str | Path | None, session_id: str | None) -> list[str | None]:
    """Where a stored output may be read: the workspace's real path (two spellings of one directory
    are one scope) and the session id."""
    where = None
    if workspace is not None and str(workspace):
        try:
            where = os.path.realpath(workspace)
        except (OSError, ValueError):
            where = str(workspace)
    return [where, session_id or None]


@tool(
    access="read",
    resources=lambda a: [f"output:{a.get('ref', '')}"],
    timeout_s=30,
    max_output_chars=READ_LIMIT_MAX + 500,
)
def read_output(
    ctx: ToolContext,
    ref: str,
    offset: Annotated[int, Field(ge=0)] = 0,
    limit: Annotated[int, Field(ge=1, le=READ_LIMIT_MAX)] = READ_LIMIT_DEFAULT,
) -> str:
    """Read part of a long tool output that was cut in its result, by the reference the result gave.

    Args:
        ref: The reference from the cut result, e.g. "out_3f2a9c1b7d4e5f60".
        offset: First character to return, counting from 0.
        limit: Largest number of characters to return.
    """
    store: OutputStore | None = getattr(ctx, "output_store", None)
    if store is None:
        raise ToolFailure("stored outputs are not available here", "run this tool on a toolfleet worker")
    found = store.read(ref, offset, limit, workspace=ctx.workspace, session_id=ctx.session_id)
    if found is None:
        raise ToolFailure(
            f"no stored output {ref!r} here: it never existed, it expired, or another workspace or session "
            "made it (an output is read only from the workspace and session of the call that made it)",
            f"stored outputs are kept {store.ttl_s // 3600} h; run the call again, with a narrower command",
        )
    text, total = found
    end = offset + len(text)
    if not text:
        return f"[no characters at offset {offset}: the output has {total} characters]"
    more = f"; read on with offset={end}" if end < total else "; this is the end"
    return f"{text}\n[characters {offset}-{end} of {total}{more}]"
