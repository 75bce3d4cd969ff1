"""``potluck bench straggler`` as a user runs it, in its smallest form (root, cgroup v1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from potluck_lab.machine import cpu_quota
from tests.e2e.helpers import ROOT, kill_leftovers, pid_alive

WHY_NOT = cpu_quota.unavailable()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"potluck bench straggler: {WHY_NOT}")
@pytest.mark.serial  # its verdict follows measured speeds: alone, after the parallel part
@pytest.mark.timeout(90)
def test_tiny_run_reports_the_four_figures_and_leaves_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "straggler.json"
    bench = subprocess.Popen([sys.executable, "-m", "potluck", "bench", "straggler", "--tiny",
                              "--json", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        stdout, stderr = bench.communicate(timeout=80)
    finally:
        kill_leftovers([bench])  # (SIGTERM first: the bench removes its cgroups)
    assert bench.returncode == 0, stdout + stderr[-3000:]
    assert stdout.startswith("potluck bench straggler: 2 workers on CPUs")
    assert "potluck, balanced" in stdout and "torch DDP, equal" in stdout
    report = json.loads(out.read_text())
    assert report["max_param_diff"] < 1e-9  # float64, shares moved, against one process
    assert report["check"]["shares_moved"]
    assert 0.3 < report["balanced_vs_ddp"] < 5.0
    assert 0.1 < report["fraction_of_ideal"] < 2.0
    ceiling = report["sync_ceiling"]  # None: the solos' window held no whole step
    assert ceiling is None or 0.3 < ceiling < 1.5
    assert "synchronous steps replayed on the solos' own step-to-step speeds" in stdout
    assert "potluck's planner" in stdout
    assert "planner_replay" in report
    steps = report["rebalance_steps"]  # None: not within 10% of the ideal in 8 steps
    assert steps is None or 0 <= steps <= report["config"]["phase_steps"]
    assert len(report["quota_change"]["changes"]) == 2
    assert not [pid for pid in report["worker_pids"] if pid_alive(pid)]
    assert not Path(cpu_quota.CPU_ROOT, f"potluck-straggler-{bench.pid}").exists()
    assert not Path(cpu_quota.CPU_ROOT, f"potluck-straggler-{bench.pid}-fast").exists()
    bad = subprocess.run([sys.executable, "-m", "potluck", "bench", "straggler", "--quota",
                          "2"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2
    assert "--quota 2 must be a fraction of one core between 0.1 and 1" in bad.stderr
    assert "Traceback" not in bad.stderr
