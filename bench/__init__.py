"""The toolfleet benchmark suite (issue 5): overhead against raw Celery and the critical path.

Run it with ``make bench`` (or ``python -m bench``; ``--quick`` for small sizes, ``--only`` for a
subset, ``--render`` to re-render from the last results); it writes ``bench/results/report.md``,
``bench/results/bench.png`` and ``bench/results/results.json``. Not part of the test suite (a smoke
run of it is: ``tests/test_bench_smoke.py``).

Modules, one role each:

- :mod:`bench.stack`: a private Redis, toolfleet workers and raw Celery workers, each in its own
  namespace, started as processes and joined on their ready signal; :mod:`bench.cluster`: a local
  three-master Redis Cluster (the tests' too); :mod:`bench.redis_stats`: a Redis's counters
  (CPU, commands, ``INFO commandstats``) and the MONITOR split into client and script-inner commands.
- :mod:`bench.tools` (toolfleet tools) and :mod:`bench.raw_celery` (the raw Celery app): the
  synthetic handlers, the same bodies on both sides.
- :mod:`bench.plan_efficiency`, :mod:`bench.overhead`, :mod:`bench.throughput`,
  :mod:`bench.cancel_latency`, :mod:`bench.streaming`, :mod:`bench.scale`: one measurement each.
- :mod:`bench.report` (with its sections in :mod:`bench.report_summary`, :mod:`bench.report_sections`,
  :mod:`bench.report_redis` and helpers in :mod:`bench.report_util`) and :mod:`bench.plot`: the
  markdown report and the PNG; ``bench/fixes.md``, written by hand, is the report's last section.
- :mod:`bench.run`: the run itself; :mod:`bench.profile`: a py-spy profile of a worker under load.
"""
