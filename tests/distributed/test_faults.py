"""``potluck.testing.Faults`` on real processes: a kill, a freeze for a while, a slow rank.

The failed collective on a real elastic cohort is in test_elastic.py.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from potluck.testing import Faults, run_ranks

STEPS = 4


def _loop(rank: int, world_size: int, faults: Faults) -> dict[str, Any]:
    inject = faults.injector(rank)
    took = []
    for step in range(STEPS):
        started = time.monotonic()
        inject(step)
        took.append(time.monotonic() - started)
    try:
        os.waitpid(-1, os.WNOHANG)
        children = True
    except ChildProcessError:  # the freeze's waker was reaped
        children = False
    return {"took": took, "children": children}


@pytest.mark.timeout(60)
def test_a_kill_a_freeze_and_a_slow_rank_on_real_processes() -> None:
    faults = Faults().kill(0, 2).freeze(1, 1, seconds=1.0).slow(2, 0.2)
    assert faults.may_die == {0}
    killed, frozen, slow = run_ranks(_loop, 3, faults, init_group=False,
                                     may_die=faults.may_die, timeout=50)
    assert killed is None  # SIGKILLed at step 2: no report
    assert frozen["took"][1] >= 1.0 and max(frozen["took"][2:]) < 0.5  # stopped, then on
    assert not frozen["children"]
    assert all(0.2 <= took < 1.0 for took in slow["took"])
