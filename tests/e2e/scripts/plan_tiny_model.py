"""A tiny model for ``potluck plan --calibrate --model plan_tiny_model:tiny``."""

import torch


def tiny() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))
    return model, torch.randn(32)
