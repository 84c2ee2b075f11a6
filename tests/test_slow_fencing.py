"""Issue 19's table, repeated (marked ``slow``; ``pytest -m slow -s tests/test_slow_fencing.py``
prints the counts): each case 10 times with a freeze shorter than the liveness window and the
time limit (0.4 s) and 10 times with one longer than the liveness bound, the time limit and the
hard limit plus the clock-skew margin (3.5 s). Two workers, one process each, SIGSTOP/SIGCONT of
a worker's whole process group (main and pool). What each trial checks: tests/fencing_trials.py."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from . import fencing_trials as trials

pytestmark = pytest.mark.slow
TRIALS = 10


@pytest.fixture
def settings(settings):
    return trials.fencing_settings(settings)


@pytest.mark.parametrize("case", list(trials.CASES))
def test_freeze_and_resume_10_times_each_side_of_the_window(dispatcher, start_worker, workspace, settings, case):
    fleet = trials.Fleet(dispatcher, [start_worker(concurrency=1), start_worker(concurrency=1)], workspace, settings,
                         Counter())
    rng = random.Random(hash(case) & 0xFFFF)
    began = time.monotonic()
    for freeze_s in (trials.SHORT_FREEZE_S, trials.LONG_FREEZE_S):
        for rep in range(TRIALS):
            trials.run_trial(case, fleet, rep, freeze_s, rng)
    print(f"\n{case}: {TRIALS} trials at each freeze ({time.monotonic() - began:.0f} s)", end="")
    trials.report(fleet.tally)
