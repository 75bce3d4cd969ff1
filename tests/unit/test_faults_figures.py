"""The figures of ``potluck bench faults`` from hand-made commit logs (no processes)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from potluck_lab.bench.faults import FaultsConfig, kill_due
from potluck_lab.bench.faults_figures import goodput, run_figures, summarize


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


CONFIG = FaultsConfig(workers=3, steps=200, kill_every=2.0, checkpoint_every=10)


@pytest.mark.timeout(10)
def test_first_kill_waits_for_kill_every_seconds_of_full_strength() -> None:
    commits = steady(range(0, 30), 100.0)  # 0.1 s a step
    assert not kill_due(CONFIG, commits, [], now=101.9)
    assert kill_due(CONFIG, commits, [], now=102.0)
    starting = [*steady(range(0, 5), 100.0, world=2), *steady(range(5, 30), 100.5)]
    assert not kill_due(CONFIG, starting, [], now=102.4)  # counts from the first whole step
    assert kill_due(CONFIG, starting, [], now=102.5)


@pytest.mark.timeout(10)
def test_a_slow_job_gets_past_its_next_checkpoint_before_the_next_kill() -> None:
    # torchrun, restarted at generation 1 from the checkpoint at step 10, 0.5 s a step:
    # 2 s of training is 4 steps, so a wall-clock rule alone would kill it before step 20
    # was saved, for ever. The rule waits for checkpoint_every + 1 whole steps.
    before = steady(range(0, 14), 100.0, every=0.5)
    after = steady(range(10, 30), 120.0, generation=1, every=0.5)
    kills = [107.2]
    assert not kill_due(CONFIG, [*before, *after[:10]], kills, now=200.0)
    assert kill_due(CONFIG, [*before, *after[:11]], kills, now=200.0)


@pytest.mark.timeout(10)
def test_after_a_kill_only_the_next_generation_with_every_worker_counts() -> None:
    before = steady(range(0, 20), 100.0)
    late = [commit(20, 102.05)]  # the old generation, landing just after the kill at 102.0
    shrunk = steady(range(21, 60), 102.3, generation=1, world=2)
    kills = [102.0]
    assert not kill_due(CONFIG, [*before, *late, *shrunk], kills, now=200.0)
    whole = steady(range(60, 72), 106.3, generation=2)
    assert not kill_due(CONFIG, [*before, *late, *shrunk, *whole], kills, now=108.2)
    assert kill_due(CONFIG, [*before, *late, *shrunk, *whole], kills, now=108.3)


@pytest.mark.timeout(10)
def test_no_kill_near_the_end() -> None:
    commits = steady(range(0, 185), 100.0)  # 15 steps of 0.1 s left: 1.5 s < end_margin 2
    assert not kill_due(CONFIG, commits, [], now=200.0)
    assert kill_due(CONFIG, commits[:175], [], now=200.0)  # 25 left: 2.5 s
