"""``potluck run --reputation``: each run appends this machine's record, and ``potluck
plan --reputation`` ranks a machine that was lost below one with no record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.reputation import load
from tests.e2e.helpers import ROOT, SCRIPTS

JOB = SCRIPTS / "reputation_job.py"


def _run(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}  # the identity lives in HOME/.cache/potluck
    return subprocess.run([sys.executable, "-m", "potluck", *argv], capture_output=True,
                          text=True, timeout=110, cwd=ROOT, env=env)


@pytest.mark.timeout(300)
def test_two_runs_leave_two_records_and_the_lost_machine_ranks_down(tmp_path: Path) -> None:
    record = tmp_path / "reputation.jsonl"
    steady = _run(tmp_path, "run", "--nproc-per-node", "2", "--reputation", str(record),
                  str(JOB))
    assert steady.returncode == 0, steady.stderr
    lost = _run(tmp_path, "run", "--nproc-per-node", "2", "--max-restarts", "1",
                "--reputation", str(record), str(JOB), "--fail-first")
    assert lost.returncode == 0, lost.stderr
    first, second = load(record)
    identity = (tmp_path / ".cache" / "potluck" / "worker-id").read_text().strip()
    assert first.worker == second.worker == identity  # kept across runs
    assert (first.losses, first.restarts) == (0, 0)
    assert (second.losses, second.restarts) == (2, 2)  # both first-attempt workers ended
    for r in (first, second):
        assert r.samples_per_s is not None and r.samples_per_s > 0
        assert 0 < r.in_cohort_s <= r.run_s

    candidates = tmp_path / "candidates.json"
    machines = [{"name": name, "id": ident, "speed": 100, "up_mbit": 1000,
                 "down_mbit": 1000} for name, ident in (("here", identity),
                                                        ("fresh", "never-seen"))]
    candidates.write_text(json.dumps({"job": {"parameters": 1000, "global_batch": 32},
                                      "target": {"samples_per_s": 60},
                                      "machine": machines}))
    # one machine meets the target: alike on paper, the first is taken; with the
    # record, the one that was never lost
    assert _best(tmp_path, candidates) == ["here"]
    assert _best(tmp_path, candidates, "--reputation", str(record)) == ["fresh"]


def _best(home: Path, candidates: Path, *flags: str) -> list[str]:
    out = home / "plan.json"
    planned = _run(home, "plan", str(candidates), "--json", str(out), *flags)
    assert planned.returncode == 0, planned.stderr
    members: list[str] = json.loads(out.read_text())["best"]["members"]
    return members
