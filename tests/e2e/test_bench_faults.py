"""``potluck bench faults`` as a user runs it: a short run, and a bad flag."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, pid_alive, run_to_end

KILLED = ("potluck+kills", "torchrun+kills")
FIELDS = ("steps", "kills", "steps_lost", "redone", "recovery_median_s", "recovery_max_s",
          "whole_median_s", "wall_s", "steps_per_s", "goodput")
STEPS = 70
# A kill lands after 2 s of training and not within 2 s (end_margin) of the expected
# end, so every job must last well over 4 s whatever the machine's speed: 70 steps of at
# least 0.08 s (a sleep per step) last at least 5.6 s. Without the floor a fast run of
# torchrun's job ended before any kill was due (kills 0).
STEP_PAUSE = 0.08
CHECKPOINT_EVERY = 5
# One kill a run: each kill of torchrun's job restarts every worker (6-7 s here), and
# one shows all the test checks. Without the cap a run had 4 or 5 kills, the test 80-115 s.
MAX_KILLS = 1


def bench(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return run_to_end([sys.executable, "-m", "potluck", "bench", "faults", *argv],
                      timeout=timeout, cwd=ROOT)


@pytest.mark.timeout(300)
def test_quick_run_reports_the_contenders_asked_for_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    """The two runs with kills (the runs without them are the same jobs, kill-free)."""
    out = tmp_path / "faults.json"
    result = bench("--quick", "--workers", "2", "--steps", str(STEPS), "--kill-every", "2",
                   "--checkpoint-every", str(CHECKPOINT_EVERY), "--step-pause", str(STEP_PAUSE),
                   "--max-kills", str(MAX_KILLS), "--contenders", ",".join(KILLED),
                   "--json", str(out), timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout.startswith("potluck bench faults: 2 workers, gloo, kill every 2 s "
                                    "(at most 1 a run)")
    report = json.loads(out.read_text())
    assert sorted(report["contenders"]) == sorted(KILLED)
    for name in KILLED:
        figures = report["contenders"][name]
        assert set(FIELDS) <= set(figures), name
        assert figures["steps"] == STEPS, name  # every job committed every step
        assert figures["kills"] == MAX_KILLS, name
        assert figures["goodput"] is None, name  # no kill-free run to compare with
    assert report["contenders"]["potluck+kills"]["steps_lost"] == 0
    # torchrun redoes from its checkpoint: what was committed since then (0 when a kill
    # lands just after a checkpoint, so no lower bound holds for every run), never more
    torchrun = report["contenders"]["torchrun+kills"]
    assert 0 <= torchrun["steps_lost"] <= torchrun["kills"] * CHECKPOINT_EVERY
    pids = [pid for run in report["runs"] for pid in [run["launcher_pid"], *run["worker_pids"]]]
    assert len(pids) >= 2 * 4  # a launcher and 2 workers per run, and a restart each
    assert not [pid for pid in pids if pid_alive(pid)]


@pytest.mark.timeout(60)
def test_bad_flag_is_a_clear_error() -> None:
    """One run as a user sees it (exit 2, no traceback); the other refusals in-process
    (the same ``config_from_args``, without a Python start-up each)."""
    from potluck.errors import ConfigError
    from potluck_lab.bench.faults import add_arguments, config_from_args

    result = bench("--kill-every", "0", timeout=50)
    assert result.returncode == 2
    assert "--kill-every 0 must be a positive number of seconds" in result.stderr
    assert "e.g. --kill-every 8" in result.stderr
    assert "Traceback" not in result.stderr
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv, message in ((["--workers", "1"], "--workers 1: a kill must leave a survivor"),
                          (["--max-kills", "-1"], "--max-kills -1 must be a count >= 0"),
                          (["--contenders", "potluck,ddp"],
                           "--contenders potluck,ddp: pick from potluck,potluck+kills")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            config_from_args(parser.parse_args(argv))
