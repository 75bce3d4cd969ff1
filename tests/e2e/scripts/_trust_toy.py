"""The trust scripts' job: a small regression, the same data and model on every worker
(imported by ``trust_attacker.py`` and ``trust_joiner.py``, beside it)."""

from __future__ import annotations

import torch


def toy_job() -> tuple[torch.utils.data.TensorDataset, torch.nn.Module]:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 8, generator=gen)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return data, net
