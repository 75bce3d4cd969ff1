"""The chaos demo's pure pieces: records -> run, event lines, tables, flag checks."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from potluck.errors import ConfigError
from potluck_lab.demo.chaos import (
    CHAOS_QUICK,
    ChaosDriver,
    config_from_args,
    launch_config,
)
from potluck_lab.demo.chaos_report import (
    RejoinWait,
    describe_cause,
    events_table,
    format_event,
    format_kill,
    format_wait,
    loss_milestones,
    parse_run,
    steps_line,
    throughput_rows,
)
from potluck_lab.demo.cli import add_arguments
from potluck_lab.demo.cli import config_from_args as plain_config

FOUNDER, VICTIM, REBORN = "vm:100:aa", "vm:101:bb", "vm:102:cc"


def _records() -> list[dict[str, Any]]:
    """A 9-step run: worker 1 killed after step 2, step 3 redone, back from step 5."""
    records: list[dict[str, Any]] = [
        {"kind": "hello", "pid": 100, "launch_rank": 0, "restart": 0, "time": 0.0},
        {"kind": "hello", "pid": 101, "launch_rank": 1, "restart": 0, "time": 0.0},
        {"kind": "member", "pid": 100, "worker_id": FOUNDER, "time": 1.0},
        {"kind": "member", "pid": 101, "worker_id": VICTIM, "time": 1.0},
        {"kind": "kill", "pid": 7, "target": 101, "launch_rank": 1, "after_step": 2,
         "time": 10.0},
        {"kind": "redo", "pid": 100, "step": 3, "generation": 1, "workers": 1, "time": 11.6},
        # Every member records the generation; the slowest member's recovery counts.
        {"kind": "event", "pid": 100, "generation": 1, "cause": "a collective of the step "
         "failed", "left": [VICTIM], "joined": [], "world_size": 1, "recovery_s": 1.5,
         "time": 11.5},
        {"kind": "hello", "pid": 102, "launch_rank": 1, "restart": 1, "time": 12.0},
        {"kind": "member", "pid": 102, "worker_id": REBORN, "time": 15.0},
        {"kind": "joined", "pid": 102, "step": 5, "time": 15.0},
        {"kind": "event", "pid": 100, "generation": 2, "cause": "boundary", "left": [],
         "joined": [REBORN], "world_size": 2, "recovery_s": 0.02, "time": 15.0},
        {"kind": "done", "pid": 100, "steps": 9, "redone": 1, "left": False,
         "n_params": 1234, "sample": "def x"},
        {"kind": "done", "pid": 102, "steps": 9, "redone": 0, "left": False,
         "n_params": 1234, "sample": None},
        {"kind": "held", "pid": 101, "step": 3, "time": 9.9},  # stopped for the kill
    ]
    for step in range(9):
        workers, generation = (2, 0) if step < 3 else (1, 1) if step < 5 else (2, 2)
        records.append({"kind": "step", "pid": 100, "step": step, "loss": 4.0 - 0.25 * step,
                        "step_s": 0.1 * workers, "workers": workers,
                        "generation": generation, "time": float(step)})
    return records


@pytest.mark.timeout(30)
def test_parse_run_names_processes_and_dedupes_events() -> None:
    run = parse_run(reversed(_records()))  # order of arrival does not matter
    assert run.label(VICTIM) == "worker 1 (pid 101)"
    assert run.label(REBORN) == "worker 1 (pid 102, restart 1)"
    assert run.label("not-an-id") == "not-an-id"
    assert [e.generation for e in run.events] == [1, 2]
    assert run.kill is not None and run.kill.after_step == 2
    assert run.redone == [3] and run.joins == {102: 5} and run.held == {101: 3}
    assert run.rejoin_wait is None
    assert run.final_steps == 9 and run.sample == "def x" and run.n_params == 1234
    assert run.pending_joiners() == []
    slower = {**_records()[6], "pid": 102, "recovery_s": 2.5}
    assert parse_run([*_records(), slower]).events[0].recovery_s == 2.5


@pytest.mark.timeout(30)
def test_event_line_says_generation_cause_who_size_and_recovery() -> None:
    run = parse_run(_records())
    failure, join = run.events
    assert format_event(failure, run) == (
        "generation 1: a collective of the step failed; left: worker 1 (pid 101); "
        "now 1 worker; recovery 1.50 s; 1.5 s after the kill")
    assert format_event(join, run) == (
        "generation 2: admitted at a step boundary with the live state; joined: worker 1 "
        "(pid 102, restart 1); now 2 workers; recovery 0.02 s; 5.0 s after the kill")
    assert describe_cause(failure) == "a collective of the step failed"


@pytest.mark.timeout(30)
def test_wait_for_the_rejoin_is_parsed_and_told() -> None:
    waited = {"kind": "waited", "pid": 100, "step": 4, "waited_s": 2.25, "asked": True,
              "workers": 1, "time": 14.0}
    run = parse_run([*_records(), waited])
    assert run.rejoin_wait == RejoinWait(steps=4, waited_s=2.25, asked=True, workers=1)
    assert format_wait(run.rejoin_wait, "worker 1") == (
        "chaos: step 4 had committed and worker 1 was not back yet: the 1 worker left waited "
        "2.2 s for it to ask to join, so that the run shows the rejoin")
    gave_up = RejoinWait(steps=4, waited_s=60.0, asked=False, workers=2)
    assert format_wait(gave_up, "worker 1").endswith(
        "the 2 workers left waited 60.0 s, but it did not ask to join; the run goes on "
        "without it")


@pytest.mark.timeout(30)
def test_driver_kills_the_victim_once_it_stopped_and_says_where(tmp_path: Path) -> None:
    """Steps committed say nothing to the driver; the victim's ``held`` record does."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        config = config_from_args(_args(metrics=tmp_path / "metrics.jsonl",
                                        no_progress=True))
        config.run_dir.mkdir()
        worker = config.run_dir / f"worker-1-{victim.pid}.jsonl"
        lines: list[str] = []
        driver = ChaosDriver(config, lines.append)

        def append(**record: Any) -> None:
            with worker.open("a") as file:
                file.write(json.dumps({"pid": victim.pid, "time": 1.0, **record}) + "\n")

        append(kind="hello", launch_rank=1, restart=0)
        append(kind="member", worker_id=f"vm:{victim.pid}:aa")
        for step in range(config.kill_at + 3):  # records of steps past kill_at: no cue
            append(kind="step", step=step, loss=1.0, step_s=0.1, workers=2, generation=0)
        driver.start()
        time.sleep(0.3)  # a few polls
        assert victim.poll() is None
        append(kind="held", step=config.kill_at)
        assert victim.wait(timeout=10) == -signal.SIGKILL
        run = driver.stop()
        assert run.kill is not None and run.kill.pid == victim.pid
        assert run.kill.after_step == config.kill_at - 1  # 0-based: step kill_at committed
        assert lines == [format_kill(run.kill, f"worker 1 (pid {victim.pid})")]
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.timeout(30)
def test_kill_line_and_events_table() -> None:
    run = parse_run(_records())
    assert run.kill is not None
    assert format_kill(run.kill, "worker 1 (pid 101)").startswith(
        "chaos: SIGKILL to worker 1 (pid 101) once step 3 had committed")
    table = events_table(run).splitlines()
    assert table[0] == "membership events:"
    assert table[1].split() == ["gen", "cause", "left", "joined", "workers", "recovery",
                                "after", "kill"]
    assert "worker 1 (pid 101)" in table[3] and "1.50 s" in table[3]
    assert "worker 1 (pid 102, restart 1)" in table[4] and "5.0 s" in table[4]
    assert events_table(parse_run([])) == "membership events: none (the cohort never changed)"


