"""The pure figures of ``potluck bench plan``."""

from __future__ import annotations

import pytest

from potluck_lab.bench.plan_figures import Compute, error, steady_rate, summary


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
    assert compute.speed(48, 0.2) == pytest.approx(50 / 0.6)
    assert error(110, 100) == pytest.approx(0.1)
    assert summary([0.05, -0.2, 0.1]) == {"median_abs_error": 0.1, "max_abs_error": 0.2}
