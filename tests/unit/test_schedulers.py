"""``potluck run``'s defaults from a scheduler's variables: each reader on good and bad
values, flags over schedulers, the notes where they disagree, and the CLI's use of it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping

import pytest

from potluck.errors import ConfigError
from potluck.launch import cli
from potluck.launch.schedulers import Value, resolve, summary

NOTHING: dict[str, Value | None] = {}

SRUN_NODE_1 = {  # what srun --nodes 2 --ntasks-per-node 1 gives the task on the 2nd node
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
    "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_NNODES": "2", "SLURM_NODELIST": "gpu[07-08]",
}
PYTORCHJOB_WORKER_0 = {  # Kubeflow's training operator, worker-0 of Master + 2 workers
    "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "1",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",  # (every pod has it)
}
TRAINJOB_NODE_2 = {  # Kubeflow Trainer's torch runtime: torchrun's own PET_* variables
    "PET_NNODES": "4", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "2",
    "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29400",
    "JOB_COMPLETION_INDEX": "2",
}
SKY_NODE_1 = {
    "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.6\n",
    "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-2026-12-06_task_1",
}


def values(env: Mapping[str, str], **given: Value) -> dict[str, Value | None]:
    return dict(resolve(given, env).values)


def test_no_scheduler_gives_the_built_in_defaults_and_says_nothing() -> None:
    resolved = resolve(NOTHING, {"PATH": "/usr/bin", "HOME": "/root"})
    assert dict(resolved.values) == {"nproc_per_node": "1", "nnodes": "1", "node_rank": 0,
                                     "master_addr": None, "master_port": None,
                                     "run_id": "potluck"}
    assert resolved.notes == () and summary(resolved) is None


def test_srun_one_task_per_node_gives_nodes_rank_first_host_and_job_id() -> None:
    resolved = resolve(NOTHING, SRUN_NODE_1)
    assert dict(resolved.values) == {"nproc_per_node": "1", "nnodes": "2", "node_rank": 1,
                                     "master_addr": "gpu07", "master_port": None,
                                     "run_id": "4242"}
    assert summary(resolved) == (
        "from the scheduler: --nnodes 2 (SLURM_STEP_NUM_NODES=2), --node-rank 1 "
        "(SLURM_NODEID=1), --master-addr gpu07 (first host of "
        "SLURM_STEP_NODELIST=gpu[07-08]), --run-id 4242 (SLURM_JOB_ID=4242)")


def test_srun_variables_without_the_step_ones_fall_back_to_the_job_ones() -> None:
    env = {k: v for k, v in SRUN_NODE_1.items() if not k.startswith("SLURM_STEP_NUM")
           and k != "SLURM_STEP_NODELIST"} | {"SLURM_NTASKS": "2"}
    assert values(env)["nnodes"] == "2" and values(env)["master_addr"] == "gpu07"


def test_a_batch_script_outside_srun_takes_only_the_job_id_and_says_why() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
           "SLURM_NODELIST": "n[1-2]", "SLURM_PROCID": "0"}
    resolved = resolve(NOTHING, env)
    assert resolved.values["nnodes"] == "1" and resolved.values["run_id"] == "77"
    assert resolved.values["master_addr"] is None
    assert resolved.notes == ("SLURM_NNODES=2 but potluck run is not under srun, so it runs "
                              "on this node only; to use every node: srun "
                              "--ntasks-per-node=1 potluck run ...",)


def test_srun_with_several_tasks_a_node_is_refused_with_the_fix() -> None:
    env = SRUN_NODE_1 | {"SLURM_STEP_NUM_TASKS": "4"}
    with pytest.raises(ConfigError, match=r"srun started 4 task\(s\) on 2 node\(s\) "
                       r"\(SLURM_STEP_NUM_TASKS=4, SLURM_STEP_NUM_NODES=2\).*"
                       r"srun --ntasks-per-node=1 potluck run"):
        resolve(NOTHING, env)


@pytest.mark.parametrize(("variable", "bad", "rule"), [
    ("SLURM_NODEID", "one", "whole number of at least 0"),
    ("SLURM_STEP_NUM_NODES", "0", "whole number of at least 1"),
    ("SLURM_STEP_NUM_TASKS", "2x", "whole number of at least 1"),
    ("SLURM_STEP_NODELIST", "[", "names no host"),
    ("SKYPILOT_NODE_RANK", "-1", "whole number of at least 0"),
    ("SKYPILOT_NUM_GPUS_PER_NODE", "8.0", "whole number of at least 0"),
    ("WORLD_SIZE", "two", "whole number of at least 1"),
    ("MASTER_PORT", "70000", "not a TCP port"),
    ("PET_NNODES", "1-4", "a count N or MIN:MAX"),
    ("PET_NPROC_PER_NODE", "all", "a count, or auto, gpu, cpu"),
    ("JOB_COMPLETION_INDEX", "x", "whole number of at least 0"),
])
def test_a_malformed_variable_is_refused_with_its_value_the_rule_and_the_fix(
        variable: str, bad: str, rule: str) -> None:
    base = SRUN_NODE_1 if variable.startswith("SLURM") else (
        {"KUBERNETES_SERVICE_HOST": "10.96.0.1"} if variable in ("WORLD_SIZE", "MASTER_PORT")
        else {})  # (torch's variables are read in a Kubernetes pod)
    with pytest.raises(ConfigError) as caught:
        resolve(NOTHING, base | {variable: bad})
    message = str(caught.value)
    assert f"{variable}={bad!r}" in message or f"{variable}={bad}" in message
    assert rule in message and ("pass --" in message or "srun --ntasks-per-node=1" in message)


def test_rank_not_below_the_node_count_is_refused_naming_both_variables() -> None:
    with pytest.raises(ConfigError, match="SLURM_NODEID=2 but SLURM_STEP_NUM_NODES=2"):
        resolve(NOTHING, SRUN_NODE_1 | {"SLURM_NODEID": "2"})
    with pytest.raises(ConfigError, match="SKYPILOT_NODE_RANK=2 but SKYPILOT_NUM_NODES=2"):
        resolve(NOTHING, SKY_NODE_1 | {"SKYPILOT_NODE_RANK": "2"})
    with pytest.raises(ConfigError, match="lists 3 address"):
        resolve(NOTHING, SKY_NODE_1 | {"SKYPILOT_NODE_IPS": "a\nb\nc"})


def test_an_indexed_job_gives_the_rank_and_the_count_must_come_from_the_flag() -> None:
    assert values({"JOB_COMPLETION_INDEX": "3"}, nnodes="4")["node_rank"] == 3
    with pytest.raises(ConfigError, match=r"node rank 3 \(from JOB_COMPLETION_INDEX=3\) is "
                       r"not below the node count 1 \(from --nnodes's default\)"):
        resolve(NOTHING, {"JOB_COMPLETION_INDEX": "3"})


def test_a_pytorchjob_counts_nodes_in_world_size_and_rank() -> None:
    assert values(PYTORCHJOB_WORKER_0) == {
        "nproc_per_node": "1", "nnodes": "3", "node_rank": 1, "master_addr": "job-master-0",
        "master_port": 23456, "run_id": "potluck"}


def test_a_launchers_worker_variables_are_not_read_as_a_pytorchjobs() -> None:
    worker = PYTORCHJOB_WORKER_0 | {"LOCAL_RANK": "0", "WORLD_SIZE": "8", "RANK": "5"}
    assert values(worker)["nnodes"] == "1" and values(worker)["master_addr"] is None


def test_kubeflow_trainer_pet_variables_are_torchruns_and_win_quietly_when_they_agree(
        ) -> None:
    resolved = resolve(NOTHING, TRAINJOB_NODE_2)
    assert dict(resolved.values) == {
        "nproc_per_node": "auto", "nnodes": "4", "node_rank": 2,
        "master_addr": "job-node-0-0.job", "master_port": 29400, "run_id": "potluck"}
    assert resolved.notes == ()  # JOB_COMPLETION_INDEX=2 agrees with PET_NODE_RANK=2
    assert values({"PET_NNODES": "1:4"})["nnodes"] == "1:4"


def test_skypilot_gives_count_rank_head_gpus_and_task_id() -> None:
    assert values(SKY_NODE_1) == {
        "nproc_per_node": "8", "nnodes": "2", "node_rank": 1, "master_addr": "10.0.0.5",
        "master_port": None, "run_id": "sky-2026-12-06_task_1"}
    cpu_only = SKY_NODE_1 | {"SKYPILOT_NUM_GPUS_PER_NODE": "0"}
    assert values(cpu_only)["nproc_per_node"] == "1"
    no_count = {k: v for k, v in SKY_NODE_1.items() if k != "SKYPILOT_NUM_NODES"}
    assert values(no_count)["nnodes"] == "2"


def test_flags_win_and_a_disagreeing_scheduler_is_named_once() -> None:
    resolved = resolve({"nnodes": "2", "node_rank": 1, "master_addr": "10.1.1.1",
                        "run_id": "4242"}, SRUN_NODE_1)
    assert resolved.values["master_addr"] == "10.1.1.1"
    assert resolved.origins["master_addr"] == "flag"
    assert resolved.notes == (  # nnodes, node rank and run id agree: nothing said of them
        "--master-addr 10.1.1.1 from the flag is used; first host of "
        "SLURM_STEP_NODELIST=gpu[07-08] (SLURM) said otherwise",)
    assert summary(resolved) is None  # every value the scheduler has was given


def test_two_schedulers_that_disagree_slurm_over_a_pytorchjobs_variables() -> None:
    env = SRUN_NODE_1 | {"MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "12345",
                         "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    resolved = resolve(NOTHING, env)
    assert resolved.values["master_addr"] == "gpu07"  # SLURM comes first in READERS
    assert resolved.values["master_port"] == 12345  # only the torch variable has a port
    assert resolved.notes == (
        "--master-addr gpu07 from first host of SLURM_STEP_NODELIST=gpu[07-08] is used; "
        "MASTER_ADDR=10.9.9.9 (PyTorchJob/torch) said otherwise",)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args([*argv, "train.py"])


def test_the_cli_fills_only_the_flags_not_given() -> None:
    args = _args("--nproc-per-node", "2", "--master-port", "29600")
    config = cli.config_from_args(args, cli.scheduler_flags(args, SRUN_NODE_1))
    assert (config.nproc_per_node, config.nnodes, config.node_rank) == (2, 2, 1)
    assert (config.master_addr, config.master_port, config.run_id) == ("gpu07", 29600, "4242")
    plain = cli.config_from_args(_args())  # no environment read: the defaults
    assert (plain.nnodes, plain.node_rank, plain.master_addr, plain.run_id) == (
        1, 0, "127.0.0.1", "potluck")


def test_rdzv_endpoint_and_standalone_keep_the_scheduler_out() -> None:
    args = _args("--rdzv-endpoint", "10.0.0.1:29500")
    config = cli.config_from_args(args, cli.scheduler_flags(args, PYTORCHJOB_WORKER_0))
    assert (config.master_addr, config.master_port, config.nnodes) == ("10.0.0.1", 29500, 3)
    alone = _args("--standalone")
    config = cli.config_from_args(alone, cli.scheduler_flags(alone, SRUN_NODE_1))
    assert (config.nnodes, config.master_addr, config.run_id) == (1, "127.0.0.1", "potluck")


@pytest.mark.timeout(60)
def test_reading_the_schedulers_imports_no_torch() -> None:
    code = ("import sys\n"
            "from potluck.launch import cli, schedulers\n"
            f"schedulers.resolve({{}}, {SRUN_NODE_1!r})\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_torchs_variables_outside_a_kubernetes_pod_are_no_pytorchjob() -> None:
    stale = {k: v for k, v in PYTORCHJOB_WORKER_0.items() if k != "KUBERNETES_SERVICE_HOST"}
    resolved = resolve(NOTHING, stale)  # (exported in a shell long ago)
    assert resolved.values == resolve(NOTHING, {}).values and resolved.notes == ()
