"""The concerns ``potluck.prepare`` composes, each built alone from its arguments.

- ``choose``: the call's ``Modes`` (refused by ``table``) and what follows from them,
  before the cohort is joined;
- ``reconciler``: how replicas are reconciled: every step (None) or once a round (the
  sync strategy, ``potluck.sync``);
- ``share_policy``: how a step is split: equal, the user's, balanced by speed (the
  ``Balancer``), or the round's plan (the strategy itself);
- ``aggregator``: how copies are aggregated: the mean (None) or robustly, with checks
  (``potluck.trust``, imported only when asked for);
- ``steward``: whether a member that drags the cohort down is swapped for a waiting
  spare (``potluck.population``, ``potluck run --swap-drag``).

Each takes the objects built before it, never one built after: ``Handout`` is how the
loader, built last, tells the others what it handed out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from potluck import keys
from potluck.balance import BalanceConfig, Balancer
from potluck.cohort import Cohort
from potluck.compose.table import Aggregate, Hook, Modes, Reconcile, refusals
from potluck.data.handout import Handout
from potluck.data.memory import MemoryCap
from potluck.errors import ConfigError
from potluck.metrics.observer import StepObserver
from potluck.population import StoreProbe, SwapPart, SwapRule
from potluck.reducer import DataParallel
from potluck.reducer.clock import ComputeClock
from potluck.reducer.contribution import Contribution
from potluck.reducer.hooks import sums_prescaled
from potluck.step.parts import EqualShares, SharePolicy

if TYPE_CHECKING:
    from potluck.sync import DiLoCo, DiLoCoSync
    from potluck.trust import Trust, TrustPart
    from potluck.trust.round_part import RoundTrustPart


@dataclass(frozen=True)
class Choice:
    """What a ``prepare`` call asks for, checked against the table."""

    modes: Modes
    balance: BalanceConfig | None  # every step, balanced by measured speed
    memory: MemoryCap  # this rank's micro-batch cap
    sync: DiLoCo | None

    @property
    def agreed_balance(self) -> BalanceConfig | None:
        """The balancing every rank must agree on (not ``max_micro_batch``: each rank's
        own memory cap)."""
        return None if self.balance is None else dataclasses.replace(
            self.balance, max_micro_batch=None)


def choose(*, sync: Any, balance: Any, launcher_balance: bool, shares: SharePolicy | None,
           weight: Callable[[Any], float] | None, trust: Any, elastic: bool,
           max_micro_batch: int | None, data_parallel: dict[str, Any]) -> Choice:
    """The call's modes, refused by the first row of the table that forbids them."""
    config = _balance_config(launcher_balance if balance is None else balance)
    sync = _sync(sync)
    modes = Modes(reconcile=_reconcile(sync), split="balanced" if config else "equal",
                  shares=shares is not None, aggregate=_aggregate(trust), elastic=elastic,
                  hook=hook_kind(data_parallel), tokens=weight is not None,
                  micro_batches=_cap(max_micro_batch, config) is not None,
                  planned=sync is None or (sync.adaptive and sync.split is None),
                  bounded=_bounded(data_parallel))
    refused = refusals(modes)
    if refused:
        raise ConfigError(refused[0].message())
    if weight is not None and not callable(weight):
        raise ConfigError(f"weight={weight!r} must be a function of the batch returning "
                          "its units, e.g. weight=lambda batch: int(batch['mask'].sum())")
    # Under rounds, balancing is the round's plan (DiLoCo(adaptive=True)): no balancer.
    every_step = config if sync is None else None
    whole = ("trust=Trust(spot_check=...) recomputes a rank's part in one pass, which "
             "micro-batches need not match (BatchNorm's statistics are per micro-batch)"
             if modes.aggregate == "spot checks" else None)
    return Choice(modes, every_step, MemoryCap(_cap(max_micro_batch, config), whole=whole),
                  sync)


def hook_kind(data_parallel: dict[str, Any]) -> Hook:
    """The user's ``comm_hook=``: none, ``CompressedSum(codec)``, another one that sums
    (keeps potluck's weights), or one that does its own weighting."""
    if "comm_hook" not in data_parallel:
        return "none"
    hook = data_parallel["comm_hook"]
    from potluck.compress import CompressedSum  # (a hook was given: maybe one of these)

    if isinstance(hook, CompressedSum):
        return "codec"
    return "summing" if sums_prescaled(hook) else "own"


def _bounded(data_parallel: dict[str, Any]) -> bool:
    """Whether a ``comm_hook=CompressedSum(codec)``'s codec bounds each value's rounding
    (a spot check's allowance through it)."""
    from potluck.compress import Bounded

    codec = getattr(data_parallel.get("comm_hook"), "codec", None)
    return codec is None or isinstance(codec, Bounded)


def reconciler(choice: Choice, model: nn.Module, cohort: Cohort,
               global_batch: int) -> DiLoCoSync | None:
    """The sync strategy that reconciles replicas once a round, or None (every step)."""
    if choice.sync is None:
        return None
    from potluck.sync import DiLoCoSync
    from potluck.sync.round_plan import plan_round

    if choice.sync.split is not None:  # now, not from the loader a round in
        plan_round([None] * cohort.world_size, choice.sync.inner_steps, split=choice.sync.split)
    return DiLoCoSync(choice.sync, model, cohort.group, global_batch, cohort.device,
                      on_lost=cohort.mark_step_failed if cohort.elastic else None)


def share_policy(choice: Choice, shares: SharePolicy | None, cohort: Cohort,
                 global_batch: int, contribution: Contribution | None,
                 clock: ComputeClock | None, handout: Handout) -> SharePolicy:
    """How each step is split among the ranks (under rounds: the strategy's plan)."""
    if choice.balance is not None and contribution is not None and clock is not None:
        return Balancer(cohort, global_batch, contribution, clock, choice.balance,
                        choice.memory, handout.step_samples)
    return shares or EqualShares()


