"""The WAN bench's pure parts: time to target, loss at equal samples, the tc arguments."""

from __future__ import annotations

from potluck.bench.wan_figures import (
    first_at_or_below,
    loss_at,
    mean_gaps,
    median,
    ratio,
    steps_to_target,
)
from potluck.harness.netns import tbf_args

CURVE = [[320, 1.0, 3.0], [640, 2.0, 2.5], [960, 3.0, 2.2], [1280, 4.0, 2.1]]


def test_the_first_point_at_or_below_the_target() -> None:
    assert first_at_or_below(CURVE, 2.5) == [640, 2.0, 2.5]
    assert first_at_or_below(CURVE, 2.0) is None
    assert steps_to_target(CURVE, 2.2, 32) == 30
    assert steps_to_target(CURVE, 1.0, 32) is None


def test_loss_at_equal_samples_and_ratios() -> None:
    assert loss_at(CURVE, 960) == 2.2 and loss_at(CURVE, 2000) is None
    assert abs(loss_at(CURVE, 1120) - 2.15) < 1e-12  # between two points: interpolated
    assert ratio(10.0, 0.5) == 20.0 and ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_tbf_caps_a_device_egress() -> None:
    assert tbf_args("veth0", "10mbit") == ["qdisc", "replace", "dev", "veth0", "root", "tbf",
                                           "rate", "10mbit", "burst", "64kb", "latency",
                                           "500ms"]


def test_the_loss_gap_is_averaged_over_the_data_seeds() -> None:
    """Seed by seed against ddp's loss on the same seed, then the mean; a contender that
    missed a seed's loss (its curve ended early) is left out, not counted as zero."""
    gaps = mean_gaps({"ddp": [2.0, 2.5, 1.6], "a": [2.2, 2.5, 1.6], "b": [1.8, 2.75, None],
                      "c": [2.0, 2.5]})
    assert set(gaps) == {"a"} and abs(gaps["a"] - 0.1 / 3) < 1e-12
    assert mean_gaps({"ddp": [2.0], "a": [2.06]}) == {"a": 2.06 / 2.0 - 1}
