"""The cohort of ``potluck bench cohort`` and its faults, from a seed (pure).

Four hosts, uneven in link and speed (``LINKS``, ``QUOTAS``). The faults fall at
fractions of the run's training (its committed samples), so every contender meets them
at the same point of its progress, whatever its speed:

- ``attack``: the attacker's worker sends corrupted pseudo-gradients for a stretch;
- ``kill``: a worker is SIGKILLed; ``restart``: its machine comes back later, a new node;
- ``throttle``: a link is cut to a fraction of its rate;
- ``store_host``: the store's host (node 0) is lost: its link cut and its processes killed.

``CohortConfig`` is the run: the model, the data, the limits, the contenders.

The attacker, the killed worker and the throttled link are three different nodes, none
of them node 0, so each fault is seen on its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

LINKS_MBIT = (100.0, 20.0, 10.0, 5.0)  # each host's link, both ways
QUOTAS = (1.0, 0.7, 0.5, 0.3)  # each host's CPU, in cores
THROTTLE = 0.25  # the throttled link keeps this fraction of its rate
KINDS = ("attack", "kill", "restart", "throttle", "store_host")
CONTENDERS = ("potluck", "potluck-step", "torchrun")


@dataclass(frozen=True)
class CohortConfig:
    """The bench's run. ``limit_s`` bounds a potluck contender's run; ``torchrun_limit_s``
    bounds torchrun's (None: 30 times potluck's time to target where potluck ran and
    reached it, else ``limit_s``)."""

    seed: int = 0
    quick: bool = False
    contenders: tuple[str, ...] = CONTENDERS
    samples: int = 7680  # an epoch
    epochs: int = 1  # the run's nominal length: the faults fall at fractions of it
    max_epochs: int = 8  # a cap: the job goes on until its faults fell and the target
    # was reached, then one more epoch
    global_batch: int = 32
    inner_steps: int = 30  # H of the potluck contender (see docs/benchmarks.md)
    eval_every: int = 10  # torchrun: global steps between held-out losses
    d_model: int = 128
    layers: int = 2
    corpus_chars: int = 400_000
    target_loss: float = 2.6
    limit_s: float = 1800.0
    torchrun_limit_s: float | None = None
    checkpoint_every: int = 20  # torchrun: global steps between checkpoints
    torchrun_rdzv_conf: tuple[str, ...] = ()  # torchrun's rendezvous beyond its defaults
    logs: str | None = None

    @property
    def commits_per_round(self) -> int:
        return self.global_batch * self.inner_steps


# (max_epochs: only a cap; in --quick the stop file ends the job an epoch after the
# last fault, whether or not the target was reached. With rounds of 64 samples 20
# epochs took 65 s, and on a loaded machine the killed worker's machine was not back
# in by then: the faults after it never fell.)
QUICK = CohortConfig(quick=True, contenders=("potluck",), samples=1280, epochs=3,
                     max_epochs=60, global_batch=16,
                     inner_steps=4, eval_every=4, d_model=32, layers=1, corpus_chars=100_000,
                     target_loss=3.2, limit_s=150.0, checkpoint_every=10)


@dataclass(frozen=True)
class Fault:
    """``kind`` on node ``node`` once ``at`` (a fraction) of the run's samples committed;
    an attack lasts until ``until``; a throttle's new rate is ``mbit``."""

    kind: str
    node: int
    at: float
    until: float = 0.0
    mbit: float = 0.0

    def describe(self) -> str:
        if self.kind == "attack":
            return (f"node {self.node} sends corrupted pseudo-gradients from {self.at:.0%} "
                    f"to {self.until:.0%} of the run")
        if self.kind == "kill":
            return f"node {self.node}'s worker is SIGKILLed at {self.at:.0%}"
        if self.kind == "restart":
            return f"node {self.node}'s machine comes back at {self.at:.0%} (a new node)"
        if self.kind == "throttle":
            return f"node {self.node}'s link drops to {self.mbit:g} Mbit/s at {self.at:.0%}"
        return f"node {self.node}, the store's host, is lost at {self.at:.0%} (link and processes)"


def schedule(seed: int) -> list[Fault]:
    """The faults of a run, in the order they fall."""
    rng = random.Random(seed)
    attacker, victim, slowed = rng.sample((1, 2, 3), 3)

    def near(centre: float) -> float:
        return round(centre + rng.uniform(-0.04, 0.04), 3)

    attack = near(0.12)
    kill = near(0.30)
    faults = [
        Fault("attack", attacker, attack, until=round(attack + 0.2, 3)),
        Fault("kill", victim, kill),
        Fault("restart", victim, round(kill + 0.12, 3)),
        Fault("throttle", slowed, near(0.55), mbit=LINKS_MBIT[slowed] * THROTTLE),
        Fault("store_host", 0, near(0.72)),
    ]
    return sorted(faults, key=lambda f: f.at)


def due(faults: list[Fault], done: int, progress: float) -> list[Fault]:
    """The faults not yet fired (past the first ``done``) whose time has come."""
    return [f for f in faults[done:] if f.at <= progress]


GOAL = 30.0  # potluck this many times sooner than torchrun
HALT_S = 300.0  # past its limit, for a potluck contender to reach the commit it halts at


def torchrun_limit(config: CohortConfig, potluck_s: float | None) -> float:
    """How long the torchrun contender may run: the flag, else ``GOAL`` times potluck's
    time to target (so torchrun short of the target by then is the goal met, not a
    bound of 10 that a limit of 10 times would make it), else the potluck contenders'
    limit."""
    if config.torchrun_limit_s is not None:
        return config.torchrun_limit_s
    return GOAL * potluck_s if potluck_s is not None else config.limit_s


def attack_rounds(fault: Fault, total_rounds: int) -> tuple[int, int]:
    """The rounds ``[first, last)`` an attack covers, of a run of ``total_rounds``
    (rounds count from 1; at least one round)."""
    first = max(1, int(fault.at * total_rounds) + 1)
    last = max(first + 1, int(fault.until * total_rounds) + 1)
    return first, last
