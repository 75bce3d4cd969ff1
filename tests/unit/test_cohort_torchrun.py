"""The cohort bench's torchrun contender, its pure parts: the steps redone at each
fault, potluck's time to target against torchrun's, the limit, the attacker's steps,
and the report."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from potluck_lab.bench import cohort_figures as fig
from potluck_lab.bench import cohort_report as report
from potluck_lab.bench.cohort import order
from potluck_lab.bench.cohort_plan import QUICK, CohortConfig, schedule, torchrun_limit
from potluck_lab.bench.cohort_torchrun import attack_steps, ddp_job_args


def _start(at: float, rank: int, resumed: int) -> dict[str, Any]:
    return {"kind": "start", "at": at, "rank": rank, "resumed": resumed}


def _commit(at: float, steps: int) -> dict[str, Any]:
    return {"kind": "commit", "at": at, "steps": steps}


@pytest.mark.timeout(10)
def test_a_restart_redoes_the_steps_past_the_checkpoint_it_resumed_from() -> None:
    first = fig.Worker(0, records=[_start(0.0, 0, 0), *(_commit(1.0 + s, s) for s in
                                                          range(1, 26))])
    other = fig.Worker(1, records=[_start(0.0, 1, 0), _commit(30.0, 25)])
    # the group restarts from step 20 (its newest checkpoint) after step 25
    again = fig.Worker(0, records=[_start(40.0, 0, 20), _commit(41.0, 21), _commit(42.0, 22)])
    helper = fig.Worker(2, records=[_start(40.1, 1, 20)])  # (rank 1: not the group's start)
    # then from 20 again, before anything past it committed
    third = fig.Worker(0, records=[_start(50.0, 0, 20)])
    workers = [first, other, again, helper, third]
    assert fig.group_starts(workers) == [(0.0, 0), (40.0, 20), (50.0, 20)]
    assert fig.steps_redone(workers) == [(40.0, 5), (50.0, 2)]
    # restarts after each fault until the next one; none before the first
    assert fig.redone_at_faults([(5.0, 9), (40.0, 5), (50.0, 2), (70.0, 4)],
                                [10.0, 45.0, 60.0]) == [5, 2, 4]
    assert fig.redone_at_faults([], [1.0]) == [0]


def _run(name: str, seconds: float | None, limit: float = 100.0) -> dict[str, Any]:
    return {"contender": name, "time_to_target_s": seconds, "limit_s": limit}


@pytest.mark.timeout(10)
def test_potlucks_time_over_torchruns_and_its_goal() -> None:
    assert report.versus_torchrun({"potluck": _run("potluck", 3.0),
                                   "torchrun": _run("torchrun", 120.0)}) == {
        "ratio": 0.025, "torchrun_reached": True, "met": True}
    assert report.versus_torchrun({"potluck": _run("potluck", 5.0),
                                   "torchrun": _run("torchrun", 120.0)})["met"] is False
    # torchrun never got there: a bound over its limit; the goal is a tenth of the limit
    bound = report.versus_torchrun({"potluck": _run("potluck", 9.0),
                                    "torchrun": _run("torchrun", None, 100.0)})
    assert bound == {"ratio": 0.09, "torchrun_reached": False, "met": True}
    assert report.versus_torchrun({"potluck": _run("potluck", 11.0),
                                   "torchrun": _run("torchrun", None, 100.0)})["met"] is False
    # torchrun gave up before its limit (every agent exited): no bound, no goal met
    gave_up = {**_run("torchrun", None, 2400.0), "gave_up_s": 600.0}
    assert report.versus_torchrun({"potluck": _run("potluck", 9.0), "torchrun": gave_up}) \
        == {"ratio": None, "torchrun_reached": False, "met": None}
    # nothing to compare
    assert report.versus_torchrun({"potluck": _run("potluck", None),
                                   "torchrun": _run("torchrun", 50.0)}) is None
    assert report.versus_torchrun({"potluck": _run("potluck", 3.0)}) is None


@pytest.mark.timeout(10)
def test_torchruns_limit_is_the_flag_else_the_goals_times_potlucks_time() -> None:
    config = CohortConfig()
    assert torchrun_limit(config, 120.0) == 3600.0  # (30x: short of it is the goal met)
    assert torchrun_limit(config, None) == config.limit_s
    assert torchrun_limit(replace(config, torchrun_limit_s=50.0), 120.0) == 50.0
    assert order(("torchrun", "potluck-step", "potluck")) == ["potluck-step", "potluck",
                                                              "torchrun"]


@pytest.mark.timeout(10)
def test_only_the_attackers_worker_flips_and_within_the_attack() -> None:
    config = CohortConfig()
    total = config.samples * config.epochs // config.global_batch
    for seed in range(20):
        attack = next(f for f in schedule(seed) if f.kind == "attack")
        first, last = attack_steps(attack, total)
        assert int(attack.at * total) == first < last <= int(attack.until * total) + 1
        for host in range(4):
            argv = ddp_job_args(config, host, Path("/run"), (attack.node, (first, last)))
            assert ("--attack-steps" in argv) == (host == attack.node)
            assert argv[argv.index("--node-dir") + 1] == f"/run/checkpoints{host}"


@pytest.mark.timeout(10)
def test_torchruns_held_out_loss_is_read_every_10_steps_whatever_potlucks_rounds() -> None:
    attack = (1, (2, 4))
    for inner_steps in (4, 10, 30):
        argv = ddp_job_args(replace(CohortConfig(), inner_steps=inner_steps), 0, Path("/run"),
                            attack)
        assert argv[argv.index("--eval-every") + 1] == "10"
    argv = ddp_job_args(QUICK, 0, Path("/run"), attack)
    assert argv[argv.index("--eval-every") + 1] == "4"


def _potluck_run(once: bool) -> dict[str, Any]:
    return {"contender": "potluck", "time_to_target_s": 10.0, "wall_s": 20.0,
            "exactly_once": once, "replicas_equal": True, "quarantine": None,
            "samples_lost": 0, "samples_twice": 0, "finishers": 2, "link_bytes": []}


def _torchrun_run() -> dict[str, Any]:
    return {"contender": "torchrun", "time_to_target_s": None, "limit_s": 200.0,
            "wall_s": 200.0, "exactly_once": None, "replicas_equal": None,
            "quarantine": None, "samples_lost": None, "restarts": 2, "steps_redone": 7,
            "samples_redone": 224, "finishers": 0, "link_bytes": [],
            "faults": [{"kind": "kill", "steps_redone": 7, "samples_redone": 224}]}


@pytest.mark.timeout(10)
def test_the_report_reads_torchruns_run_beside_potlucks() -> None:
    results = {"runs": [_potluck_run(True), _torchrun_run()]}
    out = report.payload(CohortConfig(), results)
    assert out["time_to_target_vs_torchrun"] == 0.05
    assert out["torchrun_reached_target"] is False and out["time_to_target_goal_met"] is True
    assert out["exactly_once"] is True and out["samples_lost"] == 0  # (potluck's checks)
    assert report.payload(QUICK, results)["time_to_target_vs_torchrun"] is None
    assert report.exit_code(results) == 0
    assert report.exit_code({"runs": [_potluck_run(False), _torchrun_run()]}) == 1
    text = "\n".join(report.lines(CohortConfig(), results))
    assert "not reached within 200 s" in report.line(_torchrun_run())
    assert "kill 7 (224 samples)" in text
    assert "under 0.050 (torchrun did not reach it within 200 s" in text
    gave_up = {**_torchrun_run(), "gave_up_s": 61.0}
    assert "torchrun gave up after 61 s (every agent exited" in report.line(gave_up)
    results = {"runs": [_potluck_run(True), gave_up]}
    out = report.payload(CohortConfig(), results)
    assert out["time_to_target_vs_torchrun"] is None and out["time_to_target_goal_met"] is None
    assert "unknown (torchrun gave up after 61 s, before its limit of 200 s" in \
        "\n".join(report.lines(CohortConfig(), results))


def _configure(*argv: str) -> CohortConfig:
    import argparse

    from potluck_lab.bench.cohort import add_arguments, configure

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return configure(parser.parse_args(list(argv)))


def test_the_target_loss_is_seed_0s_unless_given_and_a_bad_one_is_refused() -> None:
    """The seed picks the job's corpus too, so another seed may need its own target."""
    from potluck.errors import ConfigError

    assert _configure().target_loss == 2.6 and _configure("--quick").target_loss == 3.2
    assert _configure("--seed", "1", "--target-loss", "2.75").target_loss == 2.75
    with pytest.raises(ConfigError, match=r"--target-loss 0: give a positive held-out loss"):
        _configure("--target-loss", "0")


