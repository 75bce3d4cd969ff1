"""The swap rule (pure): who is blamed, when a swap is decided, and what holds it back;
and what the link probe times."""

from __future__ import annotations

import time

import pytest
from torch.distributed import Store

from potluck.errors import ConfigError
from potluck.population import StoreProbe
from potluck.population.swap import (
    CheckInput,
    MemberCost,
    SwapRule,
    check,
    decide,
    predicted_without,
)

BATCH = 96
FAST = 1e-7  # seconds per byte: 80 Mbit/s
SLOW = 1e-6  # 8 Mbit/s
RULE = SwapRule(drag=0.3, window=20)  # a check every 5 steps, 3 of them weighed


def row(links: tuple[float, ...] = (FAST, FAST, FAST),
        compute: tuple[float, ...] = (1e-3, 1e-3, 1e-3)) -> list[MemberCost]:
    return [MemberCost(f"m{i}", c, link)
            for i, (c, link) in enumerate(zip(compute, links, strict=True))]


def cohort(step_s: float, links: tuple[float, ...] = (FAST, FAST, FAST),
           compute: tuple[float, ...] = (1e-3, 1e-3, 1e-3), spares: int = 1,
           rows: list[list[MemberCost]] | None = None, **more: object) -> CheckInput:
    """A full window of checks, each the same unless ``rows`` are given."""
    return CheckInput(step=10, rows=rows or [row(links, compute)] * RULE.checks,
                      step_s=step_s, global_batch=BATCH, spares=spares,
                      **more)  # type: ignore[arg-type]


@pytest.mark.timeout(5)
def test_a_slow_link_is_blamed_and_the_prediction_scales_the_wire_by_it() -> None:
    # compute 32 ms (equal shares of 96 at 1 ms), the rest (168 ms) is the wire at m1's
    # slow link; the others' links read 10 times faster, which counts as 5 (the probes'
    # spread, 2): 33.6 ms of wire without it
    data = cohort(0.2, links=(FAST, SLOW, FAST))
    verdict = check(RULE, data)
    assert verdict.member == "m1"
    assert verdict.measured == pytest.approx(BATCH / 0.2)
    assert verdict.predicted == pytest.approx(BATCH / (0.032 + 0.0336))
    assert predicted_without(data, "m1") == pytest.approx(BATCH / (0.032 + 0.0168))
    assert verdict.link_s_per_byte == SLOW
    decision = decide(RULE, verdict)
    assert decision is not None and decision.member == "m1" and decision.window == 20
    assert "67% below the 1463.4 predicted" in decision.text()


@pytest.mark.timeout(5)
def test_a_slow_compute_is_blamed_with_equal_shares_and_with_balanced_ones() -> None:
    slow = (1e-3, 1e-3, 4e-3)
    equal = cohort(4e-3 * 32 + 0.01, compute=slow)
    assert check(RULE, equal).member == "m2"
    # balanced: 96 / (1000 + 1000 + 250) = 42.7 ms; without it (a median spare) 32 ms
    balanced = cohort(0.0427 + 0.01, compute=slow, balanced=True)
    verdict = check(RULE, balanced)
    assert verdict.member is None  # 19% faster at best: under the 30% drag
    assert verdict.predicted == pytest.approx(BATCH / (0.032 + 0.01), rel=1e-2)


@pytest.mark.timeout(5)
def test_a_healthy_cohort_blames_nobody() -> None:
    assert check(RULE, cohort(0.05)).member is None
    assert decide(RULE, check(RULE, cohort(0.05))) is None


@pytest.mark.timeout(5)
def test_noisy_probes_of_equal_links_blame_nobody() -> None:
    """Probes that scatter 3x either way, each member slowest in turn or one member
    slowest throughout by less than the others' spread: equal links, no swap."""
    turns = [row((FAST, 3 * FAST, FAST / 3)), row((FAST / 3, FAST, 3 * FAST)),
             row((3 * FAST, FAST / 3, FAST))]
    assert check(RULE, cohort(0.2, rows=turns)).member is None
    one_slow = [row((FAST, 2 * FAST, FAST / 2)), row((FAST / 2, 3 * FAST, 2 * FAST)),
                row((2 * FAST, 2 * FAST, FAST))]
    assert check(RULE, cohort(0.2, rows=one_slow)).member is None


