"""``potluck demo --quick`` as a user runs it: a subprocess, its output and its JSONL."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.metrics.journal import read_journal

RECORD_KEYS = {"step", "loss", "step_s", "samples_per_s", "tokens_per_s", "sync_s"}


@pytest.mark.timeout(150)
def test_quick_demo_trains_and_reports(tmp_path: Path) -> None:
    metrics = tmp_path / "runs" / "metrics.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--quick", "--workers", "2",
         "--steps", "40", "--metrics", str(metrics)],
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
    assert "generated text" in out
    assert "loss:" in out
    # The 1-worker phase reproduced the 2-worker run's losses (gradients were averaged).
    agreement = re.search(r"computed the same losses to within (\S+) ", out)
    assert agreement is not None, out
    assert float(agreement.group(1)) < 1e-3


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


def _demo(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "potluck", "demo", "--quick", "--workers", "2", "--steps", "30",
         "--no-baseline", "--no-progress", "--checkpoint-every", "10",
         "--checkpoint-dir", str(tmp_path / "ckpt"), *flags],
        capture_output=True, text=True, timeout=140, cwd=tmp_path,
    )


@pytest.mark.timeout(200)
def test_demo_resumes_from_its_checkpoint_exactly(tmp_path: Path) -> None:
    whole = _demo(tmp_path, "--metrics", str(tmp_path / "whole.jsonl"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    saved = sorted(p.name for p in (tmp_path / "ckpt").glob("ckpt-*.pt"))
    assert saved == [f"ckpt-{s:012d}.pt" for s in (10, 20, 30)]
    for late in ("ckpt-000000000020.pt", "ckpt-000000000030.pt"):
        (tmp_path / "ckpt" / late).unlink()  # as if the run had died after step 10

    resumed = _demo(tmp_path, "--resume", "--metrics", str(tmp_path / "resumed.jsonl"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from the checkpoint of step 10" in resumed.stdout
    before = {r["step"]: r["loss"] for r in read_journal(tmp_path / "whole.jsonl")}
    after = {r["step"]: r["loss"] for r in read_journal(tmp_path / "resumed.jsonl")}
    assert sorted(after) == list(range(10, 30))
    assert all(after[s] == before[s] for s in after), "resumed losses must be bitwise equal"