@pytest.mark.timeout(30)
def test_steps_line_counts_lost_steps_and_names_the_redone_one() -> None:
    run = parse_run(_records())
    line = steps_line(run, requested=9)
    assert line.startswith("steps: 9 of 9 committed; steps lost: 0 (step 4 was in flight")
    short = parse_run([r for r in _records() if r["kind"] != "done"]
                      + [{"kind": "done", "pid": 100, "steps": 7, "left": False}])
    assert "steps lost: 2" in steps_line(short, requested=9)


@pytest.mark.timeout(30)
def test_loss_milestones_follow_the_run_through_the_kill_and_the_rejoin() -> None:
    line = loss_milestones(parse_run(_records()), window=2)
    assert line == ("loss, mean of 2 steps of rank 0's share: 3.875 start (steps 1-2) -> "
                    "3.625 before the kill (steps 2-3) -> 2.625 after the rejoin (steps 6-7) "
                    "-> 2.125 end (steps 8-9)")


@pytest.mark.timeout(30)
def test_throughput_per_cohort_size_skips_warmup_redone_and_fresh_generations() -> None:
    rows = throughput_rows(parse_run(_records()), global_batch=8, tokens_per_sample=4,
                           warmup=1)
    # 2 workers: steps 1, 2 (gen 0 after warm-up), 6, 7, 8 (gen 2 without its first);
    # 1 worker: step 4 only (3 was redone and is gen 1's first).
    assert [row[0] for row in rows] == ["throughput, 2 workers", "throughput, 1 worker"]
    assert rows[0][1] == "40.0 samples/s, 160 tokens/s" and "over 5 steps" in rows[0][2]
    assert rows[1][1] == "80.0 samples/s, 320 tokens/s" and "over 1 step)" in rows[1][2]


