"""Measure sync latency inside the ranks: barrier and all-reduce round trips.

Every rank of ``group`` must call ``measure_round_trips`` at the same point with the
same arguments. The barrier round trip is the floor any synchronized step pays; the
all-reduce of a gradient-sized buffer is what one unbucketed, unoverlapped gradient
sync would cost. Returns raw samples in seconds; ``figures.summarize_latency`` turns
them into medians.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from potluck.collectives import Group


@dataclass(frozen=True)
class RoundTrips:
    """Raw round-trip samples (seconds) and the all-reduce payload in bytes."""

    barrier_s: list[float]
    allreduce_s: list[float]
    allreduce_bytes: int


def measure_round_trips(group: Group | None, numel: int, repeats: int = 20) -> RoundTrips:
    """Time ``repeats`` barriers and all-reduces of ``numel`` float32s (after one warm-up).

    With no group or a group of one there is nothing to measure: the lists are empty.
    """
    nbytes = numel * 4
    if group is None or int(group.size()) < 2 or repeats < 1:
        return RoundTrips([], [], nbytes)
    buffer = torch.zeros(numel, dtype=torch.float32)
    group.barrier().wait()
    barrier_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        group.barrier().wait()
        barrier_s.append(time.perf_counter() - start)
    group.allreduce([buffer]).wait()
    allreduce_s = []
    for _ in range(repeats):
        group.barrier().wait()  # start together, so one rank's lag is not counted
        start = time.perf_counter()
        group.allreduce([buffer]).wait()
        allreduce_s.append(time.perf_counter() - start)
    return RoundTrips(barrier_s, allreduce_s, nbytes)
