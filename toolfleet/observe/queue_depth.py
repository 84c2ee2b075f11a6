"""``toolfleet_queue_depth{queue}``: messages waiting in each tool queue a worker serves, read from
the Redis broker when Prometheus scrapes (kombu keeps a queue's priority levels in separate lists:
the queue's name, then the name + ``\\x06\\x16`` + 3, 6, 9; the depth is their sum)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
SCRAPE_TIMEOUT_S = 2.0


class QueueDepthCollector:
    def __init__(self, runtime: Any) -> None:
        self.queues = [runtime.keys.queue(q) for q in runtime.registry.queues()]
        self.client = redis.Redis.from_url(runtime.settings.broker, socket_timeout=SCRAPE_TIMEOUT_S,
                                           socket_connect_timeout=SCRAPE_TIMEOUT_S)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("toolfleet_queue_depth", "Messages waiting in a tool queue", labels=["queue"])
        try:
            pipe = self.client.pipeline(transaction=False)
            for queue in self.queues:
                for step in PRIORITY_STEPS:
                    pipe.llen(queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}")
            lengths = pipe.execute()
        except redis.RedisError:
            return  # broker away: no sample rather than a wrong one (Prometheus shows the gap)
        n = len(PRIORITY_STEPS)
        for i, queue in enumerate(self.queues):
            family.add_metric([queue], float(sum(lengths[i * n:(i + 1) * n])))
        yield family
