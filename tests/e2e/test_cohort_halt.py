"""The cohort job's halt file, as the bench's time limit uses it: every worker ends
after the same commit, mid-epoch, finished, its replicas equal and no sample twice."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from potluck_lab.bench import cohort_figures as fig
from tests.e2e.helpers import potluck_run

QUICK_JOB = ("--samples", "1280", "--global-batch", "16", "--inner-steps", "4",
             "--d-model", "32", "--layers", "1", "--corpus-chars", "100000")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "per_commit"), [("step", 16), ("rounds", 64)])
def test_a_halted_cohort_ends_after_the_same_commit_mid_epoch(tmp_path: Path, mode: str,
                                                             per_commit: int) -> None:
    halt = tmp_path / "halt"
    halt.write_text("3")
    result = potluck_run("--nproc-per-node", "2", "-m", "potluck_lab.cohort_job",
                         "--run-dir", str(tmp_path), "--mode", mode, "--epochs", "2",
                         *QUICK_JOB, "--halt-file", str(halt), timeout=100.0)
    assert result.returncode == 0, result.stderr[-3000:]
    workers = fig.read_workers(tmp_path)
    assert len(workers) == 2
    for w in workers:
        assert [r["steps"] for r in w.of("commit")] == [1, 2, 3], w.records[-5:]
        assert [r["steps"] for r in w.of("halt")] == [3]
        assert [r["finished"] for r in w.of("done")] == [True]
    assert fig.replicas_equal(torch.load(w.params) for w in workers
                              if w.params is not None) is True
    # 3 commits of one epoch's 1280 samples: each once, the rest never begun
    assert fig.epochs_begun(workers) == 1
    ids = [i for _, part in fig.trained(workers) for i in part]
    assert len(ids) == len(set(ids)) == 3 * per_commit
    assert fig.exactly_once(workers, 1280, fig.epochs_begun(workers) - 1) == \
        {"twice": 0, "missing": 0}
