"""``potluck bench loader --quick`` runs end to end and writes the figures it names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from potluck.cli import main


@pytest.mark.timeout(120)
def test_the_loader_bench_writes_its_figures(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "loader.json"
    assert main(["bench", "loader", "--quick", "--steps", "10", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    for key in ("workers_vs_in_process", "workers_vs_dataloader"):
        assert math.isfinite(figures[key]) and figures[key] > 0, figures
    for kind in ("io", "cpu"):
        rates = figures["kinds"][kind]["samples_per_s"]
        assert set(rates) == {"in-process", "workers", "dataloader"}
        assert all(math.isfinite(r) and r > 0 for r in rates.values()), rates
    printed = capsys.readouterr().out
    assert "workers_vs_in_process" in printed and "io" in printed
