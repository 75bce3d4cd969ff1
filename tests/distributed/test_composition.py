"""Every mode of ``potluck.prepare`` with every other: the composition matrix.

A cell is a choice on each concern: membership (fixed, elastic), how replicas are
reconciled (every step, every step through a codec, DiLoCo rounds, Streaming DiLoCo),
how a step is split (equal, balanced by measured speed: speed-planned rounds under
DiLoCo) and how copies are aggregated (the mean, trust, trust with spot checks). Each
cell the table allows runs a short job of 3 ranks on a float64 MLP (the elastic cells
with one rank SIGKILLed mid-run and a fresh worker joining in its place) and checks
what it promises: it completes, every sample of every epoch is trained exactly once,
the replicas are equal (under Streaming DiLoCo, which mixes the global model into each
replica, the global models), and where the result is defined exactly (every step
without a codec) it equals one process on the same global batches within float64
round-off (with trust, whose CenteredClip may clip an honest copy, within 1e-6).
The cells the table refuses are listed with their reasons; the list is pinned, so a
row that starts or stops refusing shows here.
"""

from __future__ import annotations

import itertools
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.testing import (
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    free_port,
    hosted_store,
    join,
    join_elastic,
    run_ranks,
)

SAMPLES, GLOBAL_BATCH, EPOCHS, ROUND = 48, 12, 2, 2
VICTIM, KILL_AT = 2, 2  # the elastic cells' victim, and the step (round) it dies in
EXACT = {"rtol": 1e-9, "atol": 1e-12}  # float64: only the summation order differs
# Trust's CenteredClip clips an honest copy that lies far from the others: the aggregate
# is then near the mean, not on it (here within 1e-8; a part left out would be ~1e-2).
CLIPPED = {"rtol": 1e-6, "atol": 1e-6}


@dataclass(frozen=True)
class Cell:
    membership: str  # fixed | elastic
    reconcile: str  # every step | codec | rounds | streaming
    split: str  # equal | balanced
    aggregate: str  # mean | robust | spot checks

    @property
    def name(self) -> str:
        return f"{self.membership}, {self.reconcile}, {self.split}, {self.aggregate}"

    @property
    def id(self) -> str:
        return self.name.replace(", ", "-").replace(" ", "_")

    @property
    def rounds(self) -> bool:
        return self.reconcile in ("rounds", "streaming")

    @property
    def exact(self) -> bool:
        """Whether the result is one process's on the same global batches. Not under
        trust with balancing: shares follow timing, and CenteredClip clips an honest
        copy of a small part more often (1e-3 off the mean was seen)."""
        return self.reconcile == "every step" and (
            self.aggregate == "mean" or self.split == "equal")

    @property
    def tolerance(self) -> dict[str, float]:
        return EXACT if self.aggregate == "mean" else CLIPPED

    def prepare_kwargs(self) -> dict[str, Any]:
        from potluck import DiLoCo, StreamingDiLoCo, Trust
        from potluck.compress import CompressedSum, Int8Blockwise
        from potluck.trust import SpotCheck

        kwargs: dict[str, Any] = {"balance": self.split == "balanced" or None}
        planned = self.split == "balanced"  # speed-planned rounds
        if self.reconcile == "rounds":
            kwargs["sync"] = DiLoCo(ROUND, adaptive=planned, measure=0.5, min_gain=0.0)
        elif self.reconcile == "streaming":
            kwargs["sync"] = StreamingDiLoCo(ROUND, 2, adaptive=planned, measure=0.5,
                                             min_gain=0.0)
        elif self.reconcile == "codec":
            kwargs["comm_hook"] = CompressedSum(Int8Blockwise())
        if self.aggregate == "robust":
            kwargs["trust"] = Trust()
        elif self.aggregate == "spot checks":
            kwargs["trust"] = Trust(spot_check=SpotCheck(_loss, every=2))
        return kwargs


CELLS = [Cell(*values) for values in itertools.product(
    ("fixed", "elastic"), ("every step", "codec", "rounds", "streaming"),
    ("equal", "balanced"), ("mean", "robust", "spot checks"))]

# What the table refuses today, and why (the message's reason): pinned. Every cell of
# the matrix composes (spot checks under rounds are the spot re-run).
REFUSED: dict[str, str] = {}


def _loss(model: Any, batch: Any) -> torch.Tensor:
    _, x, y = batch
    return ((model(x) - y) ** 2).mean()


