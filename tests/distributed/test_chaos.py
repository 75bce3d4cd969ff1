"""Chaos in CI: a few trials of ``potluck bench chaos``, the same code the bench runs.

Each trial (``potluck_lab.bench.chaos.run_trial``): 3 founders and a fourth worker; one
founder is SIGKILLed, SIGSTOPped or SIGTERMed (a graceful leave) at a random step, and
the fourth arrives at a random moment or right after the fault (a replacement). Every
run must complete, train every sample of every epoch exactly once (ledger), end with
identical replicas equal to one process on the same global batches (float64, 1e-9:
only summation order differs), and leave no process behind. The seeds below cover
each fault and both kinds of joiner; more trials: ``potluck bench chaos --trials N``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from potluck_lab.bench.chaos import ChaosPlan, run_trial

TRIALS = [2, 8, 9]  # kill + replacement, freeze + late joiner, leave + replacement


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", TRIALS, ids=lambda s: ChaosPlan.from_seed(s).describe())
def test_random_faults_and_joins_lose_nothing(tmp_path: Path, seed: int) -> None:
    trial = run_trial(seed, tmp_path, timeout=200)
    assert trial.passed, "\n".join([trial.line(), *trial.problems])
