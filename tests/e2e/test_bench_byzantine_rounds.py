"""``potluck bench byzantine --sync diloco`` as a user runs it, in its quickest form: two
attacks, one seed, 10 rounds. The JSON has the four figures the goals are for, and plain
DiLoCo is hurt by a sign flip. Where ``prepare`` still refuses trust with rounds, the
trust contender is reported "not available" with null figures; once it is available,
its figures are numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT

FIGURES = ("worst_loss_ratio", "max_rounds_to_quarantine", "false_quarantines",
           "clean_overhead")
ATTACKS = ("sign_flip", "ipm")  # ipm: the omniscient all-gather on real Gloo


@pytest.mark.timeout(240)
def test_quick_rounds_bench_reports_the_figures_and_plain_diloco_hurt_by_a_sign_flip(
        tmp_path: Path) -> None:
    out = tmp_path / "rounds.json"
    argv = [sys.executable, "-m", "potluck", "bench", "byzantine", "--sync", "diloco",
            "--quick", "--json", str(out)]
    for attack in ATTACKS:
        argv += ["--attack", attack]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=220, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(FIGURES) <= set(report)
    assert list(report["attacks"]) == list(ATTACKS)
    assert report["rounds"] == 10 and report["quick"] is True
    assert report["attacks"]["sign_flip"]["plain"] > 1.05
    assert "sign_flip" in report["hurt_attacks"]
    assert "attacks that hurt plain DiLoCo (loss ratio > 1.05): sign_flip" in result.stdout
    if report["trust_contender"] == "not available":
        assert all(report[name] is None for name in FIGURES)
        assert all(row["trust"] is None for row in report["attacks"].values())
        assert "trust contender: not available (prepare() got sync=DiLoCo" in result.stdout
    else:
        assert report["trust_contender"] == "available"
        assert all(report[name] is not None for name in FIGURES)
        assert "clean_overhead " in result.stdout
