"""``potluck.prepare``: one setup call for a training script, whatever runs it.

    model, optimizer, loader = potluck.prepare(model, optimizer, dataset, global_batch=64)

returns the model wrapped for data parallelism, the optimizer as the step transaction
(commit or redo, boundary, live state) and a loader that yields this rank's part of each
global step. The same script then runs unchanged as one plain process, under
``potluck run`` or ``torchrun`` (a fixed cohort), and under ``potluck run --elastic``
(workers may die, freeze, leave or join mid-run; every sample is still trained on
exactly once and the global batch never changes). What the mode needs is decided here,
from the cohort, not by the user: a failed collective abandons the step only where it
can be redone; a late joiner takes the live state instead of broadcasting its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from potluck.balance import BalanceConfig, Balancer
from potluck.cohort import Cohort, init
from potluck.data import DataCursor
from potluck.data.memory import MemoryCap
from potluck.data.step_loader import StepLoader, check_workers
from potluck.errors import ConfigError
from potluck.metrics.observing import observer_for
from potluck.prepare_checks import (
    agree_everywhere,
    check_arguments,
    check_optimizer,
    check_setup,
    check_split,
    signature,
    whole_number,
)
from potluck.reducer import DataParallel
from potluck.reducer.clock import ComputeClock
from potluck.reducer.contribution import Contribution
from potluck.reducer.hooks import sums_prescaled
from potluck.step.guard import GuardedOptimizer
from potluck.step.minimum import MinimumSize
from potluck.step.parts import EqualShares, SharePolicy, StepPart
from potluck.step.transaction import StepTransaction

# Imported where they are asked for (sync=, trust=): a plain prepare loads neither the
# sync strategies nor trust, nor the codecs they use.
if TYPE_CHECKING:
    from potluck.sync import DiLoCo
    from potluck.trust import Trust, TrustPart


def prepare(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Any,
    *,
    global_batch: int,
    seed: int = 0,
    drop_last: bool = False,
    collate: Callable[[list[Any]], Any] | None = None,
    cohort: Cohort | None = None,
    clip_grad_norm: float | None = None,
    scaler: torch.amp.GradScaler | None = None,
    shares: SharePolicy | None = None,
    balance: bool | BalanceConfig | None = None,
    weight: Callable[[Any], float] | None = None,
    parts: Sequence[StepPart] = (),
    sync: DiLoCo | None = None,
    minimum: MinimumSize | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    metrics_dir: str | Path | None = None,
    trust: Trust | None = None,
    max_micro_batch: int | None = None,
    num_workers: int = 0,
    prefetch: int = 2,
    read_timeout: float | None = None,
    timeout: float = 60.0,
    **data_parallel: Any,
) -> tuple[DataParallel, StepTransaction, StepLoader]:
    """Set up data-parallel training of ``model`` on ``dataset``; see the module doc.

    ``global_batch`` samples make one step, all ranks together, in the order of a
    seeded per-epoch permutation (``seed``). Build ``optimizer`` over ``model``'s
    parameters before calling (a joiner then takes the cohort's state at once).
    ``cohort`` defaults to ``potluck.init(timeout=timeout)``. ``clip_grad_norm`` and
    ``scaler`` go to the ``GuardedOptimizer``; ``shares`` (equal by default) and
    ``parts`` plug into the step transaction. ``balance=True`` (or a ``BalanceConfig``;
    default: ``potluck run --balance``) gives each worker a share by its measured speed
    (``loader.micro_batches`` then says how many micro-batches this rank's memory cap
    asks for). Each rank's gradient weighs its part of the step, so the update is the
    global batch's mean; ``weight(batch)`` (e.g. the count of real tokens) weighs by
    that instead of by samples: the loss must then be the mean over those units of the
    rank's batch. ``sync=DiLoCo(inner_steps=H)`` (or ``LocalSGD(H)``,
    ``StreamingDiLoCo(H, P)``) trains each replica alone for a round of H global
    batches, then averages pseudo-gradients (``docs/sync.md``): a step of the loop is
    then a local step, ``opt.steps`` counts rounds. ``minimum``, ``checkpoint_dir`` and
    ``resume`` are the elastic minimum size (default: ``potluck run --min-workers``) and
    where its checkpoint goes. Each step is timed (``docs/status.md``): ``metrics_dir``
    (default: ``potluck run --metrics-dir``) gets every rank's ``rank_step`` journal for
    ``potluck plot``. ``trust=potluck.Trust()`` aggregates gradients robustly and
    quarantines workers caught sending bad ones (``docs/trust.md``).
    ``max_micro_batch`` is this rank's memory cap, samples per forward
    (``loader.micro_batches``; ``potluck.fit_backward`` lowers it when a micro-batch
    runs out of memory; ``BalanceConfig(max_micro_batch=...)`` says the same).
    ``num_workers`` processes read the next ``prefetch`` steps' batches ahead (0: each
    is read in this process when the loop asks for it), each waited for at most
    ``read_timeout`` seconds (None: as long as it takes); every sample is read under a
    seed of its own, so its random draws do not depend on who reads it or how the step
    is split (``docs/data-parallel.md``). Other keywords go to ``DataParallel``.
    """
    if not isinstance(model, nn.Module) or isinstance(model, DataParallel):
        raise ConfigError(
            f"prepare() takes the plain model (an nn.Module), got {type(model).__name__}; "
            "pass the module itself: prepare wraps it in potluck.DataParallel"
        )
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(
            f"prepare() takes a torch.optim.Optimizer over the model's parameters, got "
            f"{type(optimizer).__name__}"
        )
    check_optimizer(model, optimizer)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"prepare() got a model ({type(model).__name__}) with no parameter "
                          "that requires a gradient: there is nothing to train or sync; set "
                          "requires_grad=True on the parameters to train before prepare()")
    global_batch = whole_number("global_batch", global_batch, "global_batch=64")
    if global_batch < 1:
        raise ConfigError(f"global_batch={global_batch!r} must be a positive int (samples "
                          "per step, all workers together), e.g. global_batch=64")
    check_arguments(dataset, collate, clip_grad_norm, shares, minimum, metrics_dir)
    check_setup(cohort, checkpoint_dir, resume, timeout, data_parallel)
    check_workers(num_workers, prefetch, read_timeout)
    seed = whole_number("seed", seed, "seed=0")
    if not isinstance(drop_last, bool):
        raise ConfigError(f"drop_last={drop_last!r} must be True or False (leave out an "
                          "epoch's last, shorter step)")
    for name in ("group", "process_group", "on_failure", "init_sync", "sync_gradients",
                 "clock", "contribution"):
        if name in data_parallel:
            raise ConfigError(f"prepare() sets DataParallel's {name}= itself (from the "
                              f"cohort, sync= and balance=); drop {name}= (or build "
                              "DataParallel yourself)")
    # Refused before joining; what potluck run --balance adds is checked after.
    given = _balance_config(False if balance is None else balance, shares, weight,
                            data_parallel)
    _check_sync(sync, balance, shares, weight, data_parallel)
    _check_trust(trust, sync, weight, data_parallel)
    # refused before joining (potluck run --balance brings no cap of its own)
    memory = _memory_cap(max_micro_batch, given, trust)
    joined = init(timeout=timeout) if cohort is None else None
    cohort = cohort or joined
    assert cohort is not None
    with _closed_on_error(joined):  # a refusal from here on leaves no cohort open
        if sync is not None and sync.fragments > 1 and (cohort.elastic or minimum is not None):
            raise ConfigError(
                f"sync=StreamingDiLoCo(fragments={sync.fragments}) on an elastic cohort (potluck "
                "run --elastic, minimum=): a member lost mid-round would leave the fragments "
                "already applied holding its samples, so the round could not be owed exactly; "
                "use DiLoCo(...) (one fragment) there, or a fixed cohort")
        if sync is not None and cohort.env.balance and balance is None:
            raise ConfigError("potluck run --balance with sync=DiLoCo(...): a round's local "
                              "steps follow each worker's speed by themselves; drop --balance")
        config = _balance_config(cohort.env.balance if balance is None else balance, shares,
                                 weight, data_parallel)
        # (not max_micro_batch: each rank's own memory cap)
        same = None if config is None else dataclasses.replace(config, max_micro_batch=None)
        agreed = signature(len(dataset), global_batch, seed, drop_last, {
            "sync": sync, "balance": same, "trust": trust, "shares": shares, "weight": weight,
            "clip_grad_norm": clip_grad_norm, "minimum": minimum,
            "DataParallel options": {k: v for k, v in data_parallel.items() if k not in PER_RANK}})
        if cohort.world_size > 1 and not cohort.joined_late:  # first: every rank then fails
            # alike below. (A joiner compares its settings with the live state's, which the
            # founders agreed on here: ``LiveState.receive``.)
            agree_everywhere(cohort.group, agreed, cohort.device)
        check_split(len(dataset), global_batch, cohort.world_size, drop_last,
                    sync.inner_steps if sync is not None else 1)
        if sync is not None and sync.split is not None:  # now, not from the loader a round in
            _check_split_plan(sync, cohort.world_size)
        model.to(cohort.device)
        if sync is not None:
            return _prepare_rounds(model, optimizer, dataset, cohort, sync,
                                   global_batch=global_batch, seed=seed,
                                   drop_last=drop_last, collate=collate,
                                   clip_grad_norm=clip_grad_norm, scaler=scaler, parts=parts,
                                   minimum=minimum, checkpoint_dir=checkpoint_dir,
                                   resume=resume, metrics_dir=metrics_dir, memory=memory,
                                   reading=(num_workers, prefetch, read_timeout),
                                   data_parallel=data_parallel, agreed=agreed)
        # Each rank's gradient weighs its part of the step, unless the user's own hook decides
        # (under trust the slice owners weigh the copies by the split; the balancer still
        # reads this rank's samples from the contribution).
        contribution = None if _weighs_itself(data_parallel) else Contribution()
        clock = ComputeClock(cohort.device) if config else None

        def samples() -> tuple[int, int] | None:  # this rank's and the step's, last handed out
            split = loader.split
            return (split[cohort.rank], sum(split)) if cohort.rank < len(split) else None

        observer = observer_for(cohort, lambda: wrapped.reducer.last_pass, samples=samples,
                                inner=clock, metrics_dir=metrics_dir)
        if trust is not None and trust.spot_check is not None and config:
            raise ConfigError("trust=Trust(spot_check=...) with balancing (balance= or potluck "
                              "run --balance): a spot check recomputes a rank's gradient on its "
                              "whole part in one pass, which micro-batches would not match; "
                              "drop one of them")
        guard = _trust_part(trust, cohort, model, lambda: loader.split,
                            lambda rank: loader.part_of(rank),
                            lambda: wrapped.reducer.last_pass) if trust else None
        if guard is not None:
            data_parallel = {**data_parallel, "comm_hook": guard.exchange}
        wrapped = DataParallel(model, group=cohort.group,
                               on_failure="abandon" if cohort.elastic else "raise",
                               init_sync=not cohort.joined_late, contribution=contribution,
                               clock=observer, **data_parallel)
        # A finiteness vote only under a custom hook: the built-in all-reduce hooks give
        # every rank the same bits. Under trust none either: every rank holds the same
        # aggregates (an owner that hands some ranks others is caught by the digests), so
        # each decides alike alone; and a vote is a collective one rank decides (MAX): an
        # attacker voting "not finite" every step would stall the cohort.
        guarded = GuardedOptimizer(optimizer, clip_grad_norm=clip_grad_norm, scaler=scaler,
                                   group=cohort.group, recoverable=cohort.elastic,
                                   agree=(lambda: not wrapped.reducer.agreed_result)
                                   if guard is None else False)
        cursor = DataCursor(len(dataset), global_batch, seed=seed, drop_last=drop_last)
        balancer = (Balancer(cohort, global_batch, contribution, clock, config, memory,
                             lambda: sum(loader.split))
                    if config and contribution and clock else None)
        policy = balancer or shares or EqualShares()
        transaction = StepTransaction(guarded, wrapped, cohort, cursor,
                                      parts=(policy, *parts, *([guard] if guard else [])),
                                      minimum=minimum,
                                      checkpoint_dir=checkpoint_dir, resume=resume,
                                      observer=observer, handed=lambda: loader.batches,
                                      settings=agreed)
        loader = StepLoader(dataset, cursor, lambda: (cohort.rank, cohort.world_size),
                            collate=collate, shares=policy.shares,
                            stop=lambda: transaction.left,
                            contribution=contribution.set if contribution else None,
                            weight=weight, memory=memory, redone=lambda: transaction.redone,
                            workers=num_workers, prefetch=prefetch,
                            read_timeout=read_timeout, place=_placer(cohort.device),
                            sitting_out=_untrusted(guard) if guard and not cohort.elastic else None)
        return wrapped, transaction, loader


@contextlib.contextmanager
def _closed_on_error(joined: Cohort | None) -> Iterator[None]:
    """Close the cohort ``prepare`` joined itself if it fails after joining: a refused
    setup leaves no group, store or port behind (one the caller passed stays theirs)."""
    try:
        yield
    except BaseException:
        if joined is not None:
            joined.close()
        raise


def _trust_part(trust: Trust, cohort: Cohort, module: nn.Module,
                samples: Callable[[], Sequence[int] | None], part_of: Callable[[int], Any],
                synced: Callable[[], object]) -> TrustPart:
    """Trust's step part (trust is imported only when ``trust=`` is given)."""
    from potluck.trust import TrustPart

    return TrustPart(trust, cohort, module, samples, part_of, synced)


