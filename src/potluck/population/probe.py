"""A member's link, measured through the job's store (``LinkProbe``).

The gradient all-reduce makes every member's step equal, so step times cannot say whose
link is slow. A probe can: the member writes a blob to the store and reads it back,
and the time per byte is its link's cost. The store is served by one host, so the
probe measures the path between that host and the member: a slow member link shows,
and a slow link of the store's host itself shows on every member alike (nobody stands
out then). Members probe at different steps (``SwapPart``): probes at once would queue
on the store host's link, and the later one would read that queue as its own link's
time. Only the probes' ratios enter the prediction (``population.swap``).
"""

from __future__ import annotations

import time
from typing import Protocol

from torch._C._distributed_c10d import Store

BLOB_BYTES = 64 * 1024


class LinkProbe(Protocol):
    def __call__(self) -> float:
        """Seconds per byte of this member's link (each way, averaged)."""
        ...


class StoreProbe:
    """Write ``size`` bytes under ``key`` and read them back, twice each, timing the
    second of each. The first uses up a shaped link's burst allowance (a token bucket,
    as ``tc tbf`` or a cloud network's): a probe that fits in the allowance passes at
    the wire's speed, not the link's, and equal links then read apart by 4x (seen in
    ``potluck bench plan --swap`` with one transfer each way). TCP has no compression,
    so a blob of one letter weighs what any other does."""

    def __init__(self, store: Store, key: str, size: int = BLOB_BYTES) -> None:
        self._store, self._key, self._blob = store, key, "x" * size

    def __call__(self) -> float:
        store, key = self._store, self._key
        store.set(key, self._blob)  # (the allowance on the way to the store's host)
        started = time.perf_counter()
        store.set(key, self._blob)
        up = time.perf_counter() - started
        store.get(key)  # (the allowance on the way back)
        started = time.perf_counter()
        store.get(key)
        down = time.perf_counter() - started
        return (up + down) / (2 * len(self._blob))
