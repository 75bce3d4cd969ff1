"""``prepare(num_workers=K)`` across real Gloo ranks: training with worker processes
reading ahead is bit for bit training without them, a dataset that augments with
random draws included, per step and under DiLoCo's rounds (not adaptive: an
adaptive round's split follows measured speeds, which differ from run to run)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.testing import free_port, join, run_ranks

SIZE = 48


class Noisy(torch.utils.data.Dataset[Any]):
    """A regression sample with a random augmentation drawn at each read."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(3)
        self.x, self.y = torch.randn(SIZE, 4, generator=gen), torch.randn(SIZE, 2, generator=gen)

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(4), self.y[i]


def _train(rank: int, world_size: int, port: int, workers: int, rounds: bool) -> dict[str, Any]:
    import potluck

    cohort = join(rank, world_size, port, timeout=30.0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    rounds_of = potluck.DiLoCo(inner_steps=3, adaptive=False)
    extra: dict[str, Any] = {"sync": rounds_of} if rounds else {}
    model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                         Noisy(), global_batch=8, cohort=cohort,
                                         num_workers=workers, **extra)
    while loader.epoch < 2:
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    hits = getattr(loader.fetcher, "hits", 0)
    loader.close()
    return {"params": [p.detach().clone() for p in net.parameters()], "hits": hits,
            "steps": opt.steps}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rounds", [False, True], ids=["steps", "diloco"])
def test_training_with_loader_workers_equals_training_without(rounds: bool) -> None:
    plain = run_ranks(_train, 2, free_port(), 0, rounds, init_group=False, timeout=100)
    ahead = run_ranks(_train, 2, free_port(), 2, rounds, init_group=False, timeout=100)
    for a, b in zip(plain, ahead, strict=True):
        assert a["steps"] == b["steps"] > 0
        for p, q in zip(a["params"], b["params"], strict=True):
            assert torch.equal(p, q)
        assert b["hits"] > 0, "no batch was read ahead"
    assert not torch.equal(plain[0]["params"][0], _untrained())


def _untrained() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 8).weight.detach().clone()
