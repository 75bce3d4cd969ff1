"""The chaos bench's pure parts: plans from seeds, leftover processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.cli import main
from potluck_lab.bench.chaos import FAULTS, ChaosPlan
from potluck_lab.elastic_job import leftover_processes, write_pid


@pytest.mark.timeout(10)
def test_a_seed_gives_one_plan_and_seeds_cover_every_fault_and_joiner() -> None:
    assert ChaosPlan.from_seed(7) == ChaosPlan.from_seed(7)
    plans = [ChaosPlan.from_seed(s) for s in range(40)]
    assert {p.fault for p in plans} == set(FAULTS)
    assert {p.joiner for p in plans} == {"late", "replacement"}
    assert all(0 <= p.victim < 3 and 2 <= p.at <= 10 for p in plans)


@pytest.mark.timeout(20)
def test_leftover_processes_are_the_recorded_ones_still_running(tmp_path: Path) -> None:
    write_pid(tmp_path, "me")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    Path(tmp_path, "gone.pid").write_text(f"{child.pid} 1")
    assert leftover_processes(tmp_path) == [os.getpid()]


@pytest.mark.timeout(10)
def test_bench_chaos_needs_a_trial(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "chaos", "--trials", "0"]) == 2  # a bad flag, as argparse's
    assert "potluck bench chaos: --trials 0 must be at least 1" in capsys.readouterr().err
