"""``Balancer``: the share policy that gives each worker a share by its measured speed.

A part of the step transaction (``step.parts.SharePolicy``). After every committed step
each rank folds its own compute time into its ``SpeedMeter`` (``clock.ComputeClock``:
forward to last gradient, not the step time, which the all-reduce makes equal) and the
ranks all-gather ``[speed, max_micro_batch, uncertainty]`` (one tiny collective). The
gather is not waited for there: it runs while the next step computes, and after that
step each rank takes its result and makes the same decision (``planner.replan``):
samples per rank of the steps after it. Samples move only for a gain beyond the
speeds' noise, called for by two gathers in a row. So a plan follows the speeds of the
step before last (one step of lag), and the gather's own latency is hidden behind that
step's compute (a blocking gather also made each rank wait there for the other's
step to end, which now shows in the next all-reduce's wait instead). Every rank
issues its gather before it reads the last one, so all issue the same collectives
whatever the read gives. The
global batch never changes, nor does the data order (the cursor's), and the reducer
weighs each rank's gradient by its part of the step (``reducer.contribution``), so the
update is the one a single process would make on the same global batch.

Membership: every rank keeps measuring itself, so after a loss or a join the next
gathers re-plan over the new members; a gather in flight from the old generation is
dropped unread (its group is gone); a joiner (not measured yet) gets the
mean speed as a provisional share. The three steps right after a change run on equal
shares (the old plan's ranks no longer mean the same workers, the first gather over the
new ones is read a step later, and a second must agree). The plan and the gathered
speeds travel in the live state and in checkpoints: a resumed run starts with the
recorded shares (for three steps: the gather in flight and a first call for a move are
not state), and each rank with its recorded speed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from potluck.balance.planner import Plan, plan_shares, replan
from potluck.balance.speed import SpeedMeter
from potluck.collectives import issued, wait_for
from potluck.data.memory import MemoryCap
from potluck.data.split import equal_shares, split_counts
from potluck.errors import ConfigError, PeerLostError
from potluck.events import note
from potluck.group import GroupHandle
from potluck.reducer.clock import ComputeClock
from potluck.reducer.contribution import Contribution

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BalanceConfig:
    """``potluck.prepare(balance=BalanceConfig(...))``; ``balance=True`` takes these."""

    smoothing: float = 0.5  # the past's weight in the speed average, per step
    min_gain: float = 0.03  # re-plan only if the step is predicted this much faster
    max_micro_batch: int | None = None  # this rank's memory cap, samples per forward

    def __post_init__(self) -> None:
        SpeedMeter(self.smoothing)  # validates
        cap = self.max_micro_batch
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ConfigError(f"BalanceConfig(max_micro_batch={cap!r}) must be an int >= 1 "
                              "(this rank's most samples per forward), or None (no cap)")
        plan_shares([1.0], 1, caps=[cap], min_gain=self.min_gain)


class BalancedCohort(Protocol):
    """What the balancer needs of ``potluck.Cohort``."""

    @property
    def group(self) -> GroupHandle: ...

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def elastic(self) -> bool: ...

    @property
    def joined_late(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    def mark_step_failed(self) -> None: ...


@dataclass
class _Gather:
    """An all-gather in flight: its work, outputs and the generation that issued it."""

    work: Any
    rows: list[torch.Tensor]
    generation: int


class Balancer:
    """``shares(world_size)`` for the loader; learns from every committed step."""

    name = "shares"

    def __init__(self, cohort: BalancedCohort, global_batch: int, contribution: Contribution,
                 clock: ComputeClock, config: BalanceConfig | None = None,
                 memory: MemoryCap | None = None,
                 step_samples: Callable[[], int] | None = None) -> None:
        """``step_samples()``: the samples of the step just committed, all ranks together
        (an epoch's last step may be short: it is not measured, since a step's fixed
        costs weigh more per sample in it and would pass for a slower worker)."""
        self.config = config or BalanceConfig()
        self._memory = memory or MemoryCap(self.config.max_micro_batch)
        self._cohort, self._global_batch = cohort, global_batch
        self._contribution, self._clock = contribution, clock
        self._step_samples = step_samples
        self.meter = SpeedMeter(self.config.smoothing)
        self.plan: Plan | None = None
        self.speeds: tuple[float | None, ...] = ()  # the last gathered, in rank order
        self.changes = 0  # plans that moved samples
        self._calls = 0  # gathers in a row that called for a new plan (planner.replan)
        self._pending: _Gather | None = None  # the last step's gather, read after the next

    # ---------------------------------------------------------------- SharePolicy

    def shares(self, world_size: int) -> Sequence[float]:
        plan = self.plan
        if plan is None or plan.world_size != world_size:
            return equal_shares(world_size)
        return tuple(float(count) for count in plan.counts)

    def on_commit(self, steps: int) -> None:
        seconds = self._clock.take()
        short = self._step_samples is not None and self._step_samples() < self._global_batch
        if seconds is not None and not short:
            self.meter.add(self._contribution.samples, seconds)
        group = self._cohort.group
        if group.size() == 1:
            self._pending = None
            self.speeds, self.plan = (self.meter.speed,), None
            return
        pending, self._pending = self._pending, None
        try:
            # Issue first: every rank issues this step's gather whatever reading the
            # last one gives it (a failed or abandoned read must not skip a collective).
            self._pending = self._gather(group)
            if pending is not None and pending.generation == group.generation:
                wait_for(pending.work, group, "the speeds' all-gather")
                self._replan(pending.rows, steps)
        except PeerLostError:
            if not self._cohort.elastic:
                raise
            self._cohort.mark_step_failed()  # the next step recovers; keep the plan

    def _gather(self, group: GroupHandle) -> _Gather:
        """Issue this step's all-gather of ``[speed, cap, uncertainty]``; read after the
        next step."""
        cap = self._memory.cap  # the user's, or lower: found by running out of memory
        speed, error = self.meter.speed, self.meter.uncertainty
        row = torch.tensor([-1.0 if speed is None else speed, 0.0 if cap is None else cap,
                            -1.0 if error is None else error],
                           dtype=torch.float64, device=self._cohort.device)
        rows = [torch.empty_like(row) for _ in range(group.size())]
        work = issued(lambda: group.allgather([rows], [row]), group, "the speeds' all-gather")
        return _Gather(work, rows, group.generation)

    def _replan(self, rows: list[torch.Tensor], steps: int) -> None:
        table = [row.tolist() for row in rows]
        self.speeds = tuple(None if r[0] < 0 else float(r[0]) for r in table)
        caps = [None if r[1] == 0 else int(r[1]) for r in table]
        noise = [None if r[2] < 0 else float(r[2]) for r in table]
        before = self.plan  # None: equal shares
        plan, self._calls = replan(self.speeds, self._global_batch, current=before,
                                   calls=self._calls, noise=noise, caps=caps,
                                   min_gain=self.config.min_gain)
        split = before.counts if before is not None else tuple(split_counts(
            self._global_batch, equal_shares(len(table))))
        moved = plan.counts != split
        self.plan = plan if moved or before is not None else None
        if moved:
            self.changes += 1
            speeds = [None if s is None else round(s, 1) for s in self.speeds]
            if self._cohort.rank == 0:
                log.info("shares after step %d: %s (samples/s %s)", steps, plan.counts, speeds)
            note("rebalance", f"samples per rank {list(plan.counts)} (measured "
                              f"samples/s {speeds})", step=steps)

    def on_membership(self, rank: int, world_size: int) -> None:
        """Ranks now name other workers: equal shares until the next gathers re-plan.
        This rank's own meter stays: it still measures the same worker. A gather in
        flight belongs to the old generation's group: it is dropped unread, and the
        speeds gathered so far name the old ranks: they go too."""
        self.plan, self._pending, self.speeds, self._calls = None, None, (), 0
        self._clock.take()  # a redone step's partial timing is not a step

    # --------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"policy": "balanced",
                "counts": None if plan is None else list(plan.counts),
                "micro_batches": None if plan is None else list(plan.micro_batches),
                "speeds": list(self.speeds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("policy") != "balanced":
            raise ConfigError(
                f"the live state was made with share policy {state.get('policy')!r}, but "
                "this worker balances shares: every worker of a job must run the same "
                "script with the same potluck.prepare(...) arguments")
        counts, micro = state.get("counts"), state.get("micro_batches")
        self.plan = None if counts is None else Plan(
            tuple(counts), tuple(micro) if micro else (1,) * len(counts))
        self.speeds = tuple(state.get("speeds", ()))
        self._calls = 0
        # A resumed worker starts from its record; a joiner is a new worker.
        rank = self._cohort.rank
        if (not self.meter.measured and not self._cohort.joined_late
                and len(self.speeds) == self._cohort.world_size):
            recorded = self.speeds[rank]
            if recorded is not None:
                self.meter.seed(recorded)
