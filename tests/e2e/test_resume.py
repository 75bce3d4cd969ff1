"""Exact resume through the launcher: SIGKILL the whole job mid-run, start it again.

30 steps uninterrupted versus 15 steps, a SIGKILL of the launcher (its workers die with
it), and a resumed run to 30. With the same 2 workers every loss of steps 16..30 and
every final parameter are bitwise identical on CPU (dropout on: per-rank RNG restored).
A checkpoint of 2 ranks resumed on 3 is checked on Gloo ranks without the launcher
(``tests/distributed/test_checkpoint_resume.py``), which keeps this test short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.e2e.helpers import ROOT, potluck_run

SCRIPT = ROOT / "examples" / "resumable.py"


def _losses(path: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}


def _run(tmp: Path, name: str, workers: int, ckpt: Path,
         *extra: str) -> subprocess.CompletedProcess[str]:
    return potluck_run("--nproc-per-node", str(workers), str(SCRIPT), "--steps", "30",
                       "--dir", str(ckpt), "--metrics", str(tmp / f"{name}.jsonl"),
                       "--out", str(tmp / f"{name}.pt"), *extra, timeout=120)


def _run_and_kill_at_15(tmp: Path, ckpt: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2", str(SCRIPT),
         "--steps", "30", "--dir", str(ckpt), "--metrics", str(tmp / "first.jsonl"),
         "--hold-at", "15"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},  # (killed outright: it cannot remove its own)
    )
    try:
        deadline = time.monotonic() + 90
        while not (ckpt / "holding").exists():
            assert launcher.poll() is None, "the job ended before reaching step 15"
            assert time.monotonic() < deadline, "the job did not reach step 15 in 90 s"
            time.sleep(0.2)
        launcher.send_signal(signal.SIGKILL)  # the whole launcher, no chance to clean up
        launcher.wait(timeout=10)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    deadline = time.monotonic() + 15  # its workers must follow it out
    while subprocess.run(["pgrep", "-f", str(ckpt)], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "workers outlived the SIGKILLed launcher"
        time.sleep(0.2)
    (ckpt / "holding").unlink()


@pytest.mark.timeout(400)
def test_sigkilled_job_resumes_bitwise(tmp_path: Path) -> None:
    whole = _run(tmp_path, "whole", 2, tmp_path / "ckpt-whole")
    assert whole.returncode == 0, whole.stderr

    ckpt = tmp_path / "ckpt"
    _run_and_kill_at_15(tmp_path, ckpt)
    assert max(_losses(tmp_path / "first.jsonl")) == 15

    resumed = _run(tmp_path, "resumed", 2, ckpt)
    assert resumed.returncode == 0, resumed.stderr
    expected, got = _losses(tmp_path / "whole.jsonl"), _losses(tmp_path / "resumed.jsonl")
    assert sorted(got) == list(range(16, 31)), "the resumed run must start at step 16"
    assert [got[s] for s in got] == [expected[s] for s in got]  # bitwise, every step
    final, final_resumed = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "resumed.pt")
    assert all(torch.equal(final[k], final_resumed[k]) for k in final)
