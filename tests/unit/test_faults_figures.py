"""The figures of ``potluck bench faults`` from hand-made commit logs (no processes)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from potluck.bench.faults_figures import goodput, run_figures, summarize


def commit(step: int, t: float, generation: int = 0, world: int = 3) -> dict[str, Any]:
    return {"kind": "step", "time": t, "pid": 1, "step": step, "generation": generation,
            "workers": world}


def done(steps: int, t: float) -> dict[str, Any]:
    return {"kind": "done", "time": t, "pid": 1, "steps": steps}


def redo(step: int, generation: int, t: float) -> dict[str, Any]:
    return {"kind": "redo", "time": t, "pid": 1, "step": step, "generation": generation,
            "workers": 2}


def steady(steps: range, start: float, generation: int = 0, world: int = 3,
           every: float = 0.1) -> list[dict[str, Any]]:
    return [commit(s, start + i * every, generation, world) for i, s in enumerate(steps)]


@pytest.mark.timeout(10)
def test_no_kills() -> None:
    records = [*steady(range(1, 11), 100.0), done(10, 101.0)]
    figures = run_figures(records, [], world_size=3)
    assert (figures.steps, figures.commits, figures.steps_lost, figures.redone) == (10, 10, 0, 0)
    assert figures.done and figures.kills == ()
    assert figures.wall_s == pytest.approx(0.9)
    assert figures.steps_per_s == pytest.approx(10.0)


@pytest.mark.timeout(10)
def test_torchrun_restart_loses_the_steps_since_the_checkpoint() -> None:
    # Steps 1-14 in attempt 0, killed at t=10.45; checkpoint at 10; attempt 1 redoes 11-14.
    records = [*steady(range(1, 15), 9.1), *steady(range(11, 21), 20.0, generation=1),
               done(20, 21.0)]
    figures = run_figures(records, [10.45], world_size=3)
    assert figures.steps == 20
    assert figures.commits == 24
    assert figures.steps_lost == 4
    (kill,) = figures.kills
    assert kill.lost == 4
    assert kill.recovery_s == pytest.approx(20.0 - 10.45)  # step 11 again
    assert kill.catch_up_s == pytest.approx(20.4 - 10.45)  # step 15, new work
    assert kill.whole_s == pytest.approx(kill.recovery_s)  # every worker restarted
    assert figures.wall_s == pytest.approx(20.9 - 9.1)


@pytest.mark.timeout(10)
def test_potluck_redoes_the_step_in_flight_and_loses_nothing() -> None:
    records = [
        *steady(range(1, 6), 1.0),  # steps 1-5 at t=1.0..1.4, the kill at 1.45
        redo(6, 1, 3.0),
        *steady(range(6, 9), 3.1, generation=1, world=2),  # survivors, 2 workers
        *steady(range(9, 12), 5.0, generation=2),  # the restarted worker is back
        done(11, 5.3),
    ]
    figures = run_figures(records, [1.45], world_size=3)
    assert (figures.steps, figures.steps_lost, figures.redone) == (11, 0, 1)
    (kill,) = figures.kills
    assert kill.lost == 0
    assert kill.recovery_s == pytest.approx(3.1 - 1.45)
    assert kill.catch_up_s == pytest.approx(kill.recovery_s)
    assert kill.whole_s == pytest.approx(5.0 - 1.45)


@pytest.mark.timeout(10)
def test_a_commit_landing_just_after_the_kill_counts_as_before_it() -> None:
    # Step 6's collectives had completed when the kill landed: committed at 1.46.
    records = [*steady(range(1, 7), 0.96), *steady(range(7, 9), 3.0, generation=1, world=2)]
    (kill,) = run_figures(records, [1.45], world_size=3).kills
    assert kill.lost == 0
    assert kill.recovery_s == pytest.approx(3.0 - 1.45)
    assert math.isnan(kill.whole_s)  # never back to 3 workers in this log


@pytest.mark.timeout(10)
def test_a_kill_the_job_never_recovered_from() -> None:
    figures = run_figures(steady(range(1, 4), 1.0), [5.0], world_size=3)
    assert not figures.done
    (kill,) = figures.kills
    assert math.isnan(kill.recovery_s) and kill.lost == 0


@pytest.mark.timeout(10)
def test_empty_log() -> None:
    figures = run_figures([], [], world_size=3)
    assert figures.steps == 0 and math.isnan(figures.wall_s) and math.isnan(figures.steps_per_s)


@pytest.mark.timeout(10)
def test_goodput_and_summary() -> None:
    assert goodput(9.0, 10.0) == pytest.approx(0.9)
    assert math.isnan(goodput(9.0, 0.0))
    clean = [run_figures(steady(range(1, 11), 0.0, every=1.0), [], world_size=3)] * 2
    faulty = [
        run_figures([*steady(range(1, 4), 0.0, every=1.0),
                     *steady(range(2, 11), 5.0, generation=1, every=1.0)], [2.5],
                    world_size=3),
        run_figures([*steady(range(1, 4), 0.0, every=1.0),
                     *steady(range(4, 11), 4.5, generation=1, every=1.0)], [2.5],
                    world_size=3),
    ]
    summary = summarize(faulty, clean)
    assert summary["kills"] == 2
    assert summary["steps_lost"] == 2  # steps 2 and 3 of the first round
    assert summary["steps"] == 10
    assert summary["recovery_median_s"] == pytest.approx((2.5 + 2.0) / 2)
    assert summary["recovery_max_s"] == pytest.approx(2.5)
    # wall 13 s and 10.5 s against 9 s fault-free
    assert summary["goodput"] == pytest.approx((9 / 13 + 9 / 10.5) / 2)
    assert math.isnan(summarize(clean)["goodput"])
    assert math.isnan(summarize(clean)["recovery_median_s"])


@pytest.mark.timeout(10)
def test_every_worker_logs_and_each_step_counts_once() -> None:
    # Worker A (killed at 1.45) logged steps 1-4 but died before logging step 5, which
    # the survivors B and C committed (and logged, later) in the same generation.
    a = steady(range(1, 5), 1.0)
    b = [*steady(range(1, 6), 1.01), redo(6, 1, 3.0),
         *steady(range(6, 8), 3.1, generation=1, world=2)]
    c = [*steady(range(1, 6), 1.02), redo(6, 1, 3.01),
         *steady(range(6, 8), 3.12, generation=1, world=2), done(7, 3.3)]
    figures = run_figures([*a, *b, *c], [1.45], world_size=3)
    assert (figures.steps, figures.commits, figures.steps_lost, figures.redone) == (7, 7, 0, 1)
    assert figures.kills[0].recovery_s == pytest.approx(3.1 - 1.45)
    assert figures.wall_s == pytest.approx(3.2 - 1.0)
