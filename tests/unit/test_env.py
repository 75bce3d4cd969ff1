"""potluck.env: parsing launcher variables, with mappings instead of os.environ."""

from __future__ import annotations

import os

import pytest

from potluck.env import WorkerEnv, first_host, read_worker_env
from potluck.errors import ConfigError

TORCHRUN = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_USE_AGENT_STORE": "True",
}


def test_no_variables_is_a_single_process() -> None:
    env = read_worker_env({})
    assert env == WorkerEnv()
    assert not env.distributed and env.master_addr is None


def test_torchrun_variables() -> None:
    env = read_worker_env(TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29400)
    assert (env.restart_count, env.run_id, env.agent_store) == (2, "job7", True)
    assert env.source == "torchrun" and env.distributed


def test_slurm_variables_and_first_host_as_master() -> None:
    env = read_worker_env({
        "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2", "SLURM_NNODES": "4", "SLURM_TASKS_PER_NODE": "2(x4)",
        "SLURM_NODELIST": "gpu[07-10],cpu1", "SLURM_JOB_ID": "991",
    })
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 2)
    assert (env.node_rank, env.num_nodes, env.run_id) == (2, 4, "991")
    assert (env.master_addr, env.master_port) == ("gpu07", 29500)
    assert env.source == "slurm" and not env.agent_store


def test_torchrun_names_win_over_slurm() -> None:
    env = read_worker_env({**TORCHRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "99"})
    assert (env.rank, env.world_size, env.source) == (3, 4, "torchrun")


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [("node1", "node1"), ("a[3-5]", "a3"), ("gpu[012,020]", "gpu012"), ("x,y", "x")],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
        ({"RANK": "4"}, "RANK=4 but WORLD_SIZE=4"),
        ({"LOCAL_RANK": "2"}, "LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2"),
        ({"WORLD_SIZE": "four"}, "WORLD_SIZE='four' is not an integer"),
        ({"RANK": "-1"}, "RANK=-1 must be at least 0"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
    ],
)
def test_bad_environment_names_the_variable(changes: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        read_worker_env({**TORCHRUN, **changes})


def test_rank_without_local_world_size_spreads_over_nodes() -> None:
    env = read_worker_env({"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h"})
    assert env.local_world_size == 4 and env.master_port == 29500


def test_the_launchers_quiet_cpp_warnings_are_its_own_not_its_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from potluck import env

    monkeypatch.setenv(env.CPP_LOG_LEVEL, "")  # (so that monkeypatch restores it)
    monkeypatch.delenv(env.CPP_LOG_LEVEL)
    monkeypatch.setattr(env, "_QUIETED", [])
    env.quiet_cpp_warnings()
    assert os.environ[env.CPP_LOG_LEVEL] == "ERROR"
    assert env.CPP_LOG_LEVEL not in env.environ_copy()  # the workers get the user's setting
    monkeypatch.setenv(env.CPP_LOG_LEVEL, "INFO")
    monkeypatch.setattr(env, "_QUIETED", [])
    env.quiet_cpp_warnings()  # the user's own setting stands, for both
    assert os.environ[env.CPP_LOG_LEVEL] == "INFO"
    assert env.environ_copy()[env.CPP_LOG_LEVEL] == "INFO"
