"""``potluck run --elastic``: a worker SIGKILLed mid-run is restarted and rejoins.

The other workers redo the step without it (nothing lost, nothing trained twice); the
launcher restarts it as a new member; it is admitted at a step boundary with the live
state. Every step trains on the same global batch (equal shares, mean loss), so the
final parameters equal one process training on the same global batches, up to
floating-point summation order (float64: 1e-9 relative).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from potluck.testing import free_port
from tests.e2e.helpers import (
    EPOCHS,
    ROOT,
    SCRIPT,
    assert_equal_to_one_process,
    kill_leftovers,
    one_process,
    pid_alive,
    potluck_run,
)


@pytest.mark.timeout(150)
def test_killed_worker_is_restarted_and_rejoins_with_live_state(tmp_path: Path) -> None:
    # --min-workers 3: the two survivors wait for the restarted worker (however slow it
    # is to start on a loaded machine) instead of finishing the run without it.
    out, epochs = tmp_path / "final.pt", EPOCHS
    result = potluck_run("--nproc-per-node", "3", "--elastic", "--max-restarts", "1",
                         "--min-workers", "3", "--token", "s3cret-token", str(SCRIPT),
                         "--epochs", str(epochs),
                         "--fail-at", "4", "--step-time", "0.05", "--out", str(out),
                         timeout=140)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "a worker was lost (elastic: the cohort goes on)" in result.stderr
    assert "restarting local rank 1 as a new member" in result.stderr
    assert "joined at step 4 with the cohort's live state" in result.stderr
    assert "below min_workers=3: waiting" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr  # the token is never printed
    final, expected = torch.load(out), one_process(epochs)
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-9, atol=1e-12)


@pytest.mark.timeout(150)
def test_below_min_workers_checkpoints_exits_3_and_resumes(tmp_path: Path) -> None:
    out, checkpoints = tmp_path / "final.pt", tmp_path / "ckpt"
    common = ("--nproc-per-node", "2", "--elastic", "--token", "s3cret-token", "--min-workers", "2",
              "--min-workers-timeout", "1", str(SCRIPT), "--epochs", str(EPOCHS),
              "--step-time", "0.02", "--checkpoint-dir", str(checkpoints), "--out", str(out))
    stopped = potluck_run(*common, "--fail-at", "5", timeout=120)
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "a worker was lost (elastic: the cohort goes on)" in stopped.stderr
    assert "below min_workers=2, and nobody joined within 1 s" in stopped.stderr
    assert "the cohort stopped below --min-workers 2" in stopped.stderr
    assert "Traceback" not in stopped.stderr  # a planned stop, told plainly
    assert [p.name for p in checkpoints.iterdir()] == ["step-00000005.pt"] or \
        len(list(checkpoints.iterdir())) == 1
    assert not out.exists()

    resumed = potluck_run(*common, "--resume", timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step 5" in resumed.stderr
    assert_equal_to_one_process(out)


def _node(rank: int, port: int, nproc: int, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """One node's ``potluck run``, its stdout and stderr together in ``log``."""
    with log.open("wb") as sink:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nnodes", "1:2", "--node-rank",
             str(rank), "--master-port", str(port), "--nproc-per-node", str(nproc),
             "--elastic", "--token", "s3cret-token", "--run-id", "late", "--join-timeout", "60",
             *args],
            stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)


@pytest.mark.timeout(150)
def test_late_node_joins_the_running_job(tmp_path: Path) -> None:
    """--nnodes 1:2: node 0 starts the job alone; node 1 joins it at a step boundary.

    Node 0's two workers train an epoch; then its worker 1 dies (--fail-at 8, no
    restarts) and, below --min-workers 2, the survivor waits for a joiner. Node 1 is
    started only then, so the job is still running when it joins, however slowly it
    starts: it joins at step 8 with the live state, and the two finish the run."""
    port, out = free_port(), tmp_path / "final.pt"
    log0, log1 = tmp_path / "node0.log", tmp_path / "node1.log"
    script = (str(SCRIPT), "--step-time", "0.05", "--epochs", str(EPOCHS), "--out", str(out))
    first = _node(0, port, 2, log0, "--min-workers", "2", "--min-workers-timeout", "100",
                  *script, "--fail-at", "8")
    nodes = [first]
    try:
        # No deadline of our own (node 0 takes 5 to 40 s to get here, by the machine's
        # load): the event, node 0's exit, or the test's timeout ends this wait.
        while "below min_workers=2: waiting" not in log0.read_text():
            assert first.poll() is None, log0.read_text()
            time.sleep(0.1)
        nodes.append(_node(1, port, 1, log1, *script))
        codes = [node.wait(timeout=120) for node in nodes]
    finally:
        kill_leftovers(nodes)
    text0, text1 = log0.read_text(), log1.read_text()
    assert codes == [0, 0], text0[-2000:] + text1[-2000:]
    assert "epoch 0 done at step 8 with 2 workers" in text0  # node 0 trained on its own
    assert "a worker was lost (elastic: the cohort goes on)" in text0
    assert "joined at step 8 with the cohort's live state" in text1, text1[-2000:]
    assert f"epoch {EPOCHS - 1} done at step {8 * EPOCHS} with 2 workers" in text0
    assert_equal_to_one_process(out)


