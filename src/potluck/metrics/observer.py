"""``StepObserver``: what this rank spent on each step, and where it is right now.

Per committed step it measures local compute (from the step's first forward until this
rank's last gradient is ready: ``balance.ComputeClock``), the time blocked in the
gradient all-reduce after that (its tail: the wait for slower peers), the time the
all-reduce was in flight, the bytes handed to it, the samples of the step and the wall
time since the previous step. The all-reduce makes every rank's *step* time equal; the
*compute* time is what tells the bottleneck apart (docs/status.md).

It is the ``LocalClock`` that ``DataParallel`` drives (passing the calls on to the
balancer's clock when there is one) and the transaction tells it where the step stands
(``step_started``, ``committed``, ``abandoned``). It keeps a phase ("computing step 41")
for the status page's "last seen", and hands each step's figures to its sinks (a
journal, the store publisher). Cost per step: a few ``perf_counter`` calls and one small
dict; on a GPU the compute clock's two CUDA events are read once they completed, a
step or so later (waiting for them would stop the CPU from queueing ahead).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from typing import Any, Protocol

from potluck import events
from potluck.errors import ConfigError
from potluck.events import Note
from potluck.reducer.clock import ComputeClock, Reading
from potluck.reducer.data_parallel import LocalClock
from potluck.reducer.reducer import PassStats

log = logging.getLogger(__name__)

Where = Callable[[], tuple[int, int, int]]  # () -> (rank, world_size, generation)
Samples = Callable[[], "tuple[int, int] | None"]  # () -> (this rank's, the step's)


@dataclass(frozen=True)
class StepFigures:
    """One rank's view of one committed step (a ``rank_step`` record)."""

    step: int
    rank: int
    world_size: int
    generation: int
    worker: str
    host: str
    compute_s: float | None
    wait_s: float | None
    comm_s: float | None
    step_s: float | None
    bytes: int
    samples: int | None = None
    share: float | None = None
    loss: float | None = None

    @property
    def samples_per_s(self) -> float | None:
        """This rank's own speed: its samples over its compute time."""
        if self.samples is None or not self.compute_s:
            return None
        return self.samples / self.compute_s

    def record(self) -> dict[str, Any]:
        """The fields that have a finite value (a NaN loss is left out: JSON has none)."""
        # (not asdict: it deep-copies every value, a tenth of a millisecond a step)
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)
                  if _finite(getattr(self, f.name))}
        if _finite(self.samples_per_s):
            fields["samples_per_s"] = self.samples_per_s
        return fields


class StepSink(Protocol):
    """Where each step's figures go (``publisher.JournalSink``, ``StorePublisher``), and
    the process's notes (``potluck.events``: a checkpoint, a rebalance, a quarantine)."""

    def write(self, figures: StepFigures) -> None: ...

    def note(self, note: Note) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Position:
    """Where the rank is: ``phase`` (a template naming ``{step}``) of ``step``, since
    ``since`` (``perf_counter``)."""

    phase: str
    step: int
    since: float


