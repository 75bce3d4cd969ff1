"""``tools/gpu_check.py``: its rehearsal (``--cpu``) passes every check on this machine,
and without CUDA and ``--cpu`` it says what to do in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT

SCRIPT = ROOT / "tools" / "gpu_check.py"
CHECKS = ["reducer + prepare, 1 rank", "reducer + prepare, 2 ranks",
          "potluck vs torch DDP, 1 rank", "codecs", "trust kernels",
          "elastic run, 2 workers, 1 killed"]


@pytest.mark.timeout(150)
def test_the_rehearsal_runs_every_check_and_each_passes(tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    # --max-ratio: step times on this shared machine are no pass criterion for a test.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu", "--quick", "--max-ratio", "1000",
         "--json", str(rows_file)],
        capture_output=True, text=True, timeout=140, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    rows = json.loads(rows_file.read_text())["rows"]
    assert [row["check"] for row in rows] == CHECKS
    assert all(row["ok"] for row in rows), rows
    table = result.stdout.splitlines()
    assert table[0].startswith("potluck gpu check: cpu (rehearsal)")
    assert [line.split("  ")[0].strip() for line in table[3:]] == CHECKS  # one table
    assert all(" pass " in line for line in table[3:]), result.stdout
    assert "tensors on cpu" in rows[1]["result"]
    assert "killed at step 4, rejoined" in rows[5]["result"]


@pytest.mark.timeout(60)
def test_without_cuda_it_says_so_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=50, cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # (no CUDA, on any machine)
    assert result.returncode == 2
    assert result.stderr == "no CUDA device: run on a GPU machine, or --cpu to rehearse\n"
    assert result.stdout == ""
