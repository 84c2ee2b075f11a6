"""The asyncio API, offline: a model response's tool calls run on the fleet, results streamed with
``async for``, and a second turn cancelled by cancelling the task that awaits it.

    toolfleet up -d --workers 2 --no-flower      # a local Redis and workers (or set REDIS_URL)
    python examples/asyncio_turn.py
    toolfleet down
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path

from toolfleet import Settings
from toolfleet.aio import AsyncDispatcher
from toolfleet.stack import running_redis_url, with_local_fleet_key

HERE = Path(__file__).resolve().parent

# What a Chat Completions response with three tool calls looks like (recorded, so no network).
RESPONSE = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "README.md"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "src"}'}},
    {"id": "call_3", "type": "function", "function": {"name": "write_file",
                                                      "arguments": '{"path": "notes/todo.md", "content": "ship"}'}},
]}}]}
SLOW = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_9", "type": "function", "function": {"name": "run_command",
                                                      "arguments": json.dumps({"command": "sleep 30"})}},
]}}]}


async def main() -> None:
    redis_url = None if os.environ.get("REDIS_URL") else running_redis_url()
    settings = Settings.from_env(with_local_fleet_key(), redis_url=redis_url)
    workspace = Path(tempfile.mkdtemp()) / "workspace"
    shutil.copytree(HERE / "cases" / "workspace", workspace)
    async with AsyncDispatcher(settings) as fleet:
        turn = await fleet.submit_response(RESPONSE, workspace=str(workspace))
        async for result in turn.as_completed(timeout_s=60):       # as each call finishes
            print(f"finished {result.call_id} {result.name}: {result.status}")
        for message in await turn.messages(timeout_s=60):          # model order, for the next request
            print(f"  -> {message['tool_call_id']}: {message['content'][:60]!r}")

        slow = await fleet.submit_response(SLOW, workspace=str(workspace))
        waiting = asyncio.create_task(slow.results())
        await asyncio.wait([waiting], timeout=1.0)
        waiting.cancel()                                           # cancelling the task cancels the turn
        try:
            await waiting
        except asyncio.CancelledError:
            pass
        result = (await slow.results(timeout_s=60))[0]
        print(f"after the cancel: {result.call_id} {result.error.code.value if result.error else result.status}")


if __name__ == "__main__":
    asyncio.run(main())
