"""The cohort job's halt file, as the bench's time limit uses it: every worker ends
after the same commit, mid-epoch, finished, its replicas equal, every sample of its
whole epochs once and none twice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from potluck_lab.bench import cohort_figures as fig
from tests.e2e.helpers import ROOT, run_to_end

SAMPLES = 320  # an epoch: 20 steps of 16, or 5 rounds of 4 steps
QUICK_JOB = ("--samples", str(SAMPLES), "--global-batch", "16", "--inner-steps", "4",
             "--d-model", "32", "--layers", "1", "--corpus-chars", "100000")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "halt", "in_epoch_1"), [("step", 22, 32), ("rounds", 6, 64)])
def test_a_halted_cohort_ends_after_the_same_commit_mid_epoch(
        tmp_path: Path, mode: str, halt: int, in_epoch_1: int) -> None:
    (tmp_path / "halt").write_text(str(halt))
    result = run_to_end([sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2",
                         "-m", "potluck_lab.cohort_job", "--run-dir", str(tmp_path),
                         "--mode", mode, "--epochs", "3", *QUICK_JOB,
                         "--halt-file", str(tmp_path / "halt")], timeout=100.0, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    workers = fig.read_workers(tmp_path)
    assert len(workers) == 2
    for w in workers:
        assert [r["steps"] for r in w.of("commit")] == list(range(1, halt + 1))
        assert [(r["steps"], r["epoch"]) for r in w.of("halt")] == [(halt, 1)]
        assert [r["finished"] for r in w.of("done")] == [True]
    assert fig.replicas_equal(torch.load(w.params) for w in workers
                              if w.params is not None) is True
    # epoch 0 whole, each sample once; epoch 1 begun: its first commits, none twice
    assert fig.whole_epochs(workers) == 1
    assert fig.exactly_once(workers, SAMPLES, 1) == {"twice": 0, "missing": 0}
    late = [i for epoch, part in fig.trained(workers) if epoch == 1 for i in part]
    assert len(late) == len(set(late)) == in_epoch_1