@pytest.mark.timeout(5)
def test_a_link_that_reads_slower_within_the_probes_spread_is_not_blamed() -> None:
    """Two equal links can read apart by 2x for a whole run: 1.9x is no evidence."""
    steady = cohort(0.2, links=(FAST, 1.9 * FAST, FAST))
    assert check(RULE, steady).member is None
    assert check(SwapRule(0.3, 20, spread=1.0), steady).member == "m1"


@pytest.mark.timeout(5)
def test_a_member_is_blamed_only_when_slow_in_every_check_of_the_window() -> None:
    once = [row((FAST, SLOW, FAST)), row(), row()]  # one slow probe: noise
    assert check(RULE, cohort(0.2, rows=once)).member is None
    throughout = [row((FAST, SLOW, FAST)), row((FAST, SLOW / 2, 1.5 * FAST)),
                  row((1.5 * FAST, SLOW, FAST))]
    verdict = check(RULE, cohort(0.2, rows=throughout))
    assert verdict.member == "m1" and verdict.link_s_per_byte == SLOW / 2  # its best


@pytest.mark.timeout(5)
def test_no_verdict_before_a_full_window_of_checks() -> None:
    short = cohort(0.2, rows=[row((FAST, SLOW, FAST))] * (RULE.checks - 1))
    assert check(RULE, short).member is None


@pytest.mark.timeout(5)
def test_nobody_is_blamed_without_a_spare_or_when_the_dragger_is_protected() -> None:
    assert check(RULE, cohort(0.2, links=(FAST, SLOW, FAST), spares=0)).member is None
    protected = cohort(0.2, links=(FAST, SLOW, FAST), protected=frozenset({"m1"}))
    assert check(RULE, protected).member is None


@pytest.mark.timeout(5)
def test_a_known_spare_speed_enters_the_prediction() -> None:
    data = cohort(0.2, links=(FAST, SLOW, FAST))
    slower = cohort(0.2, links=(FAST, SLOW, FAST), spare_s_per_sample=2e-3)
    assert predicted_without(slower, "m1") < predicted_without(data, "m1")


@pytest.mark.timeout(5)
@pytest.mark.parametrize("window", [4, 12, 20, 41])
def test_a_decision_comes_within_the_window_of_the_drag(window: int) -> None:
    """A link throttled after step 30: the swap comes within ``window`` steps."""
    rule = SwapRule(0.3, window)
    assert rule.every * rule.checks <= window
    rows: list[list[MemberCost]] = []
    for step in range(rule.every, 200, rule.every):
        dragging = step > 30
        rows = [*rows, row((FAST, SLOW if dragging else FAST, FAST))][-rule.checks:]
        data = CheckInput(step, rows, 0.2 if dragging else 0.05, BATCH, 1)
        decided = decide(rule, check(rule, data))
        assert decided is None or dragging, "a swap before the drag"
        if decided:
            break
    assert decided is not None and decided.member == "m1"
    assert 0 < decided.step - 30 <= window


@pytest.mark.timeout(5)
@pytest.mark.parametrize(("drag", "window", "spread"),
                         [(0.0, 20, 2.0), (1.0, 20, 2.0), (-0.2, 20, 2.0), (0.3, 3, 2.0),
                          (0.3, 20, 0.5)])
def test_a_bad_rule_is_refused_with_the_value(drag: float, window: int,
                                              spread: float) -> None:
    with pytest.raises(ConfigError, match=r"swap (drag|window|spread)"):
        SwapRule(drag, window, spread)


class _Bursty(Store):
    """A store whose link passes the first transfer each way slowly and the next fast
    (here the reverse of a token bucket, so that timing the wrong one shows)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def set(self, key: str, value: str | bytes) -> None:
        self.ops.append("set")
        time.sleep(0.2 if self.ops.count("set") == 1 else 0.0)

    def get(self, key: str) -> bytes:
        self.ops.append("get")
        time.sleep(0.2 if self.ops.count("get") == 1 else 0.0)
        return b""


@pytest.mark.timeout(5)
def test_the_probe_times_the_second_transfer_each_way() -> None:
    store = _Bursty()
    seconds_per_byte = StoreProbe(store, "k", size=1000)()
    assert store.ops == ["set", "set", "get", "get"]
    assert 0 < seconds_per_byte < 0.1 / 2000  # neither slow first transfer counted
