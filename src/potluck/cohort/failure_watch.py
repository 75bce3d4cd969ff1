"""``FailureWatch``: "a member gave up on this generation's step", told through the store.

A ring all-reduce can leave a survivor waiting for data from another survivor that has
already abandoned the step (its own link to the dead worker failed first); Gloo would
keep it waiting for its whole collective timeout. The member that abandons marks the
generation failed in the store; a daemon thread, on a store connection of its own, polls
for that mark, so the reducer's wait can ask ``seen()`` without any I/O and give up at
once. A thread, not a check from the waiting thread: over a dead link a store request
blocks for minutes, and the collective timeout must stay the bound.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from torch._C._distributed_c10d import Store


class FailureWatch:
    """Marks and watches ``key(generation)`` (``keys.step_failed``); ``stop()`` ends the
    thread."""

    def __init__(self, store: Store, key: Callable[[int], str], generation: Callable[[], int],
                 *, interval: float = 0.05) -> None:
        # Two connections of their own: the thread's poll may be stuck on a dead link,
        # and a request on a connection waits for the one in flight.
        self._store: Store = getattr(store, "clone")()  # noqa: B009  (stubs lack clone)
        self._marker: Store = getattr(store, "clone")()  # noqa: B009
        self._key, self._generation, self._interval = key, generation, interval
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="potluck-failure-watch",
                                        daemon=True)
        self._thread.start()

    def mark(self, generation: int) -> None:
        """This member abandoned ``generation``'s step (``set`` needs no reply: never
        blocks on a dead link)."""
        self._seen.add(generation)
        with contextlib.suppress(RuntimeError):
            self._marker.set(self._key(generation), "1")

    def seen(self, generation: int) -> bool:
        return generation in self._seen

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            generation = self._generation()
            if generation in self._seen:
                continue
            try:
                if self._store.check([self._key(generation)]):
                    self._seen.add(generation)
            except RuntimeError:  # the store is gone: the rendezvous reports it
                return
