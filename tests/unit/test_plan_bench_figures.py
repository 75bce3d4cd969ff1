"""The pure figures of ``potluck bench plan``."""

from __future__ import annotations

import pytest

from potluck_lab.bench.plan_figures import Compute, error, round_parts, steady_rate, summary


@pytest.mark.timeout(10)
def test_steady_rate_leaves_out_the_warm_up() -> None:
    commits = [[0.0, 10], [5.0, 10], [6.0, 10], [7.0, 10]]
    assert steady_rate(commits, 1) == pytest.approx(20 / 2)
    with pytest.raises(ValueError):
        steady_rate(commits, 3)


@pytest.mark.timeout(10)
def test_a_quota_scales_compute_and_errors_are_fractions_of_the_measure() -> None:
    compute = Compute({100: 0.5, 50: 0.3}, quota_ref=0.4)
    assert compute.speed(100, 0.4) == pytest.approx(200)
    assert compute.speed(50, 0.2) == pytest.approx(50 / 0.6)
    # three sizes: the least-squares line, not the nearest point
    noisy = Compute({100: 0.5, 200: 0.8, 300: 1.3}, quota_ref=0.4)
    assert noisy.step_s(200) == pytest.approx(2.6 / 3)  # the line: 0.004 s a sample
    assert noisy.step_s(300) == pytest.approx(2.6 / 3 + 0.4)
    assert Compute({100: 0.5}, quota_ref=0.4).step_s(50) == pytest.approx(0.25)
    assert error(110, 100) == pytest.approx(0.1)
    assert summary([0.05, -0.2, 0.1]) == {"median_abs_error": 0.1, "max_abs_error": 0.2}


@pytest.mark.timeout(10)
def test_sizes_outside_the_hosts_are_refused_with_an_example() -> None:
    import argparse

    from potluck.errors import ConfigError
    from potluck_lab.bench.plan import add_arguments, configure

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert configure(parser.parse_args(["--sizes", "4"])).sizes == (4,)
    with pytest.raises(ConfigError, match=r"e\.g\. 2,3,4"):
        configure(parser.parse_args(["--sizes", "1,9"]))


@pytest.mark.timeout(10)
def test_a_rounds_parts_are_its_slowest_members_compute_and_the_median_sync() -> None:
    ranks = [[[9.0, 0.0, 9.0], [0.30, 0.10, 0.05], [0.32, 0.08, 0.07]],
             [[9.0, 0.0, 9.0], [0.40, 0.00, 0.06], [0.36, 0.00, 0.05]]]
    parts = round_parts(ranks, skip=1)  # the first round (one-off costs) left out
    assert parts["compute_s"] == pytest.approx(0.38)  # rounds' slowest: 0.40 and 0.36
    assert parts["sync_s"] == pytest.approx(0.0575)  # rounds' medians: 0.055 and 0.06


@pytest.mark.timeout(10)
def test_round_parts_of_a_run_without_steady_rounds_are_empty() -> None:
    assert round_parts([], skip=1) == {}
    assert round_parts([[[0.3, 0.0, 0.1]]], skip=1) == {}
