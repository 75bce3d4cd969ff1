"""``potluck plan --calibrate --model``: a candidates file without speeds or a
parameter count, measured here end to end (two local ranks on Gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, SCRIPTS

PARAMETERS = 32 * 64 + 64 + 64 * 4 + 4  # plan_tiny_model.tiny's


@pytest.mark.timeout(240)
def test_calibrate_fills_in_speed_parameters_and_overheads(tmp_path: Path) -> None:
    candidates = tmp_path / "candidates.toml"
    candidates.write_text('[job]\nglobal_batch = 64\n\n'
                          '[[machine]]\nname = "a"\nup_mbit = 100\ndown_mbit = 100\n\n'
                          '[[machine]]\nname = "b"\nup_mbit = 100\ndown_mbit = 100\n'
                          'speed = 5\n')
    out = tmp_path / "plan.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SCRIPTS), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "potluck", "plan", str(candidates),
                           "--calibrate", "--model", "plan_tiny_model:tiny", "--json",
                           str(out)], capture_output=True, text=True, timeout=220,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    plan = json.loads(out.read_text())
    assert f"{PARAMETERS:,} parameters" in done.stdout
    a, b = plan["candidates"]
    assert a["speed"] > 100  # measured here: thousands of samples/s for this model
    assert b["speed"] == 5  # the file's own figure stands
    measured = next(n for n in plan["notes"] if n.startswith("measured here"))
    assert "ms a step of the reducer" in measured and "ns of CPU" in measured
    assert plan["best"] is not None


@pytest.mark.timeout(30)
def test_calibrate_without_a_model_says_how() -> None:
    done = subprocess.run([sys.executable, "-m", "potluck", "plan",
                           str(ROOT / "examples" / "plan-candidates.toml"), "--calibrate"],
                          capture_output=True, text=True, timeout=25, cwd=ROOT)
    assert done.returncode == 2
    assert "give --model module:function" in done.stderr
