"""``observer_for``: the step observer a prepared worker runs, with the sinks its launch
asked for: a ``rank_step`` journal under ``metrics_dir`` (``prepare(metrics_dir=)`` or
``potluck run --metrics-dir``; TensorBoard scalars beside it when TensorBoard is
installed), and pulses for the status page (``potluck run
--status-port``). Timing itself is always on: it costs a few clock reads a step.
``observed()`` says whether this process made one: ``potluck run``'s worker bootstrap
asks, since those flags (and ``--balance``) take effect in ``potluck.prepare`` only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from potluck.cohort import Cohort
from potluck.metrics.observer import Samples, StepObserver, StepSink
from potluck.metrics.publisher import (
    JournalSink,
    StorePublisher,
    store_client,
    tensorboard_sink,
)
from potluck.reducer.clock import ComputeClock
from potluck.reducer.data_parallel import LocalClock
from potluck.reducer.reducer import PassStats

_made = threading.Event()  # set by the first observer_for of this process


def observed() -> bool:
    """Whether this process made a prepared worker's observer (``observer_for``)."""
    return _made.is_set()


def observer_for(cohort: Cohort, passes: Callable[[], PassStats], *,
                 samples: Samples | None = None, inner: LocalClock | None = None,
                 metrics_dir: str | Path | None = None) -> StepObserver:
    _made.set()

    def where() -> tuple[int, int, int]:
        return cohort.rank, cohort.world_size, cohort.generation

    directory = metrics_dir if metrics_dir is not None else cohort.env.metrics_dir
    sinks: list[StepSink] = []
    if directory:
        sinks.append(JournalSink(directory))
        board = tensorboard_sink(directory)  # when TensorBoard is installed
        if board is not None:
            sinks.append(board)
    observer = StepObserver(ComputeClock(cohort.device), where, passes, samples=samples,
                            inner=inner, sinks=sinks)
    env = cohort.env
    if env.status and env.master_addr is not None and env.master_port is not None:
        observer.add_sink(StorePublisher(
            store_client(env.master_addr, env.master_port), env.run_id,
            f"{observer.host}:{os.getpid()}", position=observer.position, where=where,
            events=lambda: list(cohort.events), member=cohort.worker_id,
            # A fixed job's restart starts every worker again; an elastic one's restarted
            # worker is a new member of the same run.
            attempt=0 if cohort.elastic else env.restart_count).start())
    return observer
