"""The chaos bench's pure parts: plans from seeds, the ledger check, leftover processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.cli import main
from potluck_lab.bench.chaos import FAULTS, ChaosPlan
from potluck_lab.elastic_job import ElasticJob, ledger_problems, leftover_processes, write_pid

JOB = ElasticJob(samples=6, global_batch=3, epochs=2)


@pytest.mark.timeout(10)
def test_a_seed_gives_one_plan_and_seeds_cover_every_fault_and_joiner() -> None:
    assert ChaosPlan.from_seed(7) == ChaosPlan.from_seed(7)
    plans = [ChaosPlan.from_seed(s) for s in range(40)]
    assert {p.fault for p in plans} == set(FAULTS)
    assert {p.joiner for p in plans} == {"late", "replacement"}
    assert all(0 <= p.victim < 3 and 2 <= p.at <= 10 for p in plans)


def _ledger(directory: Path, name: str, rows: list[list[object]]) -> None:
    Path(directory, f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.timeout(10)
def test_ledger_check_finds_missing_and_repeated_samples(tmp_path: Path) -> None:
    _ledger(tmp_path, "rank0", [[0, [0, 1, 2]], [0, [3, 4, 5]], [1, [5, 4, 3]]])
    _ledger(tmp_path, "rank1", [[1, [0, 1, 2]]])
    assert ledger_problems(tmp_path, JOB) == []
    _ledger(tmp_path, "rank2", [[1, [2]]])  # a step trained twice
    _ledger(tmp_path, "rank0", [[0, [0, 1, 2]], [1, [5, 4, 3]]])  # a step never trained
    problems = ledger_problems(tmp_path, JOB)
    assert problems == ["epoch 0: missing [3, 4, 5], more than once []",
                        "epoch 1: missing [], more than once [2]"]


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