def _check_split_plan(sync: DiLoCo, world_size: int) -> None:
    """Plan a round with ``sync.split`` now, so a bad split fails here, not a round in."""
    from potluck.sync.round_plan import plan_round

    plan_round([None] * world_size, sync.inner_steps, split=sync.split)


def _untrusted(guard: TrustPart) -> Callable[[int], list[int]]:
    """On a fixed cohort a quarantined rank stays in the group: the others train its
    part of each step (an elastic cohort removes it at the step's boundary)."""
    return lambda world_size: sorted(set(range(world_size)) - set(guard.trusted(world_size)))


def _memory_cap(given: int | None, config: BalanceConfig | None,
                trust: Trust | None) -> MemoryCap:
    """This rank's memory cap: ``prepare(max_micro_batch=)`` or the balancing's; none
    under trust's spot checks, which recompute a rank's part in one pass (with
    BatchNorm, micro-batches do not give that pass's gradient)."""
    balancing = config.max_micro_batch if config else None
    if given is not None and balancing is not None and given != balancing:
        raise ConfigError(f"prepare(max_micro_batch={given}) and BalanceConfig("
                          f"max_micro_batch={balancing}) disagree: give this rank's cap once")
    whole = ("trust=Trust(spot_check=...) recomputes a rank's part in one pass, which "
             "micro-batches need not match (BatchNorm's statistics are per micro-batch)"
             if trust is not None and trust.spot_check is not None else None)
    return MemoryCap(given if given is not None else balancing, whole=whole)