class StepObserver:
    """Times each step of this rank; ``DataParallel``'s clock, the transaction's observer."""

    def __init__(self, clock: ComputeClock, where: Where,
                 passes: Callable[[], PassStats] | None = None,
                 *, samples: Samples | None = None, inner: LocalClock | None = None,
                 sinks: Sequence[StepSink] = (), worker: str | None = None) -> None:
        self._clock, self._where, self._passes = clock, where, passes
        self._samples, self._inner, self._sinks = samples, inner, list(sinks)
        self._dropped: list[StepSink] = []
        self.host = socket.gethostname()
        self.worker = worker or f"{self.host}:{os.getpid()}"
        self._lock = threading.Lock()  # the publisher thread reads the position
        self._position = Position("starting", 0, time.perf_counter())
        self._step = 0  # index of the step in progress (the loop's steps, local ones too)
        self._backward_done_at: float | None = None
        self._last_end = time.perf_counter()
        self._wait_extra = 0.0  # blocked in the step's own collectives (a round's sync)
        self._loss: float | None = None
        # Steps whose compute time is not known yet (a GPU's events), oldest first.
        self._unread: deque[tuple[Reading, StepFigures]] = deque()
        self._unlisten: Callable[[], None] | None = None

    # ------------------------------------------------------------- DataParallel's clock

    def forward_started(self) -> None:
        self._clock.forward_started()
        if self._inner is not None:
            self._inner.forward_started()
        self._move("computing step {step}")

    def backward_done(self, waited: float = 0.0) -> None:
        self._clock.backward_done(waited)
        if self._inner is not None:
            self._inner.backward_done(waited)
        if self._clock.leaves_out_waits:  # that time is the step's wait, not compute
            self._wait_extra += waited
        self._backward_done_at = time.perf_counter()
        self._move("in the gradient all-reduce of step {step}")

    # ------------------------------------------------------------ the transaction's

    def step_started(self) -> None:
        self._move("in the optimizer update of step {step}")

    def blocked(self, what: str, seconds: float) -> None:
        """Time spent in one of the step's own collectives (a round's sync)."""
        self._wait_extra += seconds

    def moving(self, what: str) -> None:
        """The rank entered a phase outside the step: ``what`` may name ``{step}``."""
        self._move(what)

    def report(self, **figures: float) -> None:
        """Figures of the step in progress the script knows (``loss=``)."""
        unknown = sorted(set(figures) - {"loss"})
        if unknown:
            raise ConfigError(f"report({', '.join(unknown)}=...): the figures a step reports "
                              "are: loss (e.g. opt.report(loss=loss.item()))")
        if "loss" in figures:
            self._loss = float(figures["loss"])

    def committed(self, step: int | None = None,
                  last: PassStats | None = None) -> StepFigures | None:
        """The step in progress is done (applied, or a local step of a round). Its
        figures go to the sinks once its compute time can be read: at once on the CPU
        (and returned), on a GPU at a later step, when its kernels ran (None here).
        ``last``: the model's last pass (default: ``passes()``, if given)."""
        now = time.perf_counter()
        rank, world_size, generation = self._where()
        if last is None and self._passes is not None:
            last = self._passes()
        reading = self._clock.take_reading()
        wait = comm = None
        if last is not None and last.settled_at is not None \
                and self._backward_done_at is not None \
                and last.settled_at >= self._backward_done_at:
            wait = last.settled_at - self._backward_done_at
            comm = last.settled_at - (last.launched_at or last.settled_at)
        if self._wait_extra:
            wait = (wait or 0.0) + self._wait_extra
        counts = self._samples() if self._samples is not None else None
        figures = StepFigures(
            step=self._step if step is None else step, rank=rank, world_size=world_size,
            generation=generation, worker=self.worker, host=self.host, compute_s=None,
            wait_s=wait, comm_s=comm, step_s=now - self._last_end,
            bytes=last.bytes if last is not None and last.settled_at is not None
            and wait is not None else 0,
            samples=counts[0] if counts else None,
            share=counts[0] / counts[1] if counts and counts[1] else None, loss=self._loss)
        self._step = figures.step + 1
        self._reset(now)
        self._unread.append((reading, figures))
        done = self._flush(wait=False)
        self._move("between steps, before step {step}")
        return done[-1] if done and done[-1].step == figures.step else None

    def abandoned(self) -> None:
        """The step failed and will be redone: its timing is void."""
        self._clock.take_reading()  # dropped unread: never wait on a failed step's GPU work
        self._reset(time.perf_counter())
        self._move("redoing step {step}")

    def position(self) -> Position:
        with self._lock:
            return self._position

    def add_sink(self, sink: StepSink) -> None:
        self._sinks.append(sink)

    def hear_notes(self) -> None:
        """Pass this process's notes (``potluck.events``) to the sinks until ``close``."""
        if self._unlisten is None:
            self._unlisten = events.listen(self.noted)

    def noted(self, note: Note) -> None:
        """A note of this process (any thread): to every sink; one that fails is
        dropped, the others still get it (seeing the run must never stop it)."""
        for sink in list(self._sinks):
            try:
                sink.note(note)
            except Exception:
                log.warning("a metrics sink failed on a note; it gets no more steps",
                            exc_info=True)
                self._drop(sink)

    def close(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._flush(wait=True)
        for sink in [*self._sinks, *self._dropped]:  # a dropped one may hold a file
            try:
                sink.close()
            except Exception:  # a sink that cannot flush must not fail the run's end
                log.warning("a metrics sink failed to close", exc_info=True)

    def _flush(self, *, wait: bool) -> list[StepFigures]:
        """Hand every step whose compute time can be read (all, ``wait``) to the sinks."""
        done = []
        while self._unread and (wait or self._unread[0][0].ready()):
            reading, figures = self._unread.popleft()
            figures = replace(figures, compute_s=reading.seconds())
            for sink in list(self._sinks):
                try:
                    sink.write(figures)
                except Exception:  # seeing the run must never stop it: drop that sink
                    log.warning("a metrics sink failed; it gets no more steps", exc_info=True)
                    self._drop(sink)
            done.append(figures)
        return done

    def _drop(self, sink: StepSink) -> None:
        """No more steps or notes for ``sink`` (closed with the others at ``close``);
        the training thread and a note's thread may both drop it."""
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)
                self._dropped.append(sink)

    def _reset(self, now: float) -> None:
        self._backward_done_at, self._wait_extra, self._loss = None, 0.0, None
        self._last_end = now

    def _move(self, phase: str) -> None:
        with self._lock:
            self._position = Position(phase, self._step, time.perf_counter())


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def describe(position: Position) -> str:
    """``"computing step 41"``: the phase and the step, for the page's "last seen"."""
    return position.phase.format(step=position.step)
