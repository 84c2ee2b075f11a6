"""The pool process's cancel listener (toolfleet/worker/cancel_watch.py): one pub/sub connection
for the turn's cancel channels and the breakers' failure notices. A cancel must reach a running
call whatever else that connection meets: a cancel published while the subscriptions are being
confirmed, or a Redis ACL that predates the notices channel (guarantee 9: a cancel is final
within a second)."""

from __future__ import annotations

import uuid

import pytest

from toolfleet.keys import Keys
from toolfleet.tools.context import ToolContext
from toolfleet.worker.cancel_watch import CancelWatcher

WAIT_S = 5.0  # a cancel reaches the call well within this on a healthy Redis


class _ScriptedPubSub:
    """Replays pub/sub messages in the order Redis may send them."""

    def __init__(self, messages: list[dict]) -> None:
        self.messages = list(messages)

    def get_message(self, timeout: float = 0.0) -> dict | None:
        return self.messages.pop(0) if self.messages else None


def test_a_cancel_published_between_the_subscribe_confirmations_is_not_dropped(settings):
    keys = Keys(settings.namespace)
    watcher = CancelWatcher(keys, lambda: pytest.fail("no connection wanted"), grace_s=0.5)
    watcher._pid = None
    ctx = ToolContext(call_id="c1", turn_id="T1", tool_name="noop")
    watcher._running["T1"] = {id(ctx)}
    watcher._contexts[id(ctx)] = ctx
    pubsub = _ScriptedPubSub([
        {"type": "psubscribe", "channel": keys.cancel_pattern.encode(), "data": 1},
        {"type": "pmessage", "pattern": keys.cancel_pattern.encode(),
         "channel": keys.cancel_channel("T1").encode(), "data": b"the user stopped it"},
        {"type": "subscribe", "channel": keys.breaker_failed_channel.encode(), "data": 2},
    ])
    watcher._handshake(pubsub, notices=True, wait_s=1.0)
    assert ctx.cancelled.is_set() and ctx.cancel_reason == "the user stopped it"
    assert pubsub.messages == []  # and the handshake ended on the second confirmation


def test_a_worker_whose_acl_predates_the_notices_channel_still_hears_cancels(private_redis):
    """A worker user whose ACL lacks ``&<ns>:breaker-failed`` (docs/deploying.md before it was
    added): Redis refuses that subscription; the listener keeps the cancels."""
    import redis

    server = private_redis(persistent=False)
    namespace = f"acl-{uuid.uuid4().hex[:8]}"
    keys = Keys(namespace)
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "oldworker", "on", ">pw", "resetchannels",
                          f"&{keys.cancel_pattern}", "~*", "+@all")
    watcher = CancelWatcher(keys, lambda: redis.Redis(host="127.0.0.1", port=server.port, username="oldworker",
                                                      password="pw"), grace_s=0.5)
    ctx = ToolContext(call_id="c1", turn_id="T1", tool_name="noop")
    with watcher.track(ctx):
        channel = keys.cancel_channel("T1")
        for _ in range(int(WAIT_S / 0.1)):  # published until heard: the listener may be reconnecting
            admin.publish(channel, "stopped")
            if ctx.cancelled.wait(0.1):
                break
        assert ctx.cancelled.is_set(), "the cancel never reached the running call"
    assert watcher.failures.failed_since("noop", 0.0)  # deaf to notices: every success resets
