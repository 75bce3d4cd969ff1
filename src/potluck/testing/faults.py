"""Faults at a rank and step, injected from a training loop under test.

A test builds a ``Faults`` plan and passes it to its ranks (it pickles). Each rank
makes an injector and calls it once a step, before the step's work::

    faults = Faults().kill(rank=2, step=3).fail_collective(rank=1, step=5)
    results = run_ranks(worker, 3, faults, may_die=faults.may_die)

    def worker(rank, world_size, faults):
        ...
        inject = faults.injector(rank, group=cohort.group)
        for x, y in loader:
            inject(opt.steps)
            ...

``rank`` is the rank the test started (``run_ranks``' index), which an elastic
cohort's renumbering does not change. ``step`` is whatever number the loop passes:
usually the committed steps, so a redone step does not fire its fault twice. Each
fault fires once; ``slow`` fires at every call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

from potluck.errors import ConfigError
from potluck.group import GroupHandle

KINDS = ("kill", "freeze", "fail_collective", "slow")

# Sends SIGCONT to the frozen process ($0) $1 seconds after it stopped. It waits for the
# stop first, so a short freeze cannot be lost to a SIGCONT that came too early.
_WAKER = ('while kill -0 "$0" 2>/dev/null && '
          '! grep -q "^State:[[:space:]]*T" /proc/"$0"/status; do sleep 0.01; done; '
          'sleep "$1"; kill -CONT "$0" 2>/dev/null')


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``kind`` at ``rank`` when the loop reaches ``step``."""

    kind: str
    rank: int
    step: int = 0
    seconds: float | None = None  # freeze: how long (None: for good); slow: per step


class Faults:
    """A plan of faults by rank and step; build it with the methods, which chain."""

    def __init__(self) -> None:
        self.plan: list[Fault] = []

    def kill(self, rank: int, step: int) -> Faults:
        """SIGKILL to the rank's process at ``step``, as a crash or ``kill -9`` would."""
        return self._add(Fault("kill", _rank(rank), _step(step)))

    def freeze(self, rank: int, step: int, seconds: float | None = None) -> Faults:
        """SIGSTOP the rank's whole process at ``step`` (its heartbeat thread too), for
        ``seconds``, or for good (``None``: ``run_ranks`` kills it at the end)."""
        if seconds is not None and not seconds > 0:
            raise ConfigError(f"freeze(seconds={seconds!r}): give a positive number of "
                              "seconds, or None to freeze for good")
        return self._add(Fault("freeze", _rank(rank), _step(step), seconds))

    def fail_collective(self, rank: int, step: int) -> Faults:
        """At ``step``, the rank's next collective on its group raises, as one on a reset
        connection does; the peers wait for it as for a lost peer. The injector needs
        the cohort's group (``injector(rank, group=cohort.group)``)."""
        return self._add(Fault("fail_collective", _rank(rank), _step(step)))

    def slow(self, rank: int, seconds_per_step: float) -> Faults:
        """The rank sleeps ``seconds_per_step`` at every step: a slower machine."""
        if not seconds_per_step > 0:
            raise ConfigError(f"slow(seconds_per_step={seconds_per_step!r}): give a "
                              "positive number of seconds, e.g. 0.05")
        return self._add(Fault("slow", _rank(rank), 0, seconds_per_step))

    @property
    def may_die(self) -> set[int]:
        """The ranks that may not report: killed or frozen for good (``run_ranks``'
        ``may_die``)."""
        return {f.rank for f in self.plan
                if f.kind == "kill" or (f.kind == "freeze" and f.seconds is None)}

    def injector(self, rank: int, group: GroupHandle | None = None) -> Injector:
        """The callable this rank's loop calls once a step with the step's number."""
        mine = [f for f in self.plan if f.rank == rank]
        if group is None and any(f.kind == "fail_collective" for f in mine):
            raise ConfigError(f"rank {rank} has a fail_collective fault, which needs the "
                              "group its collectives go through: pass "
                              "injector(rank, group=cohort.group)")
        if group is not None and not isinstance(group, GroupHandle):
            raise ConfigError(f"group={group!r}: pass the cohort's GroupHandle "
                              "(cohort.group), the one every collective of the step uses")
        return Injector(mine, group)

    def _add(self, fault: Fault) -> Faults:
        self.plan.append(fault)
        return self

    def __repr__(self) -> str:
        return f"Faults({self.plan})"


class Injector:
    """One rank's faults; call it once a step with the step's number."""

    def __init__(self, faults: list[Fault], group: GroupHandle | None) -> None:
        self.faults, self.group = faults, group
        self.fired: list[Fault] = []  # in the order they fired

    def __call__(self, step: int) -> None:
        for fault in self.faults:
            if fault.kind == "slow":
                time.sleep(fault.seconds or 0.0)
            elif fault.step == step and not any(f is fault for f in self.fired):
                self.fired.append(fault)
                self._fire(fault)

    def _fire(self, fault: Fault) -> None:
        if fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "freeze":
            freeze(fault.seconds)
        elif fault.kind == "fail_collective" and self.group is not None:
            self.group.fail_next_collective(
                f"injected by potluck.testing at rank {fault.rank}, step {fault.step}")


def freeze(seconds: float | None) -> None:
    """Stop this whole process (SIGSTOP) for ``seconds``, or for good (None)."""
    if seconds is None:
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    waker = subprocess.Popen(["/bin/sh", "-c", _WAKER, str(os.getpid()), f"{seconds:.3f}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    waker.wait()


def _rank(rank: int) -> int:
    if rank < 0:
        raise ConfigError(f"rank {rank}: ranks count from 0")
    return rank


def _step(step: int) -> int:
    if step < 0:
        raise ConfigError(f"step {step}: steps count from 0")
    return step
