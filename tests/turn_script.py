"""Run one turn from a separate process (the tests of locks across turns start two of these).

Usage: python -m tests.turn_script SETTINGS_JSON WORKSPACE CALLS_JSON [GO_KEY]

Waits for an item on the Redis list GO_KEY (so several processes start together), submits the
calls, prints ``started <turn id>`` as soon as the turn is submitted, then one JSON line:
``{"turn_id", "submitted_at", "first_result_at", "last_result_at", "results": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

from toolfleet import Dispatcher, Settings, ToolCall

from .conftest import make_registry


def main() -> None:
    # the JSON dump masks the fleet key (a SecretStr): the key comes from the environment, as the
    # test run's processes all get it (conftest.FLEET_KEY)
    data = json.loads(sys.argv[1])
    data["fleet_key"], data["fleet_keys_previous"] = os.environ.get("TOOLFLEET_FLEET_KEY"), ()
    settings = Settings.model_validate(data)
    workspace, calls = sys.argv[2], [ToolCall(**c) for c in json.loads(sys.argv[3])]
    with Dispatcher(settings, make_registry()) as dispatcher:
        if len(sys.argv) > 4:
            dispatcher.ledger.redis.blpop([sys.argv[4]], timeout=60)
        submitted_at = time.time()
        turn = dispatcher.submit(calls, workspace=workspace)
        print(f"started {turn.turn_id}", flush=True)
        seen = [time.time() for _ in turn.as_completed(timeout_s=300)]
        results = turn.results()
    print(json.dumps({"turn_id": turn.turn_id, "submitted_at": submitted_at, "first_result_at": min(seen),
                      "last_result_at": max(seen), "results": [r.model_dump(mode="json") for r in results]}))


if __name__ == "__main__":
    main()