def _args(**overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {"workers": 2, "steps": None, "batch_size": None, "seed": 0,
                              "metrics": Path("runs/demo/metrics.jsonl"), "quick": True,
                              "no_progress": False, "resume": False}
    return argparse.Namespace(**{**values, **overrides})


@pytest.mark.timeout(30)
def test_config_kills_a_third_of_the_way_and_launches_elastically() -> None:
    config = config_from_args(_args())
    assert config.preset.steps == CHAOS_QUICK.steps
    assert config.kill_at == CHAOS_QUICK.steps // 3
    assert config.rejoin_by == 2 * CHAOS_QUICK.steps // 3
    tiny = config_from_args(_args(steps=3))  # the wait still comes before the last step
    assert (tiny.kill_at, tiny.rejoin_by) == (1, 1)
    assert config.run_dir == Path("runs/demo/records")  # beside an explicit --metrics
    launch = launch_config(config, token="s3cret")
    assert launch.elastic and launch.max_restarts == 1 and launch.module
    assert launch.script == "potluck_lab.demo.elastic_worker" and launch.nproc_per_node == 2
    assert "s3cret" not in repr(launch) and "s3cret" not in " ".join(launch.script_args)
    args = " ".join(launch.script_args)
    assert "--victim 1 --kill-at 120 --rejoin-by 240" in args


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("overrides", "expected"), [
    ({"workers": 1}, "--chaos with --workers 1: .* at least 2 workers; use --chaos --workers 2"),
    ({"steps": 2}, "--chaos with --steps 2: .* at least 3 steps"),
    ({"workers": 3, "batch_size": 16}, "global batch 16 .* --workers 3: .* multiple of "
                                       "both; use e.g. --batch-size 12"),
    ({"resume": True}, "--resume with --chaos"),
])
def test_bad_chaos_flags_say_value_rule_and_fix(overrides: dict[str, Any],
                                                expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        config_from_args(_args(**overrides))


@pytest.mark.timeout(30)
def test_chaos_results_never_go_where_the_plain_demo_keeps_its_own() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    plain = plain_config(parser.parse_args([]))
    chaos = config_from_args(parser.parse_args(["--chaos"]))
    assert plain.metrics == Path("runs/demo/metrics.jsonl")  # what `make demo` writes
    assert chaos.metrics == Path("runs/demo-chaos/metrics.jsonl")
    assert chaos.run_dir == Path("runs/demo-chaos/records")
    assert plain.metrics.parent not in (chaos.run_dir, *chaos.run_dir.parents)
    explicit = config_from_args(parser.parse_args(["--chaos", "--metrics", "x/m.jsonl"]))
    assert (explicit.metrics, explicit.run_dir) == (Path("x/m.jsonl"), Path("x/records"))
