"""``potluck bench chaos --churn``, a short run in CI: 6 loopback nodes, members killed
and joining for 20 s. The run must pass (every sample exactly once, identical replicas
equal to one process, no process left) and report its recovery figures in the lines
and at the top level of the JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, run_to_end


@pytest.mark.timeout(420)
def test_a_short_churn_run_loses_nothing_and_reports_its_recovery(tmp_path: Path) -> None:
    out = tmp_path / "churn.json"
    done = run_to_end([sys.executable, "-m", "potluck", "bench", "chaos", "--churn",
                           "--members", "6", "--minutes", "0.33", "--seed", "3",
                           "--json", str(out)],
                      timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("potluck bench chaos --churn: 6 members")
    assert lines[1].startswith("members 6: ") and lines[1].endswith("PASS"), lines[1]
    assert lines[-1] == "1/1 runs passed"
    report = json.loads(out.read_text())
    run = report["runs"][0]
    assert report["members"] == [6] and report["passed"] == 1 and run["passed"]
    assert run["kills"] and run["joins"] and run["recovery_s"]
    assert run["exactly_once"] and run["replicas_equal"] and not run["leftover"]
    assert 0 < report["recovery_median_s"]["6"] <= report["recovery_p95_s"]["6"] < 60
