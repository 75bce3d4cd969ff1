"""The DDP figures are pure arithmetic on measured seconds."""

from __future__ import annotations

import math

import pytest

from potluck.metrics.figures import (
    percentile,
    scaling_efficiency,
    scaling_figures,
    speedup,
    steady_state,
    summarize_latency,
    throughput,
)


def test_throughput_is_items_per_second() -> None:
    assert throughput(32, 0.5) == 64.0
    with pytest.raises(ValueError, match="positive duration"):
        throughput(32, 0.0)


def test_speedup_and_efficiency_from_step_times() -> None:
    gain = speedup(baseline_step_s=0.2, step_s=0.125)
    assert gain == pytest.approx(1.6)
    assert scaling_efficiency(gain, 2) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="positive step times"):
        speedup(0.2, 0.0)
    with pytest.raises(ValueError, match="world_size"):
        scaling_efficiency(1.0, 0)


def test_percentile_interpolates_between_order_statistics() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile(values, 101)


def test_steady_state_drops_warmup_or_keeps_the_last_half() -> None:
    assert steady_state([9.0, 1.0, 1.0, 1.0], warmup=1) == [1.0, 1.0, 1.0]
    assert steady_state([9.0, 8.0, 1.0, 2.0], warmup=10) == [1.0, 2.0]
    with pytest.raises(ValueError):
        steady_state([], warmup=0)


def test_latency_summary() -> None:
    summary = summarize_latency([0.003, 0.001, 0.002, 0.010])
    assert summary.median_s == pytest.approx(0.0025)
    assert summary.min_s == 0.001
    assert summary.count == 4
    assert 0.003 < summary.p95_s <= 0.010


def test_scaling_figures_use_steady_state_medians() -> None:
    # Warm-up steps are slow and must not count; the medians are 0.1 s and 0.16 s.
    two_workers = [1.0, 0.1, 0.1, 0.11, 0.09]
    one_worker = [2.0, 0.16, 0.16, 0.17]
    figures = scaling_figures(two_workers, one_worker, world_size=2, global_batch=32,
                              tokens_per_sample=64, warmup=1)
    assert figures.step_s == pytest.approx(0.1)
    assert figures.samples_per_s == pytest.approx(320.0)
    assert figures.tokens_per_s == pytest.approx(320.0 * 64)
    assert figures.baseline_step_s == pytest.approx(0.16)
    assert figures.speedup == pytest.approx(1.6)
    assert figures.efficiency == pytest.approx(0.8)


def test_scaling_figures_without_baseline() -> None:
    figures = scaling_figures([0.2, 0.2], None, world_size=2, global_batch=8,
                              tokens_per_sample=1, warmup=0)
    assert figures.speedup is None and figures.efficiency is None
    assert math.isclose(figures.samples_per_s, 40.0)
