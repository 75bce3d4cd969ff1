"""``potluck run`` end to end: success, a failing rank, Ctrl-C, and torchrun parity."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from potluck.testing import free_port
from tests.e2e.helpers import EXAMPLE, ROOT, SCRIPTS, pid_alive, pids_in, potluck_run


def _same_params(a: Path, b: Path) -> bool:
    left, right = torch.load(a), torch.load(b)
    return left.keys() == right.keys() and all(
        torch.allclose(left[k], right[k], atol=1e-6) for k in left
    )


@pytest.mark.timeout(150)
def test_two_workers_match_torchrun(tmp_path: Path) -> None:
    ours = potluck_run("--nproc-per-node", "2", str(EXAMPLE), "--out", str(tmp_path / "a.pt"))
    assert ours.returncode == 0, ours.stderr
    assert "[rank0]: final loss" in ours.stdout and "on 2 rank(s)" in ours.stdout
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    theirs = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(EXAMPLE), "--out", str(tmp_path / "b.pt")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert theirs.returncode == 0, theirs.stderr
    assert _same_params(tmp_path / "a.pt", tmp_path / "b.pt")


@pytest.mark.timeout(60)
def test_torchrun_style_script_runs_under_potluck() -> None:
    result = potluck_run("--nproc_per_node", "2", str(SCRIPTS / "torchrun_style.py"))
    assert result.returncode == 0, result.stderr
    assert "[rank0]: sum 3 world 2" in result.stdout
    assert "[rank1]: sum 3 world 2" in result.stdout


@pytest.mark.timeout(60)
def test_log_dir_keeps_every_rank_and_the_filter_shows_one(tmp_path: Path) -> None:
    """torchrun's --log-dir layout and --local-ranks-filter, as its recipe uses them."""
    result = potluck_run("--nproc-per-node", "2", "--log-dir", str(tmp_path), "--rdzv-id",
                         "job7", "--local-ranks-filter", "1", str(SCRIPTS / "say_rank.py"))
    assert result.returncode == 0, result.stderr
    assert "[rank1]: out from local rank 1" in result.stdout
    assert "[rank1]: err from local rank 1" in result.stderr
    assert "local rank 0" not in result.stdout + result.stderr
    for rank in (0, 1):
        folder = tmp_path / "job7" / "attempt_0" / str(rank)
        assert (folder / "stdout.log").read_text() == f"out from local rank {rank}\n"
        assert (folder / "stderr.log").read_text() == f"err from local rank {rank}\n"


@pytest.mark.timeout(60)
def test_failing_rank_is_reported_and_everything_stops() -> None:
    started = time.monotonic()
    result = potluck_run("--nproc-per-node", "2", "--grace-period", "2",
                         str(SCRIPTS / "fail_rank1.py"), timeout=45)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert elapsed < 30, f"took {elapsed:.1f} s"
    report = result.stderr.split("potluck run: the job failed", 1)[1]
    assert "rank      : 1 (local rank 1" in report
    assert "ValueError: rank one exploded on purpose" in report
    assert 'fail_rank1.py", line' in report  # the worker's own traceback
    pids = pids_in(result.stdout)
    assert len(pids) == 2
    assert not [pid for pid in pids if pid_alive(pid)]


