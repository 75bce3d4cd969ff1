"""A run's record of one machine from its workers' journals, and its identity file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from potluck.reputation.identity import worker_identity
from potluck.reputation.summary import summarize


def _step(pid: int, step: int, t: float, host: str = "h", speed: float = 100.0,
          generation: int = 0) -> dict[str, Any]:
    return {"kind": "rank_step", "time": t, "pid": pid, "step": step, "host": host,
            "worker": f"{host}:{pid}", "generation": generation, "samples_per_s": speed}


def _summary(records: list[dict[str, Any]], nproc: int = 2,
             failed: bool = False) -> Any:
    return summarize(records, host="h", nproc=nproc, run="r", worker="me", began=0.0,
                     ended=100.0, failed=failed)


@pytest.mark.timeout(10)
def test_two_steady_workers_sum_their_speeds_and_count_their_time() -> None:
    records = [_step(pid, s, 10.0 + s, speed=50.0 + pid) for s in range(20)
               for pid in (1, 2)]
    records += [_step(9, s, 10.0 + s, host="other") for s in range(20)]  # not ours
    r = _summary(records)
    assert r.samples_per_s == pytest.approx(103.0)  # 51 + 52 at each step
    assert r.in_cohort_s == pytest.approx(19.0)  # 19 one-second gaps per worker, / 2
    assert (r.losses, r.restarts, r.run_s) == (0, 0, 100.0)


@pytest.mark.timeout(10)
def test_a_worker_that_stopped_early_and_came_back_is_a_loss_and_a_restart() -> None:
    records = [_step(1, s, float(s)) for s in range(60)]
    records += [_step(2, s, float(s)) for s in range(10)]  # lost after 10 s
    records += [_step(3, s, 40.0 + s - 30) for s in range(30, 60)]  # back at 40 s
    r = _summary(records)
    assert (r.losses, r.restarts) == (1, 1)
    assert r.in_cohort_s == pytest.approx((59 + 9 + 29) / 2)  # the 30 s out not counted


@pytest.mark.timeout(10)
def test_strikes_and_a_quarantine_about_our_workers_count() -> None:
    records = [_step(1, s, float(s)) for s in range(5)]
    records += [{"kind": "event", "time": 3.0, "what": "strike", "member": "h:1"},
                {"kind": "event", "time": 3.5, "what": "strike", "member": "x:7"},
                {"kind": "event", "time": 4.0, "what": "quarantine", "member": "h:1"}]
    r = _summary(records, nproc=1, failed=True)
    assert (r.strikes, r.quarantined, r.losses) == (1, True, 1)


@pytest.mark.timeout(10)
def test_the_identity_is_made_once_and_kept(tmp_path: Path) -> None:
    first = worker_identity(tmp_path / "cache")
    assert first == worker_identity(tmp_path / "cache")
    assert first != worker_identity(tmp_path / "elsewhere")
    assert (tmp_path / "cache" / "worker-id").read_text().strip() == first
