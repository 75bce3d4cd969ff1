"""``PlainModels``: the step observer of a script that builds ``potluck.DataParallel``
itself, without ``potluck.prepare``.

``potluck run``'s worker bootstrap starts it when ``--status-port`` or
``--metrics-dir`` is on. The first ``DataParallel`` the script builds without
``clock=`` then gets a ``StepObserver`` (``reducer.data_parallel.watch_models``). A
step ends when a backward that averages gradients has settled its collectives: a
backward under ``no_sync()`` is a micro-batch of the next one. Compute, wait, comm,
bytes and step times are measured as under ``prepare``. Samples per step are not known
(the script's loader hands them out), so the pulses say so and the page leaves samples/s
and shares blank. The steps count from 0 at the first one.

One model per process is observed: a second one would publish under the same worker
name. A model on a cohort of ``potluck.init()`` is observed on that cohort (its
generation, members and events); one on a torch process group at generation 0.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from potluck.cohort.current import current
from potluck.env import WorkerEnv
from potluck.metrics.observer import StepObserver
from potluck.metrics.observing import cohort_observer, make_observer, observed
from potluck.reducer.clock import ComputeClock
from potluck.reducer.data_parallel import DataParallel, watch_models

log = logging.getLogger(__name__)


class PlainModels:
    """Observes the first ``DataParallel`` built without ``clock=`` from ``start()`` on,
    with the sinks ``worker`` asks for, until ``close()``; none once ``prepared()`` (this
    process's ``potluck.prepare`` made its observer)."""

    def __init__(self, worker: WorkerEnv, *,
                 prepared: Callable[[], bool] = observed) -> None:
        self._worker, self._prepared = worker, prepared
        self._lock = threading.Lock()
        self._observer: StepObserver | None = None
        self._watched = self._on_cohort = False
        self._stop: Callable[[], None] = _nothing

    def start(self) -> PlainModels:
        self._stop = watch_models(self._watch)
        return self

    @property
    def watched(self) -> bool:
        """Whether a model was observed (after ``close()`` too)."""
        return self._watched

    @property
    def on_cohort(self) -> bool:
        """Whether that model talks on a cohort of ``potluck.init()``."""
        return self._on_cohort

    def close(self) -> None:
        """Stop watching; the observer sends its last steps and closes its sinks."""
        self._stop()
        with self._lock:
            observer, self._observer = self._observer, None
        if observer is not None:
            observer.close()

    def _watch(self, model: DataParallel) -> StepObserver | None:
        with self._lock:
            if self._observer is not None or self._prepared():
                return None  # one observer per process: they would share a worker name
            self._observer = self._observe(model)
            self._watched = True
        log.debug("timing the steps of %s (no potluck.prepare: samples are not counted)",
                  type(model.module).__name__)
        return self._observer

    def _observe(self, model: DataParallel) -> StepObserver:
        cohort = current()
        if cohort is not None and model.group is cohort.group:
            self._on_cohort = True
            observer = cohort_observer(cohort, lambda: model.reducer.last_pass,
                                       prepared=False)
        else:
            # A torch process group: its rank and size never change.
            place = (model.rank, model.world_size, 0)
            observer = make_observer(ComputeClock(model.join_device), lambda: place,
                                     lambda: model.reducer.last_pass, self._worker,
                                     attempt=self._worker.restart_count, prepared=False)
        observer.hear_notes()  # a CheckpointManager's saves, on the page and in the journal
        return observer


def _nothing() -> None:
    return None