@contextlib.contextmanager
def _sleeping_job(tmp: Path) -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A 2-worker job that sleeps forever, with its worker pids; killed on the way out.
    Its temporary files go under ``tmp`` (a launcher killed outright cannot remove its
    own)."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2",
         str(SCRIPTS / "sleep_forever.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    try:
        assert launcher.stdout is not None
        lines = launcher.stdout.readline() + launcher.stdout.readline()
        pids = pids_in(lines)
        assert len(pids) == 2, lines
        yield launcher, pids
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.timeout(60)
def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    with _sleeping_job(tmp_path) as (launcher, pids):
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(timeout=20)
    assert code == 130
    assert not [pid for pid in pids if pid_alive(pid)]


@pytest.mark.timeout(90)
def test_max_restarts_restarts_the_workers() -> None:
    result = potluck_run("--nproc-per-node", "2", "--max-restarts", "1", "--grace-period", "1",
                         str(SCRIPTS / "fail_first_attempt.py"), timeout=80)
    assert result.returncode == 0, result.stderr
    assert "RuntimeError: first attempt fails on purpose" in result.stderr  # reported
    assert "restarting the workers (1 of 1 restarts)" in result.stderr
    assert "[rank0]: attempt 1 done" in result.stdout
    assert "[rank1]: attempt 1 done" in result.stdout


@pytest.mark.timeout(60)
def test_killed_launcher_leaves_no_worker(tmp_path: Path) -> None:
    with _sleeping_job(tmp_path) as (launcher, pids):
        launcher.kill()  # no chance to clean up: the kernel must take the workers along
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not [pid for pid in pids if pid_alive(pid)]


@pytest.mark.timeout(90)
def test_a_node_that_gave_up_checks_out_at_once() -> None:
    """--nnodes 2 on one machine: node 1's worker dies at exit, node 1 gives up. It must
    still check out, or node 0 (whose worker succeeded) waits the whole --join-timeout
    for it and then fails with a message that blames the flags."""
    port = str(free_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "potluck", "run", "--nnodes", "2", "--node-rank", str(rank),
         "--master-port", port, "--join-timeout", "30", "--run-id", "gave-up",
         str(SCRIPTS / "abort_at_exit.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        for rank in (0, 1)]
    try:
        (out0, err0), (out1, err1) = (node.communicate(timeout=70) for node in nodes)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert "[rank1]: rank 1 done" in out1 and "killed by SIGABRT" in err1, err1
    assert nodes[1].returncode == 1
    assert "[rank0]: rank 0 done" in out0
    assert nodes[0].returncode == 0, err0  # not: "only 1 of 2 node agents reached ..."
    assert "node agents reached" not in err0


@pytest.mark.timeout(30)
def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = potluck_run("--master-port", str(port), str(EXAMPLE), timeout=25)
    assert result.returncode == 2
    assert f"cannot host the store on port {port}" in result.stderr
    assert "--master-port" in result.stderr


@pytest.mark.timeout(90)
def test_a_crash_at_exit_after_the_script_finished_is_a_warning_not_a_restart() -> None:
    result = potluck_run("--nproc-per-node", "2", "--max-restarts", "2",
                         str(SCRIPTS / "finish_then_abort_at_exit.py"), timeout=80)
    assert result.returncode == 0, result.stderr
    assert "rank 1 (local rank 1, node rank 0" in result.stderr
    assert "finished its script, then died at interpreter exit: killed by SIGABRT" \
        in result.stderr
    assert "the job failed" not in result.stderr
    assert "restarting" not in result.stderr
    assert result.stdout.count("[rank1]: rank 1 trained") == 1  # trained once, kept


@pytest.mark.timeout(60)
def test_an_abort_inside_the_script_is_still_a_failure() -> None:
    result = potluck_run("--nproc-per-node", "2", str(SCRIPTS / "finish_then_abort_at_exit.py"),
                         "--in-script", timeout=50)
    assert result.returncode == 1
    report = result.stderr.split("potluck run: the job failed", 1)[1]
    assert "rank      : 1 (local rank 1" in report
    assert "killed by SIGABRT" in report
    assert "finished its script" not in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("script", [
    "die_before_backward.py",
    # A README loop ends with ``cohort.close()``: it closes the group before the script
    # ends, so rank 0 records its lost peer before rank 1 records its end.
    "close_before_backward.py",
])
def test_the_report_names_the_rank_that_left_not_the_one_that_lost_it(script: str) -> None:
    result = potluck_run("--nproc-per-node", "2", str(SCRIPTS / script), timeout=50)
    assert result.returncode == 1, result.stderr[-3000:]
    root = result.stderr.split("Root cause")[1]
    assert "rank      : 1 (local rank 1, node rank 0)" in root, root
    assert "its script ended while the other ranks still waited for it" in root
    assert "rank 0 (pid" in root and "PeerLostError" in root  # listed as a consequence


@pytest.mark.timeout(30)
def test_a_scripts_own_sys_exit_is_reported_with_its_code() -> None:
    result = potluck_run(str(SCRIPTS / "exit_3.py"), timeout=25)
    assert result.returncode == 1, result.stderr[-3000:]
    root = result.stderr.split("Root cause")[1]
    assert "exit      : exit code 3" in root
    assert "error     : the script exited with code 3 via SystemExit (sys.exit(3))" in root
    assert 'exit_3.py", line' in root and "none recorded" not in root


@pytest.mark.timeout(90)
def test_an_elastic_jobs_buggy_hook_fails_at_once_with_its_own_error() -> None:
    result = potluck_run("--nproc-per-node", "2", "--elastic", "--token", "buggy-hook-job",
                         str(SCRIPTS / "buggy_hook.py"), timeout=80)
    assert result.returncode == 1, result.stderr[-3000:]
    root = result.stderr.split("Root cause")[1]
    assert "CommHookError: the communication hook shapes_mismatch failed" in root, root
    assert "not a lost peer" in root
    assert "CursorError" not in result.stderr and "a peer died" not in result.stderr
    assert "step abandoned" not in result.stderr  # never redone


@pytest.mark.timeout(90)
def test_a_restarted_plain_torch_script_does_not_see_the_last_attempts_keys() -> None:
    """torch's env:// rendezvous writes its group's keys on the launcher's store with no
    attempt in them (torchrun gives each attempt a new store): the restarted workers
    read the dead attempt's addresses, and 2 restarts in 10 hung or failed in Gloo."""
    result = potluck_run("--nproc-per-node", "2", "--max-restarts", "1",
                         str(SCRIPTS / "plain_torch_restarted.py"), timeout=80)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("attempt 1: an earlier attempt's key: False") == 2, \
        result.stdout
    assert result.stdout.count("attempt 1 done: 2") == 2
