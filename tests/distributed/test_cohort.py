"""potluck.init() and Cohort: single process, rank-0-hosted store, DataParallel on it."""

from __future__ import annotations

import time

import pytest
import torch

import potluck
from potluck.env import WorkerEnv
from potluck.errors import ConfigError, RendezvousError
from potluck.harness.ranks import free_port, run_ranks


def test_without_launcher_variables_is_one_process() -> None:
    with potluck.init(env=WorkerEnv()) as cohort:
        assert (cohort.rank, cohort.world_size, cohort.generation) == (0, 1, 0)
        assert cohort.backend == "gloo" and cohort.device == torch.device("cpu")
        assert cohort.group.size() == 1
        cohort.barrier()
    with pytest.raises(ConfigError, match="closed"):
        cohort.group.size()  # the handle outlives the cohort; its group does not


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="backend='mpi'"):
        potluck.init(backend="mpi", env=WorkerEnv())
    with pytest.raises(ConfigError, match="timeout=0"):
        potluck.init(timeout=0, env=WorkerEnv())


@pytest.mark.timeout(30)
def test_unreachable_store_names_address_and_fix() -> None:
    port = free_port()  # nobody listens here
    env = WorkerEnv(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port,
                    agent_store=True)
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}") as info:
        potluck.init(timeout=1.0, env=env)
    assert "MASTER_ADDR/MASTER_PORT" in str(info.value)
    assert time.monotonic() - started < 15


def _train(rank: int, world_size: int, port: int) -> dict[str, torch.Tensor]:
    env = WorkerEnv(rank=rank, world_size=world_size, local_rank=rank,
                    local_world_size=world_size, master_addr="127.0.0.1", master_port=port)
    with potluck.init(timeout=20, env=env) as cohort:  # no agent: rank 0 hosts the store
        model = _model()
        ddp = potluck.DataParallel(model, group=cohort.group)
        _steps(ddp, cohort.rank, cohort.world_size)
        cohort.barrier()
        return {k: v.clone() for k, v in model.state_dict().items()}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _steps(model: torch.nn.Module, rank: int, world_size: int) -> None:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(48, 4, generator=gen), torch.randn(48, 1, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    local = 12 // world_size
    for step in range(4):
        start = step * 12 + rank * local
        loss = torch.nn.functional.mse_loss(model(x[start:start + local]),
                                            y[start:start + local])
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.timeout(60)
def test_data_parallel_on_cohort_group_equals_one_process() -> None:
    results = run_ranks(_train, 2, free_port(), timeout=50, init_group=False)
    reference = _model()
    _steps(reference, 0, 1)
    for params in results:
        for key, value in reference.state_dict().items():
            assert torch.allclose(params[key], value, atol=1e-6), key
