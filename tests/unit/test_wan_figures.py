"""The WAN bench's pure parts: time to target, loss at equal samples, the tc arguments."""

from __future__ import annotations

from potluck_lab.bench.wan_figures import (
    first_at_or_below,
    loss_at,
    mean_gaps,
    median,
    ratio,
    seed_gaps,
    steps_to_target,
)
from potluck_lab.machine.netns import tbf_args

CURVE = [[320, 1.0, 3.0], [640, 2.0, 2.5], [960, 3.0, 2.2], [1280, 4.0, 2.1]]


def test_the_first_point_at_or_below_the_target() -> None:
    assert first_at_or_below(CURVE, 2.5) == [640, 2.0, 2.5]
    assert first_at_or_below(CURVE, 2.0) is None
    assert steps_to_target(CURVE, 2.2, 32) == 30
    assert steps_to_target(CURVE, 1.0, 32) is None


def test_loss_at_equal_samples_and_ratios() -> None:
    assert loss_at(CURVE, 960) == 2.2 and loss_at(CURVE, 2000) is None
    # between two points: the model as it stood (a round not finished is not credited)
    assert loss_at(CURVE, 1120) == 2.2 and loss_at(CURVE, 100) is None
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
    each = seed_gaps({"ddp": [2.0, 2.5, 1.6], "a": [2.2, 2.5, 1.6], "b": [1.8, 2.75, None]})
    assert set(each) == {"a"} and each["a"] == [2.2 / 2.0 - 1, 0.0, 0.0]


def test_the_report_prints_every_contender_and_the_seeds_of_those_reseeded() -> None:
    """ddp-fp16 is timed but not re-seeded: the report says what it has, no KeyError."""
    from potluck_lab.bench.wan import WanConfig, report

    def timed(loss: float) -> dict[str, object]:
        return {"time_to_target_s": 10.0, "bytes_per_sample": 100.0, "utilization": 0.5,
                "loss_at_S": loss, "measured": "run"}

    results = {
        "contenders": {"ddp": {**timed(2.0), "losses_by_seed": [2.0, 2.2]},
                       "ddp-fp16": timed(2.1),
                       "localsgd-int8": {**timed(2.1), "losses_by_seed": [2.1, 2.2],
                                         "loss_gap": 0.025, "local_steps": [[4], [4]],
                                         "busy": [0.9, 0.8]}},
        "time_to_target_vs_ddp": 20.5, "time_to_target_contender": "localsgd-int8",
        "bytes_vs_ddp": 410.0, "bytes_contender": "localsgd-int8", "loss_gap": 0.025,
        "loss_gap_contender": "localsgd-int8", "seeds": 2,
        "loss_gap_by_seed": [0.05, 0.0]}
    text = report(WanConfig(batches=500, inner_steps=125), results)
    assert "ddp-fp16" in text and "ddp-fp16: loss at" not in text
    assert "localsgd-int8: loss at 500 batches by data seed [2.1000, 2.2000]; gap to ddp, " \
           "mean over the seeds +0.0250" in text
    assert "loss_gap: 0.025 (localsgd-int8, mean over 2 data seeds: +0.0500, +0.0000)" in text
    assert "time_to_target_vs_ddp: 20.5 (localsgd-int8)" in text
    assert "bytes_vs_ddp: 410 (localsgd-int8)" in text
