"""The uneven demo's pure pieces: the shares on screen, the summary, flags, the slowdown."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest
import torch

from potluck.errors import ConfigError
from potluck_lab.demo.cli import add_arguments
from potluck_lab.demo.progress import (
    ProgressBar,
    ProgressLines,
    ShareWatch,
    format_shares,
    format_speeds,
)
from potluck_lab.demo.report import MIN_TIMED_STEPS
from potluck_lab.demo.uneven import (
    SLOW_RANK,
    UNEVEN_QUICK,
    Slowdown,
    choose_cores,
    config_from_args,
    launch_config,
    set_up_slowdown,
    slowdown_lines,
)
from potluck_lab.demo.uneven_report import share_changes, summarize, summary_lines
from potluck_lab.demo.uneven_worker import slow_down_by_sleeping
from potluck_lab.machine.cpu_quota import CpuQuota


def _record(step: int, shares: list[int], speeds: list[float | None] | None = None,
            step_s: float = 0.1, phase: str = "balanced") -> dict[str, Any]:
    return {"kind": "step", "step": step, "loss": 4.0 - 0.01 * step, "step_s": step_s,
            "tokens_per_s": 1000.0, "workers": len(shares), "shares": shares,
            "speeds": speeds or [None] * len(shares), "phase": phase}


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--uneven", *flags])


@pytest.mark.timeout(30)
def test_shares_and_speeds_are_formatted_per_worker() -> None:
    assert format_shares([41, 23]) == "41/23"
    assert format_shares([10, 12, 10]) == "10/12/10"
    assert format_speeds([412.4, None, 1234.0]) == "412/?/1,234"


@pytest.mark.timeout(30)
def test_a_far_move_gets_a_line_and_jitter_is_counted() -> None:
    watch = ShareWatch()
    assert watch.moved(_record(0, [16, 16])) is None  # the first split: nothing moved
    assert watch.moved(_record(1, [16, 16], [300.0, 120.0])) is None
    # A tenth of 32 is 3.2 samples: 16 -> 22 is far. The speeds named are those the new
    # plan was made from: the previous record's.
    assert watch.moved(_record(2, [22, 10], [310.0, 125.0])) == (
        "shares 16/16 -> 22/10 (measured 300/120 samples/s)")
    assert watch.moved(_record(3, [23, 9])) is None  # one sample: jitter
    assert watch.moved(_record(4, [22, 10])) is None
    assert watch.text() == "shares 22/10 (2 changes since the last line)"
    assert watch.text() == "shares 22/10"
    watch.moved(_record(5, [21, 11]))
    watch.moved(_record(6, [20, 12]))
    assert watch.moved(_record(7, [18, 14])) == "shares 22/10 -> 18/14 over 3 changes"
    assert watch.moved(_record(8, [16, 16], phase="equal")) == (
        "balancing off: equal shares 16/16 from here, to measure what balancing gained")
    assert watch.moved(_record(9, [16, 16], phase="equal")) is None


@pytest.mark.timeout(30)
def test_progress_lines_show_the_split_and_its_moves() -> None:
    out = io.StringIO()
    lines = ProgressLines(40, "2 workers", out, clock=lambda: 0.0, shares=True)
    lines.show([_record(0, [8, 8]), _record(1, [8, 8], [200.0, 80.0]),
                _record(2, [11, 5]), _record(3, [12, 4])])
    shown = out.getvalue().splitlines()
    assert shown[0].endswith("  shares 8/8")
    assert shown[1].startswith("2 workers: step  3/40  loss ")
    assert shown[1].endswith("  shares 8/8 -> 11/5 (measured 200/80 samples/s)")
    assert shown[2].startswith("2 workers: step  4/40")  # a tenth of the run
    assert shown[2].endswith("shares 12/4 (1 change since the last line)")
    plain = io.StringIO()  # the plain demo's display is unchanged
    ProgressLines(40, "2 workers", plain, clock=lambda: 0.0).show([_record(0, [8, 8])])
    assert "shares" not in plain.getvalue()


@pytest.mark.timeout(30)
def test_the_bar_prints_a_move_above_itself(capsys: pytest.CaptureFixture[str]) -> None:
    bar = ProgressBar(10, "2 workers", shares=True)
    bar.show([_record(0, [8, 8]), _record(1, [8, 8], [200.0, 80.0]), _record(2, [12, 4])])
    bar.close()
    captured = capsys.readouterr()
    assert "step 3: shares 8/8 -> 12/4 (measured 200/80 samples/s)" in captured.out
    assert "shares=12/4" in captured.err


@pytest.mark.timeout(30)
def test_the_summary_tells_start_end_changes_and_both_throughputs() -> None:
    records = [_record(0, [16, 16]), _record(1, [16, 16], [300.0, 100.0], 0.2)]
    records += [_record(step, [24, 8] if step % 3 else [23, 9], [300.0, 100.0], 0.1)
                for step in range(2, 12)]
    # Then equal shares, balancing off: the first two steps (a new model) are left out.
    records += [_record(step, [16, 16], step_s=1.0 if step < 14 else 0.16, phase="equal")
                for step in range(12, 24)]
    assert [c.step for c in share_changes(records[:12])][:3] == [2, 3, 4]
    summary = summarize(records, global_batch=32, warmup=2)
    assert (summary.first, summary.last, summary.equal) == ((16, 16), (24, 8), (16, 16))
    assert summary.steps == 12 and len(summary.changes) == 7
    assert summary.usual == (24, 8) and summary.ranges == ((23, 24), (8, 9))
    assert summary.step_s == pytest.approx(0.1) and summary.samples_per_s == pytest.approx(320)
    assert summary.equal_step_s == pytest.approx(0.16) and summary.equal_steps == 10
    text = "\n".join(summary_lines(summary, 32))
    assert "16/16 at step 1 -> 24/8 at step 12; it changed 7 times, first at step 3" in text
    assert "most often 24/8 (7 steps); worker 0 23 to 24, worker 1 8 to 9" in text
    assert "measured speeds at the end: 300/100 samples/s" in text
    assert "throughput, balanced: 320.0 samples/s (global batch / median step 100.0 ms)" in text
    assert ("throughput, equal shares (16/16): 200.0 samples/s (median step 160.0 ms over 10 "
            "steps trained after the balanced ones") in text
    assert "balancing made the step 1.60x as fast" in text


@pytest.mark.timeout(30)
def test_a_run_too_short_to_compare_says_so_instead_of_a_gain() -> None:
    """A few equal-share steps after the balanced ones: their median is mostly noise
    (the quick demo once printed "0.99x as fast" from 8)."""
    records = [_record(step, [24, 8], [300.0, 100.0]) for step in range(14)]
    records += [_record(step, [16, 16], step_s=0.1, phase="equal") for step in range(14, 24)]
    text = "\n".join(summary_lines(summarize(records, global_batch=32, warmup=2), 32))
    assert "x as fast" not in text and "0.99x" not in text
    assert ("too short to compare: 8 timed step(s) in the shorter phase, 10 needed; run "
            "potluck demo --uneven") in text


@pytest.mark.timeout(30)
def test_balanced_steps_on_equal_shares_are_not_compared_with_equal_shares() -> None:
    """Workers that measured as fast (another job slowed the fast one too) keep equal
    shares: both phases ran the same split, and their ratio says nothing of balancing."""
    records = [_record(step, [16, 16], [100.0, 101.0]) for step in range(14)]
    records += [_record(step, [16, 16], step_s=0.1, phase="equal") for step in range(14, 26)]
    text = "\n".join(summary_lines(summarize(records, global_batch=32, warmup=2), 32))
    assert "x as fast" not in text
    assert "nothing to compare: the balanced steps too ran mostly on equal shares" in text


def test_the_quick_run_times_enough_steps_of_each_phase_to_compare() -> None:
    quick = UNEVEN_QUICK  # the equal phase leaves out its first 2 steps (a new model)
    assert quick.steps - quick.warmup_steps >= MIN_TIMED_STEPS
    assert quick.equal_steps - 2 >= MIN_TIMED_STEPS


@pytest.mark.timeout(30)
def test_a_run_without_moves_or_equal_steps_says_only_what_it_has() -> None:
    records = [_record(step, [8, 8]) for step in range(4)]
    summary = summarize(records, global_batch=16, warmup=1)
    text = "\n".join(summary_lines(summary, 16))
    assert "the split never changed" in text
    assert "most often" not in text and "equal shares" not in text
    with pytest.raises(ValueError, match="no balanced step records"):
        summarize([], global_batch=16, warmup=1)


@pytest.mark.timeout(30)
def test_flags_that_cannot_go_with_uneven_are_clear_errors() -> None:
    for flags, words in [(["--workers", "1"], "at least 2 workers"),
                         (["--chaos"], "two demos"),
                         (["--resume"], "keeps no checkpoints"),
                         (["--batch-size", "3"], "--batch-size 32"),
                         (["--slow-fraction", "1"], "from 0.01 to below 1")]:
        with pytest.raises(ConfigError, match=words):
            config_from_args(_args(*flags))
    config = config_from_args(_args("--quick", "--steps", "24"))
    assert config.preset.steps == 24 and config.metrics == Path("runs/demo-uneven/metrics.jsonl")


@pytest.mark.timeout(30)
def test_the_sleep_fallback_is_launched_balanced_and_said_so(tmp_path: Path) -> None:
    config = config_from_args(_args("--quick", "--slow-by", "sleep"))
    slowdown = set_up_slowdown(config.slow_by, config.fraction)
    assert slowdown.quota is None
    launch = launch_config(config, slowdown, choose_cores(2, {0, 1}))
    assert launch.balance and launch.nproc_per_node == 2
    args = " ".join(launch.script_args)
    assert "--sleep-fraction 0.4" in args and "--cores 0,1" in args and "--cgroup" not in args
    lines = slowdown_lines(Slowdown(0.4, None, "not running as root (uid 1000)"))
    assert lines[0] == (f"slowed: worker {SLOW_RANK} could not get a CPU quota: not running "
                        "as root (uid 1000)")
    assert "sleeps in every forward pass" in lines[1] and "an emulation" in lines[1]
    quota = CpuQuota("g", period_us=10_000, root=tmp_path).create(0.4)  # a fake root
    assert "gets 0.4 of a core: a CPU quota of 4000 us per 10000 us" in slowdown_lines(
        Slowdown(0.4, quota))[0]


@pytest.mark.timeout(30)
def test_cores_are_pinned_only_when_there_is_one_per_worker() -> None:
    assert choose_cores(2, {3, 1, 2}) == [1, 2]
    assert choose_cores(3, {0, 1}) == []


@pytest.mark.timeout(30)
def test_the_sleep_slowdown_sleeps_per_sample_inside_the_forward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("potluck_lab.demo.uneven_worker.time.sleep", slept.append)
    net = torch.nn.Linear(3, 2)
    slow_down_by_sleeping(net, 0.01)
    net(torch.zeros(5, 3))
    assert slept == [pytest.approx(0.05)]