def test_a_potluck_contenders_limit_is_the_flag_and_a_bad_one_is_refused() -> None:
    from potluck.errors import ConfigError

    assert _configure().limit_s == 1800.0 and _configure("--quick").limit_s == 150.0
    assert _configure("--limit", "600").limit_s == 600.0
    with pytest.raises(ConfigError, match=r"--limit -5: give a positive number of seconds"):
        _configure("--limit", "-5")


def test_a_contender_halted_at_its_limit_says_so_and_still_counts_its_checks() -> None:
    halted = {**_potluck_run(True), "contender": "potluck-step", "time_to_target_s": None,
              "limit_s": 600.0, "halted_at": 41, "halt_missed": False, "epochs": 2}
    assert report.line(halted).startswith(
        "potluck-step: target not reached within its limit of 600 s, halted after commit 41 "
        "(2 whole epoch(s) checked for samples never trained), run 20.0 s, exactly once True")
    assert report.line(_potluck_run(True)).startswith("potluck: target reached in 10.0 s, run")
    results = {"runs": [_potluck_run(True), halted, _torchrun_run()]}
    out = report.payload(CohortConfig(), results)
    assert out["exactly_once"] is True and out["replicas_equal"] is True
    assert report.exit_code(results) == 0
    assert report.exit_code({"runs": [_potluck_run(True), {**halted, "exactly_once": False}]}) \
        == 1
    # told to halt and still running HALT_S later: said, and a failed run
    missed = {**halted, "halt_missed": True, "replicas_equal": None}
    assert "told to halt after commit 41 and not ended 300 s later" in report.line(missed)
    assert report.exit_code({"runs": [_potluck_run(True), missed]}) == 1
