"""Small deterministic models and data shared by the multi-process tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from potluck_lab.models import tiny_mlp

GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4
mlp = tiny_mlp  # 8 -> 32 -> 32 -> 4, float64 unless asked


class Branchy(nn.Module):
    """Data-dependent control flow: ``left`` or ``right`` per call, ``never`` never."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.left = nn.Linear(16, 4)
        self.right = nn.Linear(16, 4)
        self.never = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, branch: str) -> torch.Tensor:
        h = torch.tanh(self.stem(x))
        return self.left(h) if branch == "left" else self.right(h)


def branchy(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Branchy().double()


def batchnorm_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4)).double()


def batch(step: int, size: int = GLOBAL_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 8, generator=gen, dtype=torch.float64)
    y = torch.randn(size, 4, generator=gen, dtype=torch.float64)
    return x, y


def shard(tensor: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    per = tensor.shape[0] // world_size
    return tensor[rank * per : (rank + 1) * per]


def grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().clone()
            for n, p in module.named_parameters()}


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


TOL = {"rtol": 1e-9, "atol": 1e-12}


def assert_close(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        if expected[name] is None:
            assert actual[name] is None, f"{name}: expected None, got a gradient"
        else:
            assert actual[name] is not None, f"{name}: expected a gradient, got None"
            torch.testing.assert_close(actual[name], expected[name], **TOL, msg=name)


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((out - y) ** 2).mean()
