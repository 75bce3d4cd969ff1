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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from potluck.balance import BalanceConfig
from potluck.cohort import Cohort, init
from potluck.compose.parts import (
    aggregator,
    choose,
    reconciler,
    share_policy,
    steward,
    untrusted,
)
from potluck.data import DataCursor
from potluck.data.handout import Handout
from potluck.data.step_loader import StepLoader, check_workers
from potluck.env import read_worker_env
from potluck.metrics.observing import observer_for
from potluck.prepare_checks import agree, check_arguments, check_call, check_setup
from potluck.reducer import DataParallel
from potluck.reducer.clock import ComputeClock
from potluck.reducer.contribution import Contribution
from potluck.step.guard import GuardedOptimizer
from potluck.step.minimum import MinimumSize
from potluck.step.parts import SharePolicy, StepPart
from potluck.step.transaction import StepTransaction

# Imported where they are asked for (sync=, trust=): a plain prepare loads neither the
# sync strategies nor trust, nor the codecs they use.
if TYPE_CHECKING:
    from potluck.sync import DiLoCo
    from potluck.trust import Trust


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
    quarantines workers caught sending bad ones (``docs/trust.md``; with
    ``comm_hook=CompressedSum(codec)`` the copies travel through the codec). What cannot
    go together is one table (``potluck.compose.table``; ``docs/design.md``).
    ``max_micro_batch`` is this rank's memory cap, samples per forward
    (``loader.micro_batches``; ``potluck.fit_backward`` lowers it when a micro-batch
    runs out of memory; ``BalanceConfig(max_micro_batch=...)`` says the same).
    ``num_workers`` processes read the next ``prefetch`` steps' batches ahead (0: each
    is read in this process when the loop asks for it), each waited for at most
    ``read_timeout`` seconds (None: as long as it takes); every sample is read under a
    seed of its own, so its random draws do not depend on who reads it or how the step
    is split (``docs/data-parallel.md``). Other keywords go to ``DataParallel``.
    """
    global_batch, seed = check_call(model, optimizer, dataset, global_batch, seed, drop_last,
                                    data_parallel)
    check_arguments(dataset, collate, clip_grad_norm, shares, minimum, metrics_dir)
    check_setup(cohort, checkpoint_dir, resume, timeout, data_parallel)
    check_workers(num_workers, prefetch, read_timeout)
    env = cohort.env if cohort is not None else read_worker_env()
    choice = choose(sync=sync, balance=balance, launcher_balance=env.balance, shares=shares,
                    weight=weight, trust=trust, max_micro_batch=max_micro_batch,
                    elastic=minimum is not None or (cohort.elastic if cohort else env.elastic),
                    data_parallel=data_parallel)
    joined = init(timeout=timeout) if cohort is None else None
    cohort = cohort or joined
    assert cohort is not None
    with _closed_on_error(joined):  # a refusal from here on leaves no cohort open
        rounds = sync.inner_steps if sync is not None else 1
        agreed = agree(cohort, len(dataset), global_batch, seed, drop_last, rounds, {
            "sync": sync, "balance": choice.agreed_balance, "trust": trust, "shares": shares,
            "weight": weight, "clip_grad_norm": clip_grad_norm, "minimum": minimum,
            "DataParallel options": {k: v for k, v in data_parallel.items() if k not in PER_RANK}})
        model.to(cohort.device)
        handout = Handout()  # what the loader, built last, hands out: read by the parts
        strategy = reconciler(choice, model, cohort, global_batch)
        # A gradient weighs its rank's part, unless the user's hook decides (or trust's owners)
        contribution = None if strategy or choice.modes.hook == "own" else Contribution()
        clock = ComputeClock(cohort.device) if choice.balance else None
        observer = observer_for(  # (the transaction hands it each step's pass)
            cohort, metrics_dir=metrics_dir, inner=clock,
            samples=(lambda: handout.samples_of(cohort.rank)) if strategy is None else None)
        wrapped = DataParallel(model, group=cohort.group,
                               on_failure="abandon" if cohort.elastic and not strategy else "raise",
                               init_sync=not cohort.joined_late, contribution=contribution,
                               sync_gradients=strategy is None, clock=observer, **data_parallel)
        guard = aggregator(trust, cohort, wrapped, handout, weight, data_parallel, strategy,
                           optimizer, clip_grad_norm)
        policy = strategy or share_policy(choice, shares, cohort, global_batch, contribution,
                                          clock, handout)
        # A finiteness vote only under a custom hook (the built-in ones give every rank the
        # same bits); none under trust (one attacker would decide it) or rounds.
        guarded = GuardedOptimizer(optimizer, clip_grad_norm=clip_grad_norm, scaler=scaler,
                                   group=cohort.group, recoverable=cohort.elastic,
                                   agree=(lambda: not wrapped.reducer.agreed_result)
                                   if guard is None and strategy is None else False)
        cursor = DataCursor(len(dataset), rounds * global_batch, seed=seed, drop_last=drop_last)
        transaction = StepTransaction(
            guarded, wrapped, cohort, cursor, minimum=minimum, checkpoint_dir=checkpoint_dir,
            parts=(policy, *parts, *([guard] if guard else []),
                   *steward(choice, cohort, observer, strategy, global_batch)),
            resume=resume, observer=observer, handed=lambda: handout.batches, settings=agreed)
        loader = StepLoader(dataset, cursor, lambda: (cohort.rank, cohort.world_size),
                            collate=collate, shares=policy.shares, handout=handout,
                            stop=lambda: transaction.left, redone=lambda: transaction.redone,
                            contribution=contribution.set if contribution else None,
                            weight=weight, memory=choice.memory,
                            inner_steps=strategy.inner_steps if strategy else None,
                            segments=strategy.segments if strategy else None,
                            workers=num_workers, prefetch=prefetch,
                            read_timeout=read_timeout, place=_placer(cohort.device),
                            sitting_out=untrusted(guard) if guard and not cohort.elastic
                            else None)
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


# DataParallel's options that name this rank's own device: they differ between ranks.
PER_RANK = frozenset({"device_ids", "output_device"})


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
