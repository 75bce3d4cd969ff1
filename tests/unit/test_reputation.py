"""The reputation record: its file, and the standing it gives a worker (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from potluck.reputation import RunRecord, append, load, standing
from potluck.reputation.standing import DAY_S, PRIOR_AVAILABILITY, WEEK_S

NOW = 1_800_000_000.0


def _run(worker: str, days_ago: float, *, losses: int = 0, in_cohort: float = 3600.0,
         quarantined: bool = False, speed: float | None = 100.0) -> RunRecord:
    return RunRecord(NOW - days_ago * DAY_S, f"run-{days_ago}", worker, speed, in_cohort,
                     3600.0, losses=losses, quarantined=quarantined)


@pytest.mark.timeout(10)
def test_records_append_and_read_back_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "reputation.jsonl"
    assert load(path) == []
    first = [_run("a", 1), _run("b", 2, losses=1)]
    assert append(path, first) == 2
    with path.open("a") as f:
        f.write('{"v": 1, "time": 3, "wor')  # a run killed while writing
    append(path, [_run("a", 0.5)])
    assert load(path) == [*first, _run("a", 0.5)]


@pytest.mark.timeout(10)
def test_a_machine_that_vanished_ranks_below_a_steady_one_and_an_unknown_one() -> None:
    records = [_run("steady", d) for d in (1, 2, 3, 4)]
    records += [_run("flaky", d, losses=1, in_cohort=1200.0) for d in (1, 2, 3)]
    steady, flaky = standing(records, "steady", NOW), standing(records, "flaky", NOW)
    unknown = standing(records, "new", NOW)
    assert steady.losses_per_h < unknown.losses_per_h < flaky.losses_per_h
    assert flaky.availability < unknown.availability == pytest.approx(PRIOR_AVAILABILITY)
    assert steady.availability > unknown.availability
    assert flaky.losses == 3 and flaky.runs == 3 and steady.samples_per_s == 100.0
    assert steady.excluded is None


@pytest.mark.timeout(10)
def test_a_quarantine_in_the_window_excludes_and_an_old_one_is_forgotten() -> None:
    recent = [_run("q", 2, quarantined=True)]
    assert standing(recent, "q", NOW).excluded == "quarantined in a run of the last week"
    old = [_run("q", WEEK_S / DAY_S + 1, quarantined=True)]
    assert standing(old, "q", NOW).excluded is None