def _balance_config(balance: bool | BalanceConfig, shares: SharePolicy | None,
                    weight: Callable[[Any], float] | None,
                    data_parallel: dict[str, Any]) -> BalanceConfig | None:
    """The balancing asked for, or None; refuses what cannot go together."""
    if not isinstance(balance, (bool, BalanceConfig)):
        raise ConfigError(f"balance={balance!r}: pass True (shares by measured speed), "
                          "False, or a potluck.BalanceConfig(...)")
    config = BalanceConfig() if balance is True else (balance or None)
    if config and shares is not None:
        raise ConfigError("prepare() got shares= but balancing is on (balance=, or potluck "
                          "run --balance): balancing is a share policy; use one of them")
    if _weighs_itself(data_parallel) and (config or weight is not None):
        raise ConfigError(
            "prepare() got comm_hook= with balance= or weight=: those weigh each rank's "
            "gradient by its part of the step, which a custom hook would undo; drop one, "
            "or use a summing hook (potluck.compress.CompressedSum) that keeps the weights")
    if weight is not None and not callable(weight):
        raise ConfigError(f"weight={weight!r} must be a function of the batch returning "
                          "its units, e.g. weight=lambda batch: int(batch['mask'].sum())")
    return config


def _check_sync(sync: DiLoCo | None, balance: bool | BalanceConfig | None,
                shares: SharePolicy | None, weight: Callable[[Any], float] | None,
                data_parallel: dict[str, Any]) -> None:
    """Refuse what cannot go with a sync strategy (before joining)."""
    if sync is None:
        return
    from potluck.sync import DiLoCo

    if not isinstance(sync, DiLoCo):
        raise ConfigError(f"sync={sync!r}: pass potluck.DiLoCo(inner_steps=H, ...) or "
                          "potluck.LocalSGD(H); leave it out to average gradients every step")
    clash = [name for name, given in (("balance=", balance), ("shares=", shares),
                                      ("weight=", weight)) if given]
    clash += ["comm_hook="] if "comm_hook" in data_parallel else []
    if clash:
        raise ConfigError(
            f"prepare() got sync=DiLoCo(...) with {', '.join(clash)}: a round's local steps "
            "follow each worker's measured speed by themselves (DiLoCo(adaptive=True) or "
            "split=...), and pseudo-gradients travel by DiLoCo(codec=...); drop "
            f"{', '.join(clash)}")


