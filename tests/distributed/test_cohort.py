"""potluck.init() and Cohort: single process, rank-0-hosted store, DataParallel on it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import potluck
from potluck.env import WorkerEnv
from potluck.errors import ConfigError, RendezvousError
from potluck.testing import free_port, join, run_ranks


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
    with join(rank, world_size, port, timeout=20) as cohort:  # no agent: rank 0 hosts the store
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


def _gloo_threads() -> list[str]:
    """Names of this process's native Gloo threads (work loops and the transport loop).
    A thread that exits between the listing and the read of its name is gone: skipped
    (a thread still exiting, its task still listed, has its name read and counts)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # (it exited since the listing)
            continue
    return sorted(name for name in names if "gloo" in name)


def _train_then_close(rank: int, world_size: int,
                      port: int) -> tuple[list[str], list[str], str]:
    cohort = join(rank, world_size, port, timeout=20)
    ddp = potluck.DataParallel(_model(), group=cohort.group)  # holds the group from here on
    _steps(ddp, rank, world_size)
    cohort.barrier()
    before = _gloo_threads()
    cohort.close()
    after = _gloo_threads()
    try:
        ddp(torch.randn(2, 4)).sum().backward()
        afterwards = "the model communicated after close()"
    except ConfigError as exc:
        afterwards = str(exc)
    return before, after, afterwards


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="reads thread names from /proc")


@needs_proc
@pytest.mark.timeout(60)
def test_close_joins_the_group_threads_though_data_parallel_holds_the_group() -> None:
    # A Gloo thread still alive at interpreter exit can abort the process: it may free a
    # work's tensors after finalization began, and Python ends it inside a noexcept
    # destructor ("terminate called without an active exception").
    for before, after, afterwards in run_ranks(_train_then_close, 2, free_port(),
                                               timeout=50, init_group=False):
        assert "pt_gloo_runloop" in before and "gloo_tcp_loop" in before
        assert after == []
        assert "the cohort was closed" in afterwards


_FORGETS_CLOSE = textwrap.dedent("""
    import atexit, pathlib
    def gloo_threads():
        names = []
        for task in pathlib.Path("/proc/self/task").iterdir():
            try:
                names.append((task / "comm").read_text().strip())
            except FileNotFoundError:  # it exited since the listing: gone
                continue
        return sorted(n for n in names if "gloo" in n)
    # Registered before potluck is imported, so it runs after potluck's own exit hook.
    atexit.register(lambda: print("at exit:", gloo_threads(), flush=True))
    import torch, potluck
    cohort = potluck.init()
    model = potluck.DataParallel(torch.nn.Linear(4, 1), group=cohort.group)
    model(torch.randn(2, 4)).sum().backward()
    cohort.barrier()  # a collective ran on a Gloo thread, so it has its name by now
    print("end of script:", gloo_threads(), flush=True)
""")


@needs_proc
@pytest.mark.timeout(60)
def test_a_cohort_left_open_is_closed_before_the_interpreter_finalizes() -> None:
    done = subprocess.run([sys.executable, "-c", _FORGETS_CLOSE], capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    running, at_exit = done.stdout.splitlines()
    assert running.startswith("end of script:") and "'pt_gloo_runloop'" in running
    assert at_exit == "at exit: []"


def _stages(rank: int, world_size: int, port: int) -> list[float]:
    """Three cohorts one after another in one process, on a store that outlives them
    (the launcher's), each closed before the next."""
    env = WorkerEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1",
                    master_port=port, agent_store=True, run_id="stages")
    sums = []
    for stage in range(3):
        with potluck.init(timeout=20, env=env) as cohort:
            value = torch.tensor([float(rank + stage)])
            cohort.all_reduce_sum(value)
            sums.append(float(value))
    return sums


@pytest.mark.timeout(90)
def test_a_process_forms_a_new_cohort_after_closing_one() -> None:
    """A second init() after close() used to build its group under the first one's keys
    on the launcher's store: now and then Gloo read the closed group's addresses and
    failed after several timeouts, blaming the network."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, None, True, wait_for_workers=False)
    for sums in run_ranks(_stages, 2, port, init_group=False, timeout=80):
        assert sums == [1.0, 3.0, 5.0]
    keys = store.list_keys()  # type: ignore[attr-defined]
    assert all(any(key.startswith(f"potluck/stages/a0/s{k}/g0/") for key in keys)
               for k in range(3)), sorted(keys)  # a session each
