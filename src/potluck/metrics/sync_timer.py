"""Time the gradient sync of each backward pass by wrapping a communication hook.

``SyncTimer`` is itself a hook (``timer(state, bucket) -> Future``) that delegates to
another (``allreduce_mean`` by default) and notes when the first bucket of a pass was
launched and when the last one completed. ``take()`` returns that span, the wall time
during which gradients were on the wire (it overlaps backward compute; it is not the
time a step lost to communication), and starts the next pass.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from potluck.reducer.hooks import Bucket, CommHook, allreduce_mean


class SyncTimer:
    """A communication hook that times its inner hook; register with ``state=None``."""

    def __init__(self, inner: CommHook = allreduce_mean, inner_state: Any = None) -> None:
        self._inner = inner
        self._inner_state = inner_state
        self._lock = threading.Lock()
        self._first_launch: float | None = None
        self._last_done: float | None = None

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
        with self._lock:
            if self._first_launch is None:
                self._first_launch = time.perf_counter()
        future = self._inner(self._inner_state, bucket)
        return future.then(self._on_done)

    def _on_done(self, future: torch.futures.Future[Any]) -> Any:
        # Runs on the backend's thread when the bucket's collective completes; the
        # reducer waits on the chained future, so every pass is timed before backward
        # returns.
        with self._lock:
            self._last_done = time.perf_counter()
        return future.value()

    def take(self) -> float:
        """Seconds from the first launch to the last completion of the pass; 0 if none."""
        with self._lock:
            first, last = self._first_launch, self._last_done
            self._first_launch = self._last_done = None
        if first is None or last is None:
            return 0.0
        return max(0.0, last - first)
