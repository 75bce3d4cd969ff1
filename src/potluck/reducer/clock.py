"""The compute clock: how long this rank computed in the current step.

It runs from the step's first forward (with gradients on) until the end of its last
backward's local work, which is when this rank's last gradient is ready, before the
wait for the all-reduce, less the time backward spent blocked in the reducer's
launches (a communication hook that waits for its collectives, as trust's does, would
otherwise count the slowest peer's compute as this rank's). Time spent waiting for
slower peers is therefore not counted, and a step of several micro-batches is timed as
a whole. On a GPU the blocked time is not left out: the host waits there while the GPU
works through the compute queued before, so the host's seconds are not idle GPU time
(events around each blocking launch would measure that; not built). ``DataParallel`` drives it
(``forward_started``, and ``backward_done`` from a callback queued on the autograd
engine ahead of the reducer's own); the balancer reads it once per committed step.

On a GPU the two instants are CUDA events on the current stream, read after the step
(the kernels were only queued when the CPU passed those points): ``take`` waits for
them, ``take_reading`` hands them over to be read later; on the CPU,
``time.perf_counter``.
"""

from __future__ import annotations

import time

import torch


class ComputeClock:
    """``forward_started()`` ... ``backward_done()`` ..., then ``take()`` the seconds."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._cuda = torch.device(device).type == "cuda"
        self._start: float | torch.cuda.Event | None = None
        self._end: float | torch.cuda.Event | None = None
        self._waited = 0.0  # seconds of the step blocked in collectives, not computing

    @property
    def leaves_out_waits(self) -> bool:
        """Whether ``backward_done``'s ``waited`` is left out (on the CPU)."""
        return not self._cuda

    def forward_started(self) -> None:
        """A forward with gradients begins; the first one of a step starts the clock."""
        if self._start is None:
            self._start = self._now()

    def backward_done(self, waited: float = 0.0) -> None:
        """A backward's local work ended (the last one of the step counts); ``waited``:
        seconds of it spent blocked in collectives, left out."""
        if self._start is not None:
            self._end = self._now()
            if not self._cuda:  # (on a GPU the host's wait overlaps queued compute)
                self._waited += waited

    def take(self) -> float | None:
        """Seconds from the step's first forward to its last backward; None if either
        is missing. Starts the next step's timing. On a GPU this waits for the step's
        backward kernels; ``take_reading`` does not."""
        return self.take_reading().seconds()

    def take_reading(self) -> Reading:
        """The step's two instants, to be read once ``ready()`` (at once on the CPU; on
        a GPU when the backward's kernels ran: waiting for them each step would stop the
        CPU from queueing the next step ahead). Starts the next step's timing."""
        start, end, waited = self._start, self._end, self._waited
        self._start = self._end = None
        self._waited = 0.0
        return Reading(start, end, waited)


    def _now(self) -> float | torch.cuda.Event:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            return event
        return time.perf_counter()


class Reading:
    """One step's compute interval, read when its instants are known."""

    def __init__(self, start: float | torch.cuda.Event | None,
                 end: float | torch.cuda.Event | None, waited: float = 0.0) -> None:
        self._start, self._end, self._waited = start, end, waited

    def ready(self) -> bool:
        """Whether ``seconds()`` answers without waiting for the GPU."""
        return not isinstance(self._end, torch.cuda.Event) or bool(
            self._end.query())  # type: ignore[no-untyped-call]

    def seconds(self) -> float | None:
        """Seconds from the first forward to the last backward, less the time blocked in
        collectives (None: either instant missing, or nothing left)."""
        start, end = self._start, self._end
        if start is None or end is None:
            return None
        if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
            end.synchronize()
            spent = float(start.elapsed_time(end)) / 1000.0
        else:
            assert isinstance(start, float) and isinstance(end, float)
            spent = end - start
        spent -= self._waited
        return spent if spent > 0 else None