def aggregator(trust: Trust | None, cohort: Cohort, wrapped: DataParallel,
               handout: Handout, weight: Callable[[Any], float] | None,
               data_parallel: dict[str, Any], strategy: DiLoCoSync | None = None,
               optimizer: Optimizer | None = None, clip_grad_norm: float | None = None
               ) -> TrustPart | RoundTrustPart | None:
    """Trust's step part, its exchange registered as the model's hook (None: the mean).
    Each copy weighs its rank's part of the step: its samples, or under ``weight=`` its
    units, which every rank reads from that rank's batch itself. A ``comm_hook=
    CompressedSum(codec)`` (in ``data_parallel``, DataParallel's options) gives its
    codec and error feedback setting to the exchange, which takes its place. Under
    rounds (``strategy``), trust's round sum is registered with the strategy instead,
    with the round's codec (``DiLoCo(codec=...)``); its spot re-run repeats local steps
    with ``optimizer`` (the inner one) and ``clip_grad_norm`` (the guard's)."""
    if trust is None:
        return None
    if strategy is not None:
        from potluck.trust.round_part import RoundTrustPart

        config = strategy.config
        return RoundTrustPart(trust, cohort, wrapped.module, strategy, codec=config.codec,
                              error_feedback=config.error_feedback,
                              assigned=lambda: handout.split, read_range=handout.read_ranges,
                              optimizer=optimizer, clip_grad_norm=clip_grad_norm)
    if trust.round_check is not None:
        raise ConfigError("trust=Trust(round_check=...) checks pseudo-gradients, which only "
                          "rounds have: add sync=potluck.DiLoCo(...), or use "
                          "Trust(spot_check=SpotCheck(loss)) to check every step's gradients")
    from potluck.compress import CompressedSum
    from potluck.trust import TrustPart

    comm_hook = data_parallel.get("comm_hook")

    parts = (lambda: handout.split) if weight is None else handout.weighed(weight)
    codec = comm_hook if isinstance(comm_hook, CompressedSum) else None  # (the table
    # lets only a CompressedSum through with trust)
    part = TrustPart(trust, cohort, wrapped.module, parts, handout.part_of,
                     lambda: wrapped.reducer.last_pass,
                     codec=codec.codec if codec is not None else None,
                     error_feedback=codec is None or codec.feedback is not None)
    wrapped.register_comm_hook(None, part.exchange)
    return part


def untrusted(guard: TrustPart | RoundTrustPart) -> Callable[[int], list[int]]:
    """On a fixed cohort a quarantined rank stays in the group: the others train its
    part of each step (an elastic cohort removes it at the step's boundary)."""
    return lambda world_size: sorted(set(range(world_size)) - set(guard.trusted(world_size)))


def _balance_config(balance: Any) -> BalanceConfig | None:
    if not isinstance(balance, (bool, BalanceConfig)):
        raise ConfigError(f"balance={balance!r}: pass True (shares by measured speed), "
                          "False, or a potluck.BalanceConfig(...)")
    return BalanceConfig() if balance is True else (balance or None)


def _sync(sync: Any) -> DiLoCo | None:
    if sync is None:
        return None
    from potluck.sync import DiLoCo

    if not isinstance(sync, DiLoCo):
        raise ConfigError(f"sync={sync!r}: pass potluck.DiLoCo(inner_steps=H, ...) or "
                          "potluck.LocalSGD(H); leave it out to average gradients every step")
    return sync


def _reconcile(sync: DiLoCo | None) -> Reconcile:
    if sync is None:
        return "every step"
    return "streaming" if sync.fragments > 1 else "rounds"


def _aggregate(trust: Any) -> Aggregate:
    if trust is None:
        return "mean"
    from potluck.trust import Trust

    if not isinstance(trust, Trust):
        raise ConfigError(f"trust={trust!r}: pass potluck.Trust() (or Trust(aggregator=...,"
                          " ...)); leave it out to average gradients plainly")
    return "robust" if trust.spot_check is None else "spot checks"


def _cap(given: int | None, config: BalanceConfig | None) -> int | None:
    """This rank's memory cap: ``prepare(max_micro_batch=)`` or the balancing's."""
    balancing = config.max_micro_batch if config else None
    if given is not None and balancing is not None and given != balancing:
        raise ConfigError(f"prepare(max_micro_batch={given}) and BalanceConfig("
                          f"max_micro_batch={balancing}) disagree: give this rank's cap once")
    return given if given is not None else balancing


def steward(choice: Choice, cohort: Cohort, observer: StepObserver,
            strategy: object | None, global_batch: int) -> tuple[SwapPart, ...]:
    """The swap part when the launcher asked for one (``--swap-drag``), on an elastic
    cohort training every step (none otherwise); it hears each step's figures from
    ``observer``."""
    env = cohort.env
    if env.swap_drag is None or not cohort.elastic:
        return ()
    if strategy is not None:
        raise ConfigError(
            f"potluck run --swap-drag {env.swap_drag:g} with sync={type(strategy).__name__}"
            "(...): a swap compares the steps of training that syncs every step, and a "
            "round's figures are not that; drop --swap-drag, or sync every step")
    part = SwapPart(SwapRule(env.swap_drag, env.swap_window), cohort,
                    StoreProbe(cohort.store, keys.link_probe(env.run_id, cohort.worker_id)),
                    global_batch=global_batch, balanced=choice.balance is not None)
    observer.add_sink(part)
    return (part,)
