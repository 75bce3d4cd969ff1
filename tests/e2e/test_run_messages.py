"""What ``potluck run`` prints when every worker refuses, and when a script never uses
the flags it was given: once, in one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import SCRIPTS, potluck_run

REFUSAL = ("ConfigError: global_batch=0 must be a positive int (samples per step, all "
           "workers together), e.g. global_batch=64")


@pytest.mark.timeout(60)
def test_a_refusal_raised_by_every_worker_is_said_once_per_rank_and_once_in_the_report(
        tmp_path: Path) -> None:
    result = potluck_run("--nproc-per-node", "2", str(SCRIPTS / "refuse_everywhere.py"),
                         str(tmp_path), "2", timeout=50)
    assert result.returncode == 1
    err = result.stderr
    assert "Traceback" not in err and "deeper" not in err, err
    # each worker's own line (a worker stopped before it printed has none) ...
    for rank in (0, 1):
        assert err.count(f"[rank{rank}]: potluck: {REFUSAL}") <= 1, err
    # ... and the report's, naming the ranks that raised it
    reports = [line for line in err.splitlines()
               if line.startswith(f"potluck run: the job failed: {REFUSAL} (rank")]
    assert len(reports) == 1, err
    assert len(err.splitlines()) <= 5, err


@pytest.mark.timeout(60)
def test_flags_a_script_never_uses_are_named_once(tmp_path: Path) -> None:
    """A drop-in script (torch DDP, potluck.DataParallel) does not call potluck.prepare,
    which alone reads --metrics-dir and --balance: rank 0 says so."""
    metrics = tmp_path / "metrics"
    result = potluck_run("--nproc-per-node", "2", "--balance", "--metrics-dir", str(metrics),
                         str(SCRIPTS / "say_rank.py"), timeout=50)
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "take effect only in" in line]
    assert said == [f"[rank0]: potluck: --metrics-dir and --balance take effect only in "
                    f"potluck.prepare(...), which this script did not call: no metrics are "
                    f"written to {metrics} (a model wrapped in potluck.DataParallel writes "
                    "its step times; torch DDP writes nothing); every worker keeps an equal "
                    "share; call potluck.prepare(model, optimizer, dataset, global_batch=...) "
                    "or drop them"], result.stderr
