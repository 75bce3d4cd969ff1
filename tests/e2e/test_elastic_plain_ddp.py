"""``potluck run --elastic`` with an unchanged torch DDP script (no potluck calls).

Such a script never joins the elastic cohort, so one lost worker cannot rejoin the
others' process group. The launcher then does what torchrun does: it stops every worker
and restarts them all together, counting against ``--max-restarts``; with no restarts
left it exits 1 with the failure report naming the root cause.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import SCRIPTS, potluck_run

SCRIPT = str(SCRIPTS / "plain_ddp_killed.py")
# (no warm spare: it would import torch beside the workers for nothing here)
ELASTIC = ("--elastic", "--token", "s3cret-plain-ddp", "--nproc-per-node", "2",
           "--no-warm-spare")


@pytest.mark.timeout(150)
def test_a_killed_worker_restarts_the_whole_worker_set() -> None:
    result = potluck_run(*ELASTIC, "--max-restarts", "2", SCRIPT, "--die-in", "0",
                         timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("attempt 1 done") == 2, result.stdout  # both, restarted
    assert "attempt 2" not in result.stdout
    assert "never joined the elastic cohort" in result.stderr
    assert "restarting every worker together, as torchrun does (1 of 2 restarts" \
        in result.stderr
    assert "as a new member" not in result.stderr


@pytest.mark.timeout(150)
def test_with_its_restarts_spent_the_job_fails_naming_the_killed_worker() -> None:
    result = potluck_run(*ELASTIC, "--max-restarts", "1", SCRIPT, "--die-in", "0,1",
                         timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.count("attempt 1 started") == 2, result.stdout
    assert result.stderr.count("Root cause (first observed failure):") == 2
    last = result.stderr.rpartition("Root cause (first observed failure):")[2]
    assert "killed by SIGKILL" in last, last  # the second attempt's report
    assert "--max-restarts 1 allows no more restarts of the whole worker set: the job " \
        "failed" in result.stderr
