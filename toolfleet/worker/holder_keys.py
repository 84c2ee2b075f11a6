"""The live session holder key's conditional renew and delete (Lua, so only the holder named in the
key changes it) and the ``SESSION_LOST`` reply a session host or a rescuer gives (:mod:`.affinity`,
:mod:`.live_rescue`)."""

from __future__ import annotations

from typing import Any

import redis


def lost_reply(worker: str, closed: bool = False, lapsed: bool = False, ran: bool = False) -> dict[str, Any]:
    why = ("the session was closed" if closed else
           f"its worker {worker} lost its liveness (frozen or cut off from Redis past its lease), which ended the "
           "shell" if lapsed else f"its worker {worker} stopped or died")
    run = ("this call's command was running and was stopped with it: it may have acted in part" if ran
           else "this call did not run")
    return {"code": "SESSION_LOST",
            "message": f"the live session's shell is gone: {why} (its cwd, environment and processes are lost); {run}",
            "hint": "call again to start a new shell in this session (it starts in the workspace root with a fresh "
                    "environment), and redo the set-up it needs"}


_RENEW_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_DELETE_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def _delete_if(client: redis.Redis, key: str, value: str) -> None:
    client.eval(_DELETE_IF, 1, key, value)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")
