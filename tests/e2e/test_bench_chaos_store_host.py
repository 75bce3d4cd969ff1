"""``potluck bench chaos --faults store-host``, one trial in CI: three loopback agents,
node 0 (the store's host: agent, store and worker) killed mid-run. The survivors must
finish with every sample exactly once, identical replicas equal to one process, and
nothing left behind; the trial measures their recovery. One run of the command checks
both the trial (its ``--json``) and the command line: its header, the trial's line and
the recovery summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, run_to_end


@pytest.mark.timeout(200)
def test_a_trial_kills_the_store_host_and_the_survivors_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    done = run_to_end([sys.executable, "-m", "potluck", "bench", "chaos", "--faults",
                           "store-host", "--trials", "1", "--seed", "5", "--json", str(out)],
                      timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [trial] = json.loads(out.read_text())["trials"]
    assert trial["passed"] and not trial["problems"], done.stdout[-3000:]
    assert len(trial["from_kill_s"]) == 2 and all(0 < s < 30 for s in trial["from_kill_s"])
    lines = done.stdout.splitlines()
    assert lines[0].startswith("potluck bench chaos --faults store-host: 1 trial(s)")
    assert "node 0 (the store's host) killed at step" in lines[1] and "PASS" in lines[1]
    assert lines[2] == "1/1 trials passed"
    assert lines[3].startswith("recovery from the kill to the next committed step: median")
