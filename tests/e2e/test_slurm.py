"""Jobs on a real single-node SLURM cluster (``tests/slurm.py``: installed with apt-get
when missing on a root Debian machine, skipped elsewhere): ``examples/slurm.sbatch`` as
a user submits it (one ``potluck run`` a node, reading srun's variables), and
``srun -n 2 python script.py`` (one task a worker, read by ``potluck.env``)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from potluck.testing import free_port
from tests import slurm
from tests.e2e.helpers import EXAMPLE, ROOT

SBATCH = ROOT / "examples" / "slurm.sbatch"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, str]]:
    why = slurm.why_no_slurm()
    if why is not None:
        pytest.skip(f"no SLURM to run jobs on: {why}")
    root = tmp_path / "slurm"
    with slurm.cluster(root, cpus=2) as env:
        if shutil.which("potluck", path=env["PATH"]) is None:
            pytest.skip(f"no `potluck` command beside {sys.executable}: pip install -e .")
        yield env


def _run(argv: list[str], env: dict[str, str], timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.timeout(400)  # a first apt-get install of slurm-wlm, then two workers
def test_the_sbatch_example_trains_on_two_workers_with_srun_s_node_and_job(
        cluster: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    env = cluster | {"NPROC_PER_NODE": "2"}
    submitted = _run(["sbatch", "--nodes=1", "--cpus-per-task=2", "--output", str(out),
                      str(SBATCH)], env)
    job = re.search(r"Submitted batch job (\d+)", submitted.stdout)
    assert job is not None, f"{submitted.stdout}{submitted.stderr}"
    state = slurm.wait_job(env, job.group(1), timeout=180)
    text = out.read_text() if out.is_file() else "(no output file)"
    assert state == ("COMPLETED", "0:0"), text
    assert ("potluck run: from the scheduler: --nnodes 1 (SLURM_STEP_NUM_NODES=1), "
            "--node-rank 0 (SLURM_NODEID=0), --master-addr localhost "
            "(first host of SLURM_STEP_NODELIST=localhost), "
            f"--run-id {job.group(1)} (SLURM_JOB_ID={job.group(1)})") in text, text
    assert re.search(r"\[rank0\]: final loss \d+\.\d+ after 20 steps on 2 rank\(s\)",
                     text), text


@pytest.mark.timeout(400)
def test_srun_one_task_per_worker_and_potluck_run_per_task_is_refused(
        cluster: dict[str, str]) -> None:
    env = cluster | {"MASTER_PORT": str(free_port())}  # else torch's 29500 on a shared host
    direct = _run(["srun", "-n", "2", sys.executable, str(EXAMPLE), "--steps", "5"], env)
    assert direct.returncode == 0, direct.stderr
    assert re.search(r"^final loss \d+\.\d+ after 5 steps on 2 rank\(s\)$", direct.stdout,
                     re.MULTILINE), direct.stdout
    doubled = _run(["srun", "-n", "2", sys.executable, "-m", "potluck", "run",
                    "--nproc-per-node", "1", str(EXAMPLE)], env)
    assert doubled.returncode != 0
    assert doubled.stderr.count("srun started 2 task(s) on 1 node(s)") == 2, doubled.stderr
    assert "srun --ntasks-per-node=1 potluck run" in doubled.stderr
