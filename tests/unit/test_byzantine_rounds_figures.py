"""The rounds trust bench's figures (``bench/byzantine_rounds_figures.py``) and its
report, with trust available and without, from made-up results."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from potluck.errors import ConfigError
from potluck_lab.bench import byzantine_rounds as bench
from potluck_lab.bench import byzantine_rounds_figures as fig

QUARANTINE = {"event": "quarantine", "member": "rank3", "rank": 3}


def test_quarantines_read_the_round_or_the_step_and_tell_the_attacker_from_the_others() -> None:
    events = [{"event": "repair", "step": 1, "members": ["rank3"]},
              {**QUARANTINE, "step": 4},
              {"event": "quarantine", "member": "rank1", "rank": 1, "round": 6},
              {"event": "quarantine", "rank": 3, "round": 2}]
    assert fig.quarantines(events, 3) == ([4, 2], 1)
    assert fig.quarantines([], 3) == ([], 0)
    assert fig.any_quarantine(events) and not fig.any_quarantine(events[:1])


def test_rounds_to_quarantine_count_the_attacks_first_round_as_one() -> None:
    assert fig.rounds_to_quarantine([3, 5], start=1) == 3
    assert fig.rounds_to_quarantine([3], start=2) == 2  # a replay corrupts round 2 first
    assert fig.rounds_to_quarantine([], start=1) is None


def test_a_loss_that_is_not_finite_is_infinitely_worse() -> None:
    assert fig.ratio(0.5, 0.25) == 2.0
    assert fig.ratio(math.nan, 0.25) == math.inf and fig.ratio(math.inf, 0.25) == math.inf


def _rows(available: bool) -> dict[str, dict[str, Any]]:
    trust = available or None
    return {
        "sign_flip": fig.attack_row([math.inf, math.inf], trust and [1.01, 1.03],
                                    trust and [2, 3], trust_vs_honest=trust and [0.97, 0.99]),
        "free_rider": fig.attack_row([1.0, 1.02], trust and [1.08, 1.0], trust and [None, 1],
                                     honest_quarantined=1),
    }


def test_an_attack_row_takes_medians_the_worst_seed_and_none_for_a_seed_never_caught() -> None:
    rows = _rows(True)
    flip, rider = rows["sign_flip"], rows["free_rider"]
    assert flip["hurts_plain"] and not rider["hurts_plain"]
    assert flip["trust"] == pytest.approx(1.02) and flip["trust_worst_seed"] == 1.03
    assert flip["rounds_to_quarantine"] == 3
    assert rider["rounds_to_quarantine"] is None  # one seed never caught it
    assert rider["rounds_to_quarantine_by_seed"] == [None, 1]


def test_the_figures_where_trust_is_available() -> None:
    out = fig.figures(_rows(True), false=0, overhead=0.02, available=True)
    assert out["hurt_attacks"] == ["sign_flip"]
    assert out["worst_loss_ratio"] == pytest.approx(1.04)  # free rider's median
    assert out["worst_loss_ratio_where_hurt"] == pytest.approx(1.02)  # sign flip's only
    assert out["worst_loss_ratio_where_hurt_vs_honest"] == pytest.approx(0.98)
    assert out["max_rounds_to_quarantine"] == math.inf  # the free rider got away once
    assert out["false_quarantines"] == 0 and out["clean_overhead"] == 0.02


def test_every_trust_figure_is_none_where_trust_is_not_available() -> None:
    rows = _rows(False)
    assert rows["sign_flip"]["trust"] is None and rows["sign_flip"]["plain"] == math.inf
    out = fig.figures(rows, false=None, overhead=None, available=False)
    assert out["hurt_attacks"] == ["sign_flip"]
    assert all(out[k] is None for k in ("worst_loss_ratio", "max_rounds_to_quarantine",
                                        "false_quarantines", "clean_overhead"))


def test_the_overhead_is_the_median_of_interleaved_ratios() -> None:
    assert fig.mean_round([9.0, 1.0, 3.0]) == 2.0  # the first round left out
    assert fig.overhead([1.1, 2.0, 3.3], [1.0, 1.0, 3.0]) == pytest.approx(0.1)


def _results(available: bool) -> dict[str, Any]:
    return {"baselines": [0.3, 0.31], "honest": [0.31, 0.32], "attacks": _rows(available),
            "false": 0 if available else None, "overhead": 0.02 if available else None,
            "round_ms": {"plain": 50.0, "trust": 51.0, "floor": 50.5, "floor_overhead": 0.01}
            if available else {},
            "unavailable": None if available else "prepare() got sync=DiLoCo(...) with "
                                                  "trust=Trust(...): not yet",
            "seconds": 12.0}


CONFIG = bench.RoundsConfig(("sign_flip", "free_rider"), 16, 8, 2, 20, 4, False)


def test_the_report_says_not_available_and_the_json_has_null_figures() -> None:
    lines = "\n".join(bench.report_lines(CONFIG, _results(False)))
    assert "trust contender: not available (prepare() got sync=DiLoCo" in lines
    assert "n/a" in lines and "attacks that hurt plain DiLoCo (loss ratio > 1.05): " \
                              "sign_flip" in lines
    payload = bench.report_json(CONFIG, _results(False))
    assert payload["trust_contender"] == "not available"
    assert payload["worst_loss_ratio"] is None and payload["clean_overhead"] is None
    assert payload["attacks"]["sign_flip"]["trust"] is None


def test_the_report_puts_each_figure_beside_its_goal() -> None:
    lines = bench.report_lines(CONFIG, _results(True))
    text = "\n".join(lines)
    assert "worst_loss_ratio 1.0400, where plain DiLoCo is hurt 1.0200 (goal <= 1.05" in text
    assert "against a clean run of the 3 honest members alone, where plain DiLoCo is " \
           "hurt: 0.9800" in text
    assert "max_rounds_to_quarantine inf (goal <= 3, over every attack)" in text
    assert "false_quarantines 0 of 20 clean runs (goal 0)" in text
    assert "clean_overhead +0.020 (round 51.0 ms with trust vs 50.0 ms without, H = " \
           f"{CONFIG.inner_steps}; goal <= 0.05)" in text
    assert "the floor: one all-gather of the pseudo-gradient more a round costs +0.010 " \
           "(50.5 ms a round), the same run" in text
    payload = bench.report_json(CONFIG, _results(True))
    assert payload["trust_contender"] == "available"
    assert {"worst_loss_ratio", "max_rounds_to_quarantine", "false_quarantines",
            "clean_overhead"} <= set(payload)


def _args(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"attack": None, "quick": False, "inner_steps": None,
                                 "rounds": None, "seeds": None, **given})


def test_inner_steps_rounds_and_seeds_are_the_users_or_the_defaults() -> None:
    config = bench.config_from_args(_args())
    assert (config.inner_steps, config.rounds, config.seeds) == (16, 16, 3)
    config = bench.config_from_args(_args(inner_steps=256, rounds=12, seeds=1))
    assert (config.inner_steps, config.rounds, config.seeds) == (256, 12, 1)
    quick = bench.config_from_args(_args(quick=True, inner_steps=32))
    assert (quick.inner_steps, quick.rounds, quick.seeds) == (32, 10, 1)


@pytest.mark.parametrize(("given", "says"), [
    ({"inner_steps": 0}, r"--inner-steps 0: pass a whole number of at least 1 \(default 16\)"),
    ({"seeds": -1}, r"--seeds -1: pass a whole number of at least 1 \(default 3\)"),
    ({"rounds": 2}, r"--rounds 2: .* pass at least 3"),
])
def test_a_bad_setting_says_the_value_and_the_rule(given: dict[str, int], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        bench.config_from_args(_args(**given))


def test_the_every_step_bench_refuses_the_rounds_settings() -> None:
    from potluck_lab.bench import byzantine

    with pytest.raises(ConfigError, match="--inner-steps sets the rounds bench: add --sync "
                                          "diloco"):
        byzantine.config_from_args(_args(inner_steps=64))
