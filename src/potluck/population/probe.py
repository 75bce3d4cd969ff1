"""A member's link, measured through the job's store (``LinkProbe``).

The gradient all-reduce makes every member's step equal, so step times cannot say whose
link is slow. A probe can: the member writes a blob to the store and reads it back,
and the time per byte is its link's cost. The store is served by one host, so the
probe measures the path between that host and the member: a slow member link shows,
and a slow link of the store's host itself shows on every member alike (nobody stands
out then). Probes of all members run at once, so each sees the others' traffic on the
store host's link; only their ratio is used (``population.swap``).
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
    """Write ``size`` bytes under ``key`` and read them back; TCP has no compression, so
    a blob of one letter weighs what any other does."""

    def __init__(self, store: Store, key: str, size: int = BLOB_BYTES) -> None:
        self._store, self._key, self._blob = store, key, "x" * size

    def __call__(self) -> float:
        started = time.perf_counter()
        self._store.set(self._key, self._blob)
        self._store.get(self._key)  # (after the set: both travel the same connection)
        return (time.perf_counter() - started) / (2 * len(self._blob))
