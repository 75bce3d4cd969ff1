"""Uneven shares with the exact average, on real Gloo ranks (float64, against one process).

- Shares that change every few steps, token weights (variable-length samples) and a rank
  that splits its part into micro-batches: the parameters equal one process training on
  the same global batches with the loss averaged over all real tokens (``rtol=1e-9``:
  only the summation order differs).
- ``balance=True`` with one rank made slow (a sleep per sample in its forward): the
  shares move to the fast rank, the result still equals one process, and the plan is in
  the state a resumed run starts from.
"""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
import torch
from torch import nn

from potluck.testing import free_port, join, run_ranks
from potluck_lab.elastic_job import ElasticJob, Indexed, params, single_process
from potluck_lab.models import tiny_mlp
from tests.distributed.scripted import ScriptedShares

SAMPLES, GLOBAL_BATCH, EPOCHS, SEED = 48, 12, 2, 5


class Tokens(torch.utils.data.Dataset[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Samples of 1-4 real "tokens" (out of 4 outputs): ``(index, x, y, mask)``."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(7)
        self.x = torch.randn(SAMPLES, 8, generator=gen, dtype=torch.float64)
        self.y = torch.randn(SAMPLES, 4, generator=gen, dtype=torch.float64)
        lengths = torch.randint(1, 5, (SAMPLES,), generator=gen)
        self.mask = (torch.arange(4)[None, :] < lengths[:, None]).double()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i], self.mask[i]


def token_loss_sum(out: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (((out - y) ** 2) * mask).sum()


# shares that change every 3 steps
SHARE_PLANS = ((1.0, 2.0, 3.0), (5.0, 1.0, 1.0), (1.0, 1.0, 1.0), (2.0, 7.0, 3.0))


def _token_weighted(rank: int, world_size: int, port: int) -> dict[str, Any]:
    from potluck import accumulate, prepare

    cohort = join(rank, world_size, port)
    net = tiny_mlp()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = prepare(net, sgd, Tokens(), cohort=cohort, global_batch=GLOBAL_BATCH,
                                 seed=SEED, shares=ScriptedShares(SHARE_PLANS, every=3),
                                 weight=lambda batch: float(batch[3].sum()))
    splits = []
    while opt.cursor.epoch < EPOCHS:
        for batch in loader:
            splits.append(list(loader.split))
            tokens = float(batch[3].sum())  # the loss: the mean over this rank's tokens
            opt.zero_grad()
            for (_, x, y, mask), _weight in accumulate(model, batch, 2 if rank == 1 else 1):
                (token_loss_sum(model(x), y, mask) / tokens).backward()
            assert opt.step().committed
    cohort.close()
    return {"params": params(model.module), "splits": splits}


def _token_reference() -> dict[str, torch.Tensor]:
    from potluck.data import DataCursor

    net, data = tiny_mlp(), Tokens()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    cursor = DataCursor(SAMPLES, GLOBAL_BATCH, seed=SEED)
    for _ in range(EPOCHS * SAMPLES // GLOBAL_BATCH):
        idx = cursor.global_indices()
        sgd.zero_grad()
        loss = token_loss_sum(net(data.x[idx]), data.y[idx], data.mask[idx])
        (loss / data.mask[idx].sum()).backward()
        sgd.step()
        cursor.commit()
    return params(net)


@pytest.mark.timeout(120)
def test_changing_shares_and_token_weights_equal_one_process() -> None:
    results = run_ranks(_token_weighted, 3, free_port(), init_group=False, timeout=100)
    splits = results[0]["splits"]
    assert splits[0] == [2, 4, 6] and splits[3] == [8, 2, 2] and splits[6] == [4, 4, 4]
    expected = _token_reference()
    for result in results:
        assert result["splits"] == splits  # every rank split every step alike
        for name, value in expected.items():
            torch.testing.assert_close(result["params"][name], value, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ balance=True

BALANCED = ElasticJob(samples=96, global_batch=24, epochs=2, data_seed=SEED)
SLOW_S = 0.003  # per sample, on rank 1: about 30x the fast rank's compute
CAP = 8  # rank 0 takes its part in micro-batches of at most 8 samples


class Slow(nn.Module):
    """``inner`` with a sleep per sample: a worker whose compute is slow."""

    def __init__(self, inner: nn.Module, per_sample_s: float) -> None:
        super().__init__()
        self.inner, self.per_sample_s = inner, per_sample_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.per_sample_s * len(x))
        return self.inner(x)


def _balanced_run(cohort: Any, rank: int, state: dict[str, Any] | None) -> Any:
    from potluck import BalanceConfig, prepare

    net = Slow(tiny_mlp(), SLOW_S if rank == 1 else 0.0)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    cap = BalanceConfig(max_micro_batch=CAP if rank == 0 else None)  # rank 0's memory
    model, opt, loader = prepare(net, sgd, Indexed(BALANCED.samples), cohort=cohort,
                                 global_batch=BALANCED.global_batch,
                                 seed=BALANCED.data_seed, balance=cap)
    if state is not None:
        opt.load_state_dict(state)
    return model, opt, loader


def _epoch(model: Any, opt: Any, loader: Any) -> list[list[int]]:
    from potluck import accumulate

    splits = []
    for batch in loader:
        splits.append([*loader.split, loader.micro_batches])
        opt.zero_grad()
        for (_, x, y), weight in accumulate(model, batch, loader.micro_batches):
            (((model(x) - y) ** 2).mean() * weight).backward()
        assert opt.step().committed
    return splits


def _balanced(rank: int, world_size: int, port: int) -> dict[str, Any]:
    cohort = join(rank, world_size, port)
    model, opt, loader = _balanced_run(cohort, rank, None)
    splits = _epoch(model, opt, loader)
    saved = io.BytesIO()
    torch.save(opt.state_dict(), saved)  # a checkpoint after epoch 0
    splits += _epoch(model, opt, loader)
    # Resume from the checkpoint: the recorded shares are the first step's split.
    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    model2, opt2, loader2 = _balanced_run(cohort, rank, state)
    resumed = _epoch(model2, opt2, loader2)
    cohort.close()
    return {"params": params(model.module.inner), "resumed": params(model2.module.inner),
            "splits": splits, "resumed_splits": resumed, "recorded": state["parts"]["shares"]}


@pytest.mark.serial
@pytest.mark.timeout(120)
def test_balance_moves_samples_to_the_fast_rank_and_stays_exact() -> None:
    results = run_ranks(_balanced, 2, free_port(), init_group=False, timeout=100)
    splits = [split[:2] for split in results[0]["splits"]]
    assert splits[0] == [12, 12]  # nothing measured yet: equal
    assert splits[-1][0] >= 3 * splits[-1][1], splits  # rank 1 is about 30x slower
    # Rank 0 took each part in micro-batches under its cap; rank 1 has none.
    assert [s[2] for s in results[0]["splits"]] == [-(-s[0] // CAP) for s in splits]
    assert {s[2] for s in results[1]["splits"]} == {1}
    recorded = results[0]["recorded"]
    assert recorded["policy"] == "balanced" and recorded["counts"] is not None
    assert results[0]["resumed_splits"][0][:2] == recorded["counts"]
    expected = single_process(BALANCED)
    for result in results:
        assert [split[:2] for split in result["splits"]] == splits
        for got in (result["params"], result["resumed"]):
            for name, value in expected.items():
                torch.testing.assert_close(got[name], value, rtol=1e-9, atol=1e-12)


SLOW_UNDER_TRUST_S = 0.02  # per sample on rank 1: far above a fast rank's stalls here


def _balanced_under_trust(rank: int, world_size: int, port: int) -> list[list[int]]:
    from potluck import Trust, prepare

    cohort = join(rank, world_size, port)
    net = Slow(tiny_mlp(), SLOW_UNDER_TRUST_S if rank == 1 else 0.0)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = prepare(net, sgd, Indexed(BALANCED.samples), cohort=cohort,
                                 global_batch=BALANCED.global_batch, seed=BALANCED.data_seed,
                                 balance=True, trust=Trust())
    splits = _epoch(model, opt, loader) + _epoch(model, opt, loader)
    cohort.close()
    return [split[:3] for split in splits]


@pytest.mark.serial
@pytest.mark.timeout(120)
def test_balance_under_trust_measures_compute_not_the_hooks_wait() -> None:
    """Trust's hook waits in backward for every rank's copies: timed as compute, the
    slow rank's time showed on every rank and the shares stayed about equal. The clock
    leaves that wait out, so the slow rank's share shrinks as without trust (over the
    second epoch: one step's split can follow a fast rank's stall on a busy machine)."""
    results = run_ranks(_balanced_under_trust, 3, free_port(), init_group=False, timeout=100)
    assert all(result == results[0] for result in results)  # every rank split alike
    splits = results[0]
    assert splits[0] == [8, 8, 8]  # nothing measured yet: equal
    second = [sum(column) for column in zip(*splits[len(splits) // 2:], strict=True)]
    assert 3 * second[1] <= min(second[0], second[2]), splits  # rank 1 is 20x slower
