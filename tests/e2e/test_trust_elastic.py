"""``potluck run --elastic`` with trust: an attacker is quarantined, removed through the
elastic path, not restarted by its launcher, and refused when it comes back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from potluck.metrics.journal import read_journal
from tests.e2e.helpers import SCRIPTS, potluck_run


@pytest.mark.timeout(150)
@pytest.mark.parametrize("rounds", [0, 4], ids=["every step", "DiLoCo(4)"])
def test_attacker_is_quarantined_not_restarted_and_refused_when_it_returns(
        tmp_path: Path, rounds: int) -> None:
    """Every step, or in rounds of 4 local steps (the attacker's pseudo-gradients x -10;
    a step here is a round)."""
    refused, out = tmp_path / "refused", tmp_path / "final.pt"
    metrics = tmp_path / "metrics"
    result = potluck_run("--nproc-per-node", "4", "--elastic", "--max-restarts", "1",
                         "--token", "s3cret-token", "--metrics-dir", str(metrics),
                         str(SCRIPTS / "trust_attacker.py"), "--diloco", str(rounds),
                         "--refused", str(refused), "--out", str(out), timeout=140)
    err = result.stderr
    assert result.returncode == 0, err[-3000:]
    # The attacker was named with its evidence, and left the cohort.
    assert "QuarantinedError: this worker" in err
    assert "far from the center" in err
    # Its launcher did not spend a restart on it (its seat is banned); its own try to
    # join again from the same seat was refused with the quarantine's evidence.
    assert "restarting local rank 3" not in err
    assert "local rank 3 was quarantined by the cohort's trust checks: not restarted" in err
    assert refused.exists(), "the attacker's return was never refused"
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


@pytest.mark.timeout(150)
def test_a_joiner_fingerprints_on_the_cohorts_schedule(tmp_path: Path) -> None:
    """With ``fingerprint_every=3`` a worker that joins mid-run (a crashed one restarted
    as a new member, with the live state) must compare its fingerprint in the same
    steps as the others (it takes their step count from the live state): otherwise it
    sends "not compared" where they compare, and looks diverged. It also spot-checks
    one step in 2, through the crash's redone step and the joiner's first steps (the
    parameters are copied before the update on a checked step, and a new generation
    drops what was kept). Nobody is struck or repaired, every picked check runs, and
    every replica ends bitwise equal."""
    crashed, out = tmp_path / "crashed", tmp_path / "final.pt"
    result = potluck_run("--nproc-per-node", "3", "--elastic", "--max-restarts", "1",
                         "--min-workers", "3", "--min-workers-timeout", "100",
                         "--token", "s3cret-token", str(SCRIPTS / "trust_joiner.py"),
                         "--crashed", str(crashed), "--out", str(out), timeout=140)
    err = result.stderr
    assert result.returncode == 0, err[-3000:]
    assert crashed.read_text() == "8"
    assert "joined at step" in err, err[-3000:]  # the restart came back as a joiner
    joined = int(re.findall(r"joined at step (\d+) with the cohort's live state", err)[0])
    # (the survivors wait below --min-workers 3, so it joins right after the crash, and
    # its first step, 9, is one the cohort compares: a joiner counting from 0 would not)
    assert joined == 8, joined
    done = re.findall(r"worker done after step (\d+): (\d+) workers; strikes \[(.*)\]; "
                      r"events \[(.*)\]; spot checks (\d+) run, (\d+) not; "
                      r"fingerprint (0x[0-9a-f]+)", err)
    assert len(done) == 3, err[-3000:]
    assert all(step == "30" and workers == "3" for step, workers, *_ in done), done
    assert all(strikes == "" and events == "" for _, _, strikes, events, *_ in done), done
    assert all(int(ran) > 0 and not_run == "0" for *_, ran, not_run, _ in done), done
    assert len({fp for *_, fp in done}) == 1, done  # every replica alike
    assert all(torch.isfinite(v).all() for v in torch.load(out).values())