class _Indexed(torch.utils.data.Dataset[Any]):
    """``(index, x, y)`` in float64: the index is what the ledger records."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1000)
        self.x = torch.randn(SAMPLES, 8, generator=gen, dtype=torch.float64)
        self.y = torch.randn(SAMPLES, 4, generator=gen, dtype=torch.float64)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, dtype=torch.float64), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4, dtype=torch.float64))


def _train(cohort: Any, cell: Cell, ledger: Path, at_step: Any = None) -> dict[str, Any]:
    """The cell's job on ``cohort``: every committed step's (round's) samples go to
    ``ledger`` at once; ``at_step(steps, cohort)`` runs before each batch's work."""
    from potluck import prepare

    net = _net()
    model, opt, loader = prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                 _Indexed(), global_batch=GLOBAL_BATCH, seed=5, cohort=cohort,
                                 **cell.prepare_kwargs())
    pending: list[int] = []
    with SampleLedger(ledger) as out:
        while loader.epoch < EPOCHS and not opt.left:
            for batch in loader:
                if at_step is not None:
                    at_step(opt.steps, cohort)
                epoch, commits = loader.epoch, opt.progress.steps
                opt.zero_grad()
                _loss(model, batch).backward()
                result = opt.step()
                pending += batch[0].tolist() if result.committed else []
                if opt.progress.steps > commits:  # the step (round) committed
                    out.record(epoch, pending)
                    pending = []
                elif result.failed:
                    pending = []  # the step is redone
    names = [n for n, _ in model.module.named_parameters()]
    if cell.reconcile == "streaming":  # each replica mixes the global model into its own
        from potluck.sync import DiLoCoSync

        strategy = opt.part(DiLoCoSync)
        assert strategy is not None
        return dict(zip(names, strategy.state_dict()["global"], strict=True))
    return {n: p.detach().clone() for n, p in model.module.named_parameters()}


def _fixed(rank: int, world_size: int, port: int, cells: list[Cell],
           ledgers: str) -> dict[str, Any]:
    cohort = join(rank, world_size, port)
    try:
        return {cell.name: _train(cohort, cell, Path(ledgers, cell.name, f"rank{rank}.jsonl"))
                for cell in cells}
    finally:
        cohort.close()


def _elastic(rank: int, world_size: int, port: int, cell: Cell, ledgers: str) -> Any:
    """Ranks 0-2 found the cohort; rank 2 dies at step ``KILL_AT``; rank 3, the restart,
    joins once it is dead and is admitted at the next boundary."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    if rank == 3:
        store.wait(["killed"])
    cohort = join_elastic(f"worker-{rank}", port, expected=3, timeout=20.0)
    waited = {"done": False}

    def at_step(steps: int, cohort: Any) -> None:
        if rank == VICTIM and steps == KILL_AT:
            store.set("killed", "1")
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and steps >= KILL_AT + 1 and not waited["done"]:
            _wait_for_joiner(cohort)  # so the restart trains before the job ends
            waited["done"] = True

    try:
        return _train(cohort, cell, Path(ledgers, f"rank{rank}.jsonl"), at_step)
    finally:
        cohort.close()


def _wait_for_joiner(cohort: Any, limit: float = 60.0) -> None:
    """Until the restart was admitted, or asks to be (at the next boundary)."""
    import time

    deadline = time.monotonic() + limit
    while cohort.world_size < 3 and not cohort.pending_joiners():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no worker asked to join within {limit:g} s")
        time.sleep(0.02)


def _one_process() -> dict[str, torch.Tensor]:
    """The reference: one process, the same global batches, plain SGD."""
    from potluck.data import DataCursor

    net, data = _net(), _Indexed()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    cursor = DataCursor(SAMPLES, GLOBAL_BATCH, seed=5)
    for _ in range(EPOCHS * SAMPLES // GLOBAL_BATCH):
        idx = cursor.global_indices()
        opt.zero_grad()
        _loss(net, (idx, data.x[idx], data.y[idx])).backward()
        opt.step()
        cursor.commit()
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def _refusal(cell: Cell) -> str | None:
    """The table's refusal of ``cell`` (its message), or None."""
    from potluck.compose.parts import choose
    from potluck.errors import ConfigError

    kwargs = cell.prepare_kwargs()
    try:
        choose(sync=kwargs.get("sync"), balance=kwargs["balance"], launcher_balance=False,
               shares=None, weight=None, trust=kwargs.get("trust"),
               elastic=cell.membership == "elastic", max_micro_batch=None,
               data_parallel={k: v for k, v in kwargs.items() if k == "comm_hook"})
    except ConfigError as refused:
        return str(refused)
    return None


