"""``examples/cohort.py`` runs as written under ``potluck run --elastic``: every mode at
once (elastic, balanced shares, int8 gradients, trust), and with
``--far`` speed-planned DiLoCo rounds with int8 pseudo-gradients and trust."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.helpers import ROOT, potluck_run


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [[], ["--far"]], ids=["every-step", "far"])
def test_the_cohort_example_trains_with_every_mode_on(tmp_path: Path, mode: list[str]) -> None:
    token = tmp_path / "token"
    token.write_text("a-test-token-of-the-cohort\n")
    result = potluck_run("--elastic", "--token-file", str(token), "--nproc-per-node", "3",
                         "--max-restarts", "1", "--balance", str(ROOT / "examples" / "cohort.py"),
                         "--epochs", "2", "--checkpoint-dir", str(tmp_path / "ckpt"), *mode,
                         timeout=100)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([0-9.]+), \d+ steps, 3 workers",
                                           said)]
    assert len(losses) == 2 and losses[1] < losses[0], said[-3000:]
    assert "quarantine" not in said  # (honest workers, every mode on)
