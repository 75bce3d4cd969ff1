"""``potluck demo --quick`` as a user runs it: a subprocess, its output and its JSONL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.metrics.journal import read_journal

RECORD_KEYS = {"step", "loss", "step_s", "samples_per_s", "tokens_per_s", "sync_s"}


@pytest.mark.timeout(250)
def test_quick_demo_trains_reports_and_resumes_exactly(tmp_path: Path) -> None:
    """The quick demo as a user runs it; then, as if it had died after step 20, resumed
    from its checkpoint: the resumed losses are bitwise those of the whole run."""
    metrics = tmp_path / "runs" / "metrics.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--quick", "--workers", "2",
         "--steps", "40", "--metrics", str(metrics), *_CHECKPOINTS],
        capture_output=True, timeout=140, cwd=tmp_path,  # bytes: text mode hides '\r'
    )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err[-3000:]

    records = read_journal(metrics)
    assert [r["step"] for r in records] == list(range(40))
    for record in records:
        assert record["kind"] == "step" and record["time"] > 0 and record["pid"] > 0
        assert record.keys() >= RECORD_KEYS
        assert all(isinstance(record[key], (int, float)) for key in RECORD_KEYS)
        assert record["step_s"] > 0 and record["samples_per_s"] > 0
    assert records[-1]["loss"] < records[0]["loss"]

    # Piped, not a terminal: plain progress lines, never a bar redrawn with carriage returns.
    assert "\r" not in out + err
    progress = re.findall(r"^2 workers: step +(\d+)/40  loss \d+\.\d{3}  ", out, re.M)
    assert len(progress) >= 5 and progress[-1] == "40", out
    assert re.search(r"^1 worker: step +\d+/25  loss ", out, re.M), out  # the baseline's
    for figure in ("throughput", "speedup vs 1 worker", "scaling efficiency",
                   "sync latency: barrier", "sync latency: all-reduce"):
        assert figure in out, out
    assert "samples/s" in out and "tokens/s" in out
    # --quick times the full demo's model long enough for a speedup figure (its value
    # is the machine's: other jobs here share the two cores)
    assert re.search(r"speedup vs 1 worker +\d+\.\d\dx ", out), out
    assert "too short to measure" not in out
    assert "generated text" in out
    assert "loss:" in out
    # The 1-worker phase reproduced the 2-worker run's losses (gradients were averaged).
    agreement = re.search(r"computed the same losses to within (\S+) ", out)
    assert agreement is not None, out
    assert float(agreement.group(1)) < 1e-3
    _resume_after_step_20(tmp_path, metrics)


@pytest.mark.timeout(60)
def test_uneven_batch_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--quick", "--workers", "3",
         "--batch-size", "16", "--metrics", str(tmp_path / "m.jsonl")],
        capture_output=True, text=True, timeout=50,
    )
    assert done.returncode == 2
    assert "global batch 16" in done.stderr and "--workers 3" in done.stderr
    assert "use e.g. --batch-size 15" in done.stderr


_CHECKPOINTS = ("--checkpoint-every", "10", "--checkpoint-dir", "ckpt")


def _resume_after_step_20(tmp_path: Path, whole: Path) -> None:
    saved = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt"))
    assert saved == [f"ckpt-{s:012d}.pt" for s in (20, 30, 40)]  # the newest 3 are kept
    for late in saved[1:]:
        (tmp_path / "ckpt" / late).unlink()  # as if the run had died after step 20
    resumed = subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--quick", "--workers", "2", "--steps", "40",
         "--no-baseline", "--no-progress", *_CHECKPOINTS, "--resume",
         "--metrics", str(tmp_path / "resumed.jsonl")],
        capture_output=True, text=True, timeout=100, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from the checkpoint of step 20" in resumed.stdout
    before = {r["step"]: r["loss"] for r in read_journal(whole)}
    after = {r["step"]: r["loss"] for r in read_journal(tmp_path / "resumed.jsonl")}
    assert sorted(after) == list(range(20, 40))
    assert all(after[s] == before[s] for s in after), "resumed losses must be bitwise equal"
