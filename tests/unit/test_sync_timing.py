"""SyncTimer wraps a communication hook; round trips need a group of two or more."""

from __future__ import annotations

from typing import Any

import torch

from potluck.metrics.latency import measure_round_trips
from potluck.metrics.sync_timer import SyncTimer
from potluck.reducer.hooks import Bucket


def _done_hook(state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(bucket.buffer * 2)
    return future


def test_sync_timer_passes_results_through_and_times_one_pass() -> None:
    timer = SyncTimer(_done_hook)
    bucket = Bucket(0, torch.ones(3), (), group=None)
    assert torch.equal(timer(None, bucket).wait(), torch.full((3,), 2.0))
    assert timer(None, bucket).wait().sum().item() == 6.0
    assert timer.take() >= 0.0
    assert timer.take() == 0.0  # the next pass starts empty


def test_round_trips_without_a_group_measure_nothing() -> None:
    trips = measure_round_trips(None, numel=10)
    assert trips.barrier_s == [] and trips.allreduce_s == []
    assert trips.allreduce_bytes == 40
