"""The lab's shared pieces: the job runner reaps whatever it started, the model builder
gives the same weights as layers built by hand."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from potluck_lab import models
from potluck_lab.jobs import Processes, wait_all

SLEEP = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.timeout(30)
def test_stop_reaps_every_process_and_what_a_session_started(tmp_path: Path) -> None:
    grandchild = tmp_path / "grandchild.pid"
    with Processes() as jobs:
        jobs.start(SLEEP, tmp_path / "a.log")
        jobs.start(["/bin/sh", "-c", f"sleep 60 & echo $! > {grandchild}; wait"],
                   tmp_path / "b.log")
        jobs.start(SLEEP, tmp_path / "c.log", session=False)
        deadline = time.monotonic() + 20
        while not (grandchild.exists() and grandchild.read_text().strip()
                   and (tmp_path / "a.log").read_text()):
            assert time.monotonic() < deadline, "the processes did not start"
            time.sleep(0.05)
        assert jobs.ended() == []
        pids = [*jobs.pids, int(grandchild.read_text())]
    assert all(proc.returncode is not None for proc in jobs.procs)
    assert not any(_alive(pid) for pid in pids)  # the session's child went with it
    assert (tmp_path / "a.log").read_text() == "up\n"


@pytest.mark.timeout(30)
def test_wait_ends_at_the_first_failure_and_terminate_asks_first(tmp_path: Path) -> None:
    with Processes() as jobs:
        jobs.start(SLEEP, tmp_path / "sleep.log")
        jobs.start([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "fail.log")
        started = time.monotonic()
        assert not jobs.wait(timeout=20)  # one failed: no need to wait for the other
        assert time.monotonic() - started < 15 and jobs.ended() == [1]
    trapping = Processes()
    trapping.start([sys.executable, "-c", "import signal, sys, time\n"
                    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                    "print('up', flush=True); time.sleep(60)"], tmp_path / "trap.log")
    while not (tmp_path / "trap.log").read_text():
        time.sleep(0.05)
    trapping.stop(10, terminate=True)
    assert trapping.procs[0].returncode == 0  # it left when asked
    done = Processes()
    done.start([sys.executable, "-c", "pass"], tmp_path / "ok.log", env=os.environ)
    assert done.wait(timeout=20)
    done.stop()


@pytest.mark.timeout(30)
def test_wait_all_waits_for_the_last_whatever_the_others_codes(tmp_path: Path) -> None:
    with Processes() as jobs:
        jobs.start([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "lost.log")
        jobs.start([sys.executable, "-c", "import time; time.sleep(1.0)"],
                   tmp_path / "last.log")
        assert wait_all(jobs.procs, timeout=20)  # (Processes.wait ends at the failure)
        assert [proc.returncode for proc in jobs.procs] == [3, 0]
        jobs.start(SLEEP, tmp_path / "sleep.log")
        started = time.monotonic()
        assert not wait_all(jobs.procs[2:], timeout=0.3)
        assert time.monotonic() - started < 5


@pytest.mark.timeout(10)
def test_mlp_builds_the_layers_a_hand_written_one_does() -> None:
    torch.manual_seed(4)
    by_hand = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).double()
    built = models.mlp([3, 5, 2], nn.ReLU, seed=4, dtype=torch.float64)
    assert repr(built) == repr(by_hand)
    for (name, a), (_, b) in zip(built.state_dict().items(), by_hand.state_dict().items(),
                                 strict=True):
        assert a.dtype == torch.float64 and torch.equal(a, b), name
    assert models.parameter_count(models.tiny_mlp()) == 8 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4
