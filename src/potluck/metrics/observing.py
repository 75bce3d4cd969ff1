"""``observer_for``: the step observer a prepared worker runs, with the sinks its launch
asked for: a ``rank_step`` journal under ``metrics_dir`` (``prepare(metrics_dir=)`` or
``potluck run --metrics-dir``; TensorBoard scalars beside it when TensorBoard is
installed), and pulses for the status page (``potluck run
--status-port``). Timing itself is always on: it costs a few clock reads a step.
``observed()`` says whether this process made one: ``potluck run``'s worker bootstrap
asks, since ``--balance`` takes effect in ``potluck.prepare`` only, and a script without
it shows step times but no samples (``metrics.plain`` observes such a script's model).
``make_observer`` builds both kinds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch._C._distributed_c10d import Store

from potluck.cohort import Cohort
from potluck.env import WorkerEnv
from potluck.metrics.observer import Samples, StepObserver, StepSink, Where
from potluck.metrics.publisher import (
    JournalSink,
    StorePublisher,
    store_client,
    tensorboard_sink,
)
from potluck.reducer.clock import ComputeClock
from potluck.reducer.data_parallel import LocalClock
from potluck.reducer.reducer import PassStats
from potluck.relay import RelayStore, succession_of

_made = threading.Event()  # set by the first observer_for of this process


def observed() -> bool:
    """Whether this process made a prepared worker's observer (``observer_for``)."""
    return _made.is_set()


def observer_for(cohort: Cohort, passes: Callable[[], PassStats] | None = None, *,
                 samples: Samples | None = None, inner: LocalClock | None = None,
                 metrics_dir: str | Path | None = None) -> StepObserver:
    """A prepared worker's observer (``passes``: None when the step transaction hands
    each committed step its model's last pass)."""
    _made.set()
    return cohort_observer(cohort, passes, samples=samples, inner=inner,
                           metrics_dir=metrics_dir)


def cohort_observer(cohort: Cohort, passes: Callable[[], PassStats] | None, *,
                    samples: Samples | None = None, inner: LocalClock | None = None,
                    metrics_dir: str | Path | None = None,
                    prepared: bool = True) -> StepObserver:
    """The observer of a worker on ``cohort``, its sinks as its launch asked
    (``prepared``: False for a plain script's model, whose steps count no samples)."""

    def where() -> tuple[int, int, int]:
        return cohort.rank, cohort.world_size, cohort.generation

    # A fixed job's restart starts every worker again; an elastic one's restarted worker
    # is a new member of the same run.
    return make_observer(ComputeClock(cohort.device), where, passes, cohort.env,
                         samples=samples, inner=inner, metrics_dir=metrics_dir,
                         events=lambda: list(cohort.events), member=cohort.worker_id,
                         attempt=0 if cohort.elastic else cohort.env.restart_count,
                         prepared=prepared, store=cohort.store)


def make_observer(clock: ComputeClock, where: Where, passes: Callable[[], PassStats] | None,
                  env: WorkerEnv, *, samples: Samples | None = None,
                  inner: LocalClock | None = None, metrics_dir: str | Path | None = None,
                  events: Callable[[], list[dict[str, Any]]] = list,
                  member: str | None = None, attempt: int = 0,
                  prepared: bool = True, store: Store | None = None) -> StepObserver:
    """A step observer with the sinks ``env`` asks for (``metrics_dir`` wins over its
    directory). ``prepared``: False for a plain script's model (no ``prepare``): its
    pulses say that samples are not counted. (A prepared run under a sync strategy
    counts none a local step either, but its page needs no notice.) ``store``: the
    cohort's; where it can move to another node (``succession``), the pulses follow
    it, so the page the new host serves shows this worker."""
    directory = metrics_dir if metrics_dir is not None else env.metrics_dir
    sinks: list[StepSink] = []
    if directory:
        sinks.append(JournalSink(directory))
        board = tensorboard_sink(directory)  # when TensorBoard is installed
        if board is not None:
            sinks.append(board)
    observer = StepObserver(clock, where, passes, samples=samples, inner=inner,
                            sinks=sinks)
    if env.status and env.master_addr is not None and env.master_port is not None:
        connect: Callable[[], Store] = store_client(env.master_addr, env.master_port)
        if isinstance(store, RelayStore) and succession_of(store) is not None:
            connect = store.clone
        observer.add_sink(StorePublisher(
            connect, env.run_id,
            f"{observer.host}:{os.getpid()}", position=observer.position, where=where,
            events=events, member=member, attempt=attempt,
            counts_samples=prepared).start())
    return observer
