"""The elastic agent's sweep: which of its running workers the cohort no longer needs.

Every half second a thread of its own asks the job's store, on a connection of its own,
about each running worker (``job_keys.view_worker``) and applies ``policy.why_end``. A
thread, because over a dead link to node 0 a store request blocks for minutes whatever
its timeout: the agent's monitor loop (signals, restarts) must never wait for it. The
loop picks the verdicts up with ``verdicts()`` and ends those workers itself.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from potluck.launch.job_keys import run_finished, view_worker
from potluck.launch.policy import why_end

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

INTERVAL = 0.5


class Sweeper:
    """Watches ``watch()``'s pids; ``verdicts()`` hands out why to end which; ``stop()``."""

    def __init__(self, store: Store, run_id: str, grace: float) -> None:
        self._store: Store = getattr(store, "clone")()  # noqa: B009  (stubs lack clone)
        self._run_id, self._grace = run_id, grace
        self._lock = threading.Lock()
        self._watched: list[int] = []
        self._verdicts: dict[int, str] = {}
        self._ids: dict[int, str] = {}
        self._finished_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="potluck-sweep", daemon=True)
        self._thread.start()

    @property
    def run_over(self) -> bool:
        """The cohort said the run is complete: nothing is restarted any more."""
        return self._finished_at is not None

    def watch(self, pids: list[int]) -> None:
        with self._lock:
            self._watched = list(pids)

    def verdicts(self) -> dict[int, str]:
        with self._lock:
            found, self._verdicts = self._verdicts, {}
        return found

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            try:
                self._round()
            except RuntimeError:  # the store is gone: the cohort decides nothing now
                return

    def _round(self) -> None:
        if self._finished_at is None and run_finished(self._store, self._run_id):
            self._finished_at = time.monotonic()
        finished_for = None if self._finished_at is None \
            else time.monotonic() - self._finished_at
        with self._lock:
            watched = list(self._watched)
        for pid in watched:
            view = view_worker(self._store, self._run_id, pid, self._ids.get(pid))
            if view.worker_id is not None and not view.left:
                self._ids[pid] = view.worker_id
            else:  # (a worker that left and runs on rejoins under a new id: read it anew)
                self._ids.pop(pid, None)
            why = why_end(view, finished_for=finished_for, grace=self._grace)
            if why is not None:
                with self._lock:
                    self._verdicts[pid] = why