def _check_trust(trust: Trust | None, sync: DiLoCo | None,
                 weight: Callable[[Any], float] | None, data_parallel: dict[str, Any]) -> None:
    """Refuse what cannot go with trust (before joining)."""
    if trust is None:
        return
    from potluck.trust import Trust

    if not isinstance(trust, Trust):
        raise ConfigError(f"trust={trust!r}: pass potluck.Trust() (or Trust(aggregator=...,"
                          " ...)); leave it out to average gradients plainly")
    clash = [name for name, given in (("sync=", sync), ("weight=", weight)) if given]
    clash += ["comm_hook="] if "comm_hook" in data_parallel else []
    if clash:
        raise ConfigError(
            f"prepare() got trust=Trust(...) with {', '.join(clash)}: trust aggregates each "
            "step's gradients itself (its own communication hook), weighing each rank by "
            "its assigned samples; it does not yet check DiLoCo's pseudo-gradients or "
            f"token weights (docs/trust.md); drop {', '.join(clash)}")


def _prepare_rounds(model: nn.Module, optimizer: torch.optim.Optimizer, dataset: Any,
                    cohort: Cohort, sync: DiLoCo, *, global_batch: int, seed: int,
                    drop_last: bool, collate: Callable[[list[Any]], Any] | None,
                    clip_grad_norm: float | None, scaler: torch.amp.GradScaler | None,
                    parts: Sequence[StepPart], minimum: MinimumSize | None,
                    checkpoint_dir: str | Path | None, resume: bool,
                    metrics_dir: str | Path | None, memory: MemoryCap,
                    reading: tuple[int, int, float | None], data_parallel: dict[str, Any],
                    agreed: dict[str, int | str]
                    ) -> tuple[DataParallel, StepTransaction, StepLoader]:
    """``prepare`` under a sync strategy: local backward and inner steps, a cursor whose
    step is a round of ``inner_steps`` global batches, the strategy as share policy."""
    from potluck.sync import DiLoCoSync

    observer = observer_for(cohort, lambda: wrapped.reducer.last_pass,
                            metrics_dir=metrics_dir)
    wrapped = DataParallel(model, group=cohort.group, init_sync=not cohort.joined_late,
                           sync_gradients=False, clock=observer, **data_parallel)
    guarded = GuardedOptimizer(optimizer, clip_grad_norm=clip_grad_norm, scaler=scaler,
                               group=cohort.group, agree=False)
    cursor = DataCursor(len(dataset), sync.inner_steps * global_batch, seed=seed,
                        drop_last=drop_last)
    strategy = DiLoCoSync(sync, model, cohort.group, global_batch, cohort.device,
                          on_lost=cohort.mark_step_failed if cohort.elastic else None)
    transaction = StepTransaction(guarded, wrapped, cohort, cursor, parts=(strategy, *parts),
                                  minimum=minimum, checkpoint_dir=checkpoint_dir,
                                  resume=resume, observer=observer,
                                  handed=lambda: loader.batches, settings=agreed)
    loader = StepLoader(dataset, cursor, lambda: (cohort.rank, cohort.world_size),
                        collate=collate, shares=strategy.shares,
                        stop=lambda: transaction.left, inner_steps=strategy.inner_steps,
                        segments=strategy.segments, memory=memory,
                        redone=lambda: transaction.redone, workers=reading[0],
                        prefetch=reading[1], read_timeout=reading[2],
                        place=_placer(cohort.device))
    return wrapped, transaction, loader


# DataParallel's options that name this rank's own device: they differ between ranks.
PER_RANK = frozenset({"device_ids", "output_device"})


def _weighs_itself(data_parallel: dict[str, Any]) -> bool:
    """A user's hook that does its own weighting (not a summing hook: those keep ours)."""
    return "comm_hook" in data_parallel and not sums_prescaled(data_parallel["comm_hook"])


def _placer(device: torch.device) -> Callable[[Any], Any] | None:
    """What moves a batch, once read (in this process), to the cohort's device."""
    if device.type == "cpu":
        return None
    return lambda batch: _to(batch, device)


def _to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        moved = [_to(o, device) for o in obj]  # (a namedtuple takes them one by one)
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj
