"""The churn bench's pure parts (``potluck_lab.bench.churn_figures``): the seeded
schedule, losses from the workers' failed and committed steps, the percentile."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest

from potluck_lab.bench.churn_figures import (
    JOIN,
    KILL,
    Loss,
    churn_schedule,
    from_kills,
    losses,
    percentile,
    pool_nodes,
    pool_size,
    stop_epoch,
)

pytestmark = pytest.mark.timeout(10)


def test_the_schedule_churns_a_pool_of_about_30_percent_every_few_seconds() -> None:
    events = churn_schedule(7, 32, 600.0)
    assert events == churn_schedule(7, 32, 600.0)  # seeded
    assert pool_size(32, 0.3) == 10 and pool_size(4, 0.3) == 1
    assert {e.slot for e in events} == set(range(10))
    gaps = [b.at - a.at for a, b in pairwise(events)]
    assert all(2.0 <= g <= 6.0 for g in gaps) and events[-1].at < 600.0
    up = [True] * 10  # a slot is killed only when up, joins only when down
    for event in events:
        assert up[event.slot] == (event.kind == KILL)
        up[event.slot] = event.kind == JOIN
    assert len(pool_nodes(7, 32)) == 10 and set(pool_nodes(7, 32)) <= set(range(32))


def test_failures_before_the_recovery_are_one_loss() -> None:
    found = losses([10.0, 10.2, 10.1, 20.0, 30.0], [9.0, 11.0, 12.0, 21.5])
    assert found[:2] == [Loss(10.0, 11.0), Loss(20.0, 21.5)]
    assert math.isnan(found[2].recovered)  # never recovered
    assert [round(loss.seconds, 2) for loss in found[:2]] == [1.0, 1.5]
    # each kill to the recovery of the first loss after it, before the next kill
    assert from_kills([9.5, 19.0, 25.0], found) == [1.5, 2.5]


def test_percentile_is_nearest_rank_and_nan_for_nothing() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 50) == 10.0 and percentile(values, 95) == 19.0
    assert percentile([3.0], 95) == 3.0 and math.isnan(percentile([], 50))


def test_the_stop_is_an_epochs_end_two_epochs_ahead() -> None:
    assert stop_epoch(0, 10) == 3 and stop_epoch(25, 10) == 5
