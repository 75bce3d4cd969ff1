"""``potluck plan`` on a candidates file, as a user runs it (in process: no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from potluck.cli import main
from potluck.errors import ConfigError
from potluck.plan.candidates import parse
from potluck.reputation import RunRecord, append

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plan-candidates.toml"


@pytest.mark.timeout(60)
def test_plan_prints_every_mode_and_the_best_choice_with_reasons(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", str(EXAMPLE), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for mode in ("every step", "every step, int8", "DiLoCo H=10", "DiLoCo H=200",
                 "Streaming DiLoCo H=200 P=4, int8"):
        assert mode in printed
    plan = json.loads(out.read_text())
    assert len(plan["together"]) == 6 and plan["best"] is not None
    every = plan["choices"][0]
    assert "m1" not in every["members"]  # its 8 Mbit/s uplink


@pytest.mark.timeout(60)
def test_a_record_ranks_a_vanishing_machine_down(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import time

    record = tmp_path / "reputation.jsonl"
    now = time.time()
    append(record, [RunRecord(now - 3600 * k, f"r{k}", "m0", 100.0, 600.0, 3600.0, losses=3)
                    for k in range(1, 4)])
    append(record, [RunRecord(now - 3600, "r9", "m2", 80.0, 3600.0, 3600.0,
                              quarantined=True)])
    out = tmp_path / "plan.json"
    assert main(["plan", str(EXAMPLE), "--inner-steps", "50", "--reputation", str(record),
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert all("m2" not in (c or {"members": []})["members"] for c in plan["choices"])
    assert any(line.startswith("m2: quarantined") for line in plan["left_out"])


@pytest.mark.timeout(10)
def test_a_file_without_a_rate_says_which_field_and_an_example() -> None:
    with pytest.raises(ConfigError, match=r"machine 'a': up_mbit is missing; e\.g\. up_mbit"):
        parse({"job": {"global_batch": 8}, "machine": [{"name": "a", "speed": 1}]})
    with pytest.raises(ConfigError, match="within_h"):
        parse({"job": {"global_batch": 8}, "target": {"within_h": 10},
               "machine": [{"name": "a", "speed": 1, "up_mbit": 1, "down_mbit": 1}]})