@pytest.mark.timeout(60)
def test_a_scripts_own_exit_code_3_is_a_failure_not_the_planned_stop() -> None:
    """Exit code 3 is also the below-minimum stop's; only the worker's stop file (written
    when it raised BelowMinimumError) makes it one. The stop itself is tested above."""
    result = potluck_run("--nproc-per-node", "1", "--elastic", "--token", "s3cret-token",
                         str(ROOT / "tests" / "e2e" / "scripts" / "exit_3.py"), timeout=50)
    assert result.returncode == 1, result.stderr
    assert "a worker was lost" in result.stderr
    assert "exit code 3" in result.stderr
    assert "below --min-workers" not in result.stderr


def _child_with_local_rank(parent: int, local_rank: int) -> int:
    """The worker process of ``parent`` (a launcher) whose LOCAL_RANK is ``local_rank``."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for child in map(int, children):
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"LOCAL_RANK={local_rank}".encode() in environ:
            return child
    raise AssertionError(f"no worker with LOCAL_RANK={local_rank} among {children}")


@pytest.mark.timeout(150)
def test_a_frozen_worker_is_ended_once_the_cohort_went_on_without_it(tmp_path: Path) -> None:
    """SIGSTOP one worker: the others redo the step without it and finish; the agent
    ends the frozen process (it was left out of the cohort) and exits, instead of
    waiting for it forever. --max-restarts 0: it is reported lost, not restarted."""
    out = tmp_path / "final.pt"
    epochs = 6
    launcher = subprocess.Popen(
        [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2", "--elastic",
         "--token", "s3cret-token", str(SCRIPT), "--epochs", str(epochs), "--step-time", "0.05",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:  # training runs: freeze worker 1 now
            if "epoch 0 done" in line:
                break
        frozen = _child_with_local_rank(launcher.pid, 1)
        os.kill(frozen, signal.SIGSTOP)
        _, err = launcher.communicate(timeout=120)
    finally:
        kill_leftovers([launcher])
    assert launcher.returncode == 0, err[-3000:]
    assert "the cohort went on without it" in err, err[-3000:]
    assert "a worker was lost (elastic: the cohort goes on)" in err
    assert f"pid       : {frozen}" in err
    assert not pid_alive(frozen)
    assert_equal_to_one_process(out, epochs)  # its step was redone by the others


@pytest.mark.timeout(90)
def test_a_script_without_the_elastic_path_is_told_why_elastic_cannot_help() -> None:
    result = potluck_run("--nproc-per-node", "2", "--elastic", "--token", "s3cret-token",
                         str(ROOT / "tests" / "e2e" / "scripts" / "plain_torch_fail_rank1.py"),
                         timeout=80)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "worker 1 never joined the elastic cohort" in result.stderr, result.stderr[-3000:]
    assert "without --elastic, with --max-restarts K" in result.stderr


@pytest.mark.timeout(90)
def test_a_restart_with_no_member_left_fails_at_once_with_why() -> None:
    """Every member lost at once (here the only one): the restarted worker waited
    join_timeout (300 s) in silence for an admission nobody could give, then failed
    with a traceback; it now says why within a few heartbeat timeouts, in one line."""
    started = time.monotonic()
    result = potluck_run("--nproc-per-node", "1", "--elastic", "--max-restarts", "1",
                         "--token", "s3cret-token", str(ROOT / "tests" / "e2e" / "scripts" /
                                                   "lost_alone.py"), timeout=80)
    assert result.returncode == 1
    assert time.monotonic() - started < 60
    assert "attempt 0 joined" in result.stdout and "attempt 1 joined" not in result.stdout
    assert "potluck: RendezvousError: worker" in result.stderr
    assert "no member of the cohort is alive" in result.stderr
    assert "store_rendezvous.py" not in result.stderr  # one line, not potluck's frames