def _problems(cell: Cell, replicas: list[Any], ledgers: Path) -> list[str]:
    """What ``cell``'s run broke of its promises (empty: none)."""
    problems = []
    reference = _one_process() if cell.exact else None
    for check in (lambda: assert_exactly_once(ledgers, SAMPLES, EPOCHS),
                  lambda: assert_replicas_equal(replicas, reference=reference,
                                                **cell.tolerance)):
        try:
            check()
        except AssertionError as broken:
            problems.append(f"{cell.name}: {broken}")
    return problems


def test_the_table_refuses_only_the_pinned_cells() -> None:
    """Each cell the table refuses is pinned here with its reason; the rest compose."""
    refused = {cell.name: _refusal(cell) for cell in CELLS}
    refused = {name: why for name, why in refused.items() if why is not None}
    assert set(refused) == set(REFUSED), sorted(set(refused) ^ set(REFUSED))
    for name, why in refused.items():
        assert REFUSED[name] in why, (name, why)


@pytest.mark.timeout(240)
def test_every_fixed_cell_completes_once_and_equal(tmp_path: Path) -> None:
    cells = [c for c in CELLS if c.membership == "fixed" and c.name not in REFUSED]
    results = run_ranks(_fixed, 3, free_port(), cells, str(tmp_path), init_group=False,
                        timeout=220)
    problems = [p for cell in cells
                for p in _problems(cell, [r[cell.name] for r in results], tmp_path / cell.name)]
    assert not problems, "\n".join(problems)


ELASTIC = [c for c in CELLS if c.membership == "elastic" and c.name not in REFUSED]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", ELASTIC, ids=[c.id for c in ELASTIC])
def test_an_elastic_cell_loses_a_rank_takes_a_restart_and_trains_each_sample_once(
        tmp_path: Path, cell: Cell) -> None:
    with hosted_store() as (port, _):
        results = run_ranks(_elastic, 4, port, cell, str(tmp_path), init_group=False,
                            may_die={VICTIM}, timeout=100)
    assert results[VICTIM] is None and results[3] is not None  # dead, and its restart done
    problems = _problems(cell, [r for r in results if r is not None], tmp_path)
    assert not problems, "\n".join(problems)


class _Masked(torch.utils.data.Dataset[Any]):
    """``(index, x, y, mask)``: sample i has ``1 + i % 4`` of its 4 outputs real."""

    def __init__(self) -> None:
        self.data = _Indexed()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
        mask = (torch.arange(4) <= i % 4).to(torch.float64)
        return (*self.data[i], mask)


def _token_loss(model: Any, batch: Any) -> torch.Tensor:
    """The mean over the batch's real outputs (its units), as ``weight=`` asks."""
    _, x, y, mask = batch
    return (((model(x) - y) ** 2) * mask).sum() / mask.sum()


def _units(batch: Any) -> float:
    return float(batch[3].sum())


def _tokens(rank: int, world_size: int, port: int, trust: bool,
            balance: bool) -> dict[str, torch.Tensor]:
    from potluck import Trust, prepare

    cohort = join(rank, world_size, port)
    try:
        net = _net()
        model, opt, loader = prepare(
            net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), _Masked(),
            global_batch=GLOBAL_BATCH, seed=5, cohort=cohort, weight=_units,
            trust=Trust() if trust else None, balance=balance)
        while loader.epoch < EPOCHS:
            for batch in loader:
                opt.zero_grad()
                _token_loss(model, batch).backward()
                opt.step()
        return {n: p.detach().clone() for n, p in model.module.named_parameters()}
    finally:
        cohort.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("trust, balance", [(False, False), (False, True), (True, False)],
                         ids=["mean", "mean-balanced", "trust"])
def test_token_weights_weigh_each_rank_by_its_units_with_trust_too(
        trust: bool, balance: bool) -> None:
    """``weight=`` (real outputs as units) on 3 ranks, equal or balanced shares, equals
    one process's mean over the global batch's units; under trust each rank's copy
    weighs its units too, read from its batch by every owner (within the clipping's
    1e-6; equal shares: balanced ones follow timing, see ``Cell.exact``)."""
    from potluck.data import DataCursor

    replicas = run_ranks(_tokens, 3, free_port(), trust, balance, init_group=False,
                         timeout=100)
    net, data = _net(), _Masked()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    cursor = DataCursor(SAMPLES, GLOBAL_BATCH, seed=5)
    for _ in range(EPOCHS * SAMPLES // GLOBAL_BATCH):
        batch = torch.utils.data.default_collate([data[int(i)] for i in cursor.global_indices()])
        sgd.zero_grad()
        _token_loss(net, batch).backward()
        sgd.step()
        cursor.commit()
    reference = {n: p.detach().clone() for n, p in net.named_parameters()}
    assert_replicas_equal(replicas, reference=reference, **(CLIPPED if trust else EXACT))
