"""``potluck run --elastic`` with trust: an attacker is quarantined, removed through the
elastic path, and refused when its launcher restarts it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from potluck.metrics.journal import read_journal
from tests.e2e.helpers import SCRIPTS, potluck_run


@pytest.mark.timeout(150)
def test_attacker_is_quarantined_removed_and_refused_when_it_restarts(tmp_path: Path) -> None:
    refused, out = tmp_path / "refused", tmp_path / "final.pt"
    metrics = tmp_path / "metrics"
    result = potluck_run("--nproc-per-node", "4", "--elastic", "--max-restarts", "1",
                         "--token", "s3cret", "--metrics-dir", str(metrics),
                         str(SCRIPTS / "trust_attacker.py"),
                         "--refused", str(refused), "--out", str(out), timeout=140)
    err = result.stderr
    assert result.returncode == 0, err[-3000:]
    # The attacker was named with its evidence, and left the cohort.
    assert "QuarantinedError: this worker" in err
    assert "far from the center" in err
    # Its restart, from the same seat, was refused with the quarantine's evidence.
    assert "restarting local rank 3 as a new member" in err
    assert refused.exists(), "the restarted attacker was never refused"
    assert "its seat was quarantined: step 1: far from the center" in refused.read_text()
    # The three honest workers agree on who was out and when, and trained on as three.
    done = re.findall(r"worker done after step (\d+): quarantined \['([^']+)'\] at steps "
                      r"\[(\d+)\]; (\d+) workers", err)
    assert len(done) == 3, err[-3000:]
    assert len({(member, step) for _, member, step, _ in done}) == 1
    assert all(int(step) <= 3 and workers == "3" for _, _, step, workers in done), done
    assert all(torch.isfinite(v).all() for v in torch.load(out).values())
    # Each honest worker's journal has the quarantine as an event (the status page and
    # potluck plot show it from there).
    notes = [r for r in read_journal(sorted((metrics / "ranks").glob("*.jsonl")))
             if r["kind"] == "event" and r.get("what") == "quarantine"]
    assert len({r["pid"] for r in notes}) >= 3, notes
    assert {(r["member"], r["step"]) for r in notes} == {(done[0][1], int(done[0][2]))}
    assert all("far from the center" in r["text"] for r in notes)
