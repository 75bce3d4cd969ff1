"""``potluck.init(device=...)``: what it accepts, and a clear refusal otherwise."""

from __future__ import annotations

import pytest
import torch

import potluck
from potluck.env import WorkerEnv
from potluck.errors import ConfigError


def test_a_gloo_cohort_stays_on_the_cpu_by_default_or_when_asked() -> None:
    for device in (None, "cpu"):
        cohort = potluck.init(env=WorkerEnv(), backend="gloo", device=device)
        try:
            assert cohort.device == torch.device("cpu")
        finally:
            cohort.close()


@pytest.mark.parametrize("bad", ["gpu", "cuda:0", "mps"])
def test_an_unknown_device_is_refused_with_the_choices(bad: str) -> None:
    with pytest.raises(ConfigError, match=rf"init\(device='{bad}'\): pass 'cuda'"):
        potluck.init(env=WorkerEnv(), backend="gloo", device=bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_without_a_cuda_device_is_refused() -> None:
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        potluck.init(env=WorkerEnv(), backend="gloo", device="cuda")
