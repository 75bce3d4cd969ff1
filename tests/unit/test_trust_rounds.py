"""Trust's round checks on their own (``potluck.trust.round_rules``): honest members are
never flagged over many seeds, and each attack is flagged by its check.

A round is simulated as the slice owners see it: every member's pseudo-gradient is a
drift shared by all (what the data agree on) plus noise of its own (its batches),
cut into one slice per owner; each owner aggregates its slice with CenteredClip and
reports (``slice_report``); ``judge_round`` turns the reports into findings.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from potluck.trust.aggregate import CenteredClip
from potluck.trust.round_rules import (
    COPIED,
    FIELDS,
    FREE_RIDER,
    GROSS,
    gross,
    judge_round,
    sketch,
    slice_report,
)
from potluck.trust.verdict import FAR, NON_FINITE, REPLAYED, Finding, Rules

FULL = os.environ.get("POTLUCK_FULL_SWEEPS") == "1"  # the measured sweeps, not the suite's

DIM = 600

Sketches = list[list[torch.Tensor | None]]


def _honest(n: int, gen: torch.Generator, drift: float, shares: list[float]) -> torch.Tensor:
    """``n`` honest pseudo-gradients: a common drift, and noise of each member's own;
    both grow with the member's local steps (its share), the drift linearly, the noise
    as its square root."""
    common = torch.randn(DIM, generator=gen, dtype=torch.float64) * drift
    middle = sorted(shares)[len(shares) // 2]
    rows = [common * (s / middle)
            + torch.randn(DIM, generator=gen, dtype=torch.float64) * math.sqrt(s / middle)
            for s in shares]
    return torch.stack(rows)


def _round(copies: torch.Tensor, shares: list[float],
           previous: Sketches | None = None) -> tuple[torch.Tensor, Sketches]:
    """What the owners report on ``copies`` (one owner per member, one slice each)."""
    n = copies.shape[0]
    weights = torch.tensor(shares, dtype=torch.float64)
    reports, kept = [], []
    for k, part in enumerate(torch.tensor_split(copies, n, dim=1)):
        value = CenteredClip().aggregate(part, weights)
        before = previous[k] if previous is not None else [None] * n
        report, sketches = slice_report(part, value, before, shares)
        reports.append(report)
        kept.append(list(sketches))
    return torch.stack(reports), kept


def _judge(copies: torch.Tensor, shares: list[float],
           previous: Sketches | None = None) -> list[tuple[int, str, int]]:
    reports, _ = _round(copies, shares, previous)
    return [(f.rank, f.kind, f.party) for f in
            judge_round(reports, shares, list(range(copies.shape[0])), Rules())]


def _shares(n: int, gen: torch.Generator, skewed: bool) -> list[float]:
    if not skewed:
        return [1.0 / n] * n
    raw = (torch.rand(n, generator=gen, dtype=torch.float64) * 3 + 0.5).tolist()  # 1:7 at most
    return [r / sum(raw) for r in raw]


def test_honest_members_are_never_flagged_over_many_seeds() -> None:
    """1,000 honest rounds (the suite runs 100; POTLUCK_FULL_SWEEPS=1 runs them all)
    (3 to 8 members, drift 0 to 3x the noise, equal or skewed
    shares 1:7), each followed by a second round for the replay check: no finding.
    Designed for: a rule fires on an honest member only when its ratio is several
    times off the median member's (far 4x, free rider 0.3x, copy or replay 0.01x
    squared), which independent noise does not make; measured here, 0 of 10,992
    member-rounds (each rule's 95% upper bound: 3 / 10,992 < 3e-4 per member-round).
    Far rounds quarantine only in a row, at ``Rules.false_positive`` (``far.py``)."""
    judged = flagged = 0
    seeds = 1000 if FULL else 100  # (the whole sweep: POTLUCK_FULL_SWEEPS=1)
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(seed)
        n = 3 + seed % 6
        shares = _shares(n, gen, skewed=seed % 2 == 1)
        drift = [0.0, 0.3, 1.0, 3.0][seed % 4]
        first, sketches = _round(_honest(n, gen, drift, shares), shares)
        found = judge_round(first, shares, list(range(n)), Rules())
        found += _judge(_honest(n, gen, drift, shares), shares, sketches)  # type: ignore[arg-type]
        judged += 2 * n
        flagged += len(found)
        assert not found, (seed, n, drift, shares, found)
    assert judged == sum(2 * (3 + s % 6) for s in range(seeds)) and flagged == 0


def _attacked(seed: int, n: int = 4, drift: float = 1.0) -> tuple[torch.Tensor, list[float]]:
    gen = torch.Generator().manual_seed(seed)
    shares = [1.0 / n] * n
    return _honest(n, gen, drift, shares), shares


@pytest.mark.parametrize("seed", range(20))
def test_a_sign_flip_times_ten_is_far(seed: int) -> None:
    copies, shares = _attacked(seed)
    copies[1] = -10 * copies[1]
    assert (1, FAR, -1) in _judge(copies, shares)


@pytest.mark.parametrize("seed", range(20))
def test_gaussian_noise_is_far(seed: int) -> None:
    copies, shares = _attacked(seed)
    copies[2] = torch.randn(DIM, generator=torch.Generator().manual_seed(seed + 99),
                            dtype=torch.float64) * 10
    found = _judge(copies, shares)
    assert (2, FAR, -1) in found and all(rank == 2 for rank, _, _ in found)


def test_a_nan_pseudo_gradient_is_non_finite_and_nothing_else() -> None:
    copies, shares = _attacked(0)
    copies[0] = math.nan
    assert _judge(copies, shares) == [(0, NON_FINITE, -1)]


def test_a_nan_in_one_slice_is_left_out_there_but_not_struck() -> None:
    """One owner's word is not enough (it could lie): its aggregate leaves the copy
    out, and nobody is struck."""
    copies, shares = _attacked(0)
    copies[0, 5] = math.nan
    reports, _ = _round(copies, shares)
    assert reports[0, 0, 0] == 0 and reports[1:, 0, 0].eq(1).all()
    assert _judge(copies, shares) == []


@pytest.mark.parametrize("scale", [0.0, 0.1])
@pytest.mark.parametrize("drift", [0.0, 1.0])
def test_a_zero_or_scaled_down_pseudo_gradient_is_a_free_rider(scale: float,
                                                                drift: float) -> None:
    for seed in range(20):
        copies, shares = _attacked(seed, drift=drift)
        copies[3] = copies[3] * scale
        assert (3, FREE_RIDER, -1) in _judge(copies, shares), seed


def test_a_free_rider_with_a_small_share_is_judged_for_its_share() -> None:
    """A member assigned a quarter of the median share sends a pseudo-gradient about a
    quarter as long (its drift): not a free rider. Scaled by 0.1 on top, it is."""
    gen = torch.Generator().manual_seed(3)
    shares = [0.3, 0.3, 0.3, 0.075]
    copies = _honest(4, gen, 3.0, shares)
    assert _judge(copies, shares) == []
    copies[3] *= 0.1
    assert (3, FREE_RIDER, -1) in _judge(copies, shares)


@pytest.mark.parametrize("noise, n", [(0.0, 3), (0.0, 4), (1e-3, 4), (0.0, 6), (1e-3, 6)])
def test_a_copy_of_another_members_is_flagged_with_its_party(noise: float, n: int) -> None:
    """Equal, or nearly equal: both members of the pair are flagged (nobody can tell
    which one copied), each naming the other. Not a near copy among 3: two nearly alike
    of 3 are a majority, which the robust center follows (docs/trust.md)."""
    copies, shares = _attacked(1, n=n)
    copies[2] = copies[0] + noise * torch.randn(DIM, dtype=torch.float64,
                                                generator=torch.Generator().manual_seed(7))
    found = _judge(copies, shares)
    assert sorted(found) == [(0, COPIED, 2), (2, COPIED, 0)]


def test_a_far_attacker_makes_no_honest_pair_look_like_a_copy() -> None:
    """Half of the pairs hold the attacker (3 of 6 with 4 members): the reference is
    the members' median distance to the center, not the median pair's."""
    copies, shares = _attacked(6)
    copies[3] *= -10
    assert _judge(copies, shares) == [(3, FAR, -1)]


@pytest.mark.parametrize("noise", [0.0, 1e-3])
def test_a_replay_of_its_own_last_pseudo_gradient_is_flagged(noise: float) -> None:
    copies, shares = _attacked(2)
    _, sketches = _round(copies, shares)
    again, _ = _attacked(3)
    again[1] = copies[1] + noise * torch.randn(DIM, dtype=torch.float64,
                                               generator=torch.Generator().manual_seed(8))
    assert _judge(again, shares, sketches) == [(1, REPLAYED, -1)]


def test_one_lying_owner_accuses_nobody() -> None:
    """An owner that reports a member far, non-finite and tiny is outvoted by the median
    over the others' reports."""
    copies, shares = _attacked(4)
    reports, _ = _round(copies, shares)
    reports[0, 2, 0] = 0.0  # not finite
    reports[0, 2, 1] = 1e12  # far
    reports[0, 2, 2] = 0.0  # no norm
    assert judge_round(reports, shares, [0, 1, 2, 3], Rules()) == []


def test_two_members_are_never_judged() -> None:
    """With two copies nobody can tell the bad one from the good one."""
    copies, shares = _attacked(5, n=2)
    copies[1] *= -10
    assert _judge(copies, shares) == []


def test_the_sketch_keeps_equal_copies_equal_and_distances_near() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(5000, generator=gen), torch.randn(5000, generator=gen)
    assert torch.equal(sketch(x), sketch(x.clone()))
    estimate = float(((sketch(x) - sketch(y)) ** 2).sum())
    assert 0.7 < estimate / float(((x - y) ** 2).sum()) < 1.3


def test_a_report_has_a_row_per_sender_and_a_column_per_pair() -> None:
    copies = torch.arange(12, dtype=torch.float64).view(3, 4)
    report, sketches = slice_report(copies, copies.mean(0), [None] * 3)
    assert report.shape == (3, FIELDS + 3) and len(sketches) == 3
    assert torch.isnan(report[:, 3]).all()  # no last round: no replay measured
    assert report[0, FIELDS + 1] == pytest.approx(4 * 16)  # rows 4 apart in 4 values


def test_a_member_with_a_small_part_that_changes_little_is_no_replay() -> None:
    """Measured on ``examples/cohort.py --far`` under load: parts 0.5, 0.08 and 0.42 of
    the round, AdamW inside. The small member ran one local step, about the gradient's
    sign each round, so its change (1.5e-5) was 300x under the median's while its own
    norm was 20x smaller too: changed by 4% of itself, it is no replay."""
    gen = torch.Generator().manual_seed(5)
    shares = [0.5, 0.08, 0.42]
    sign = torch.sign(torch.randn(DIM, generator=gen, dtype=torch.float64)) * 0.4
    first = _honest(3, gen, 1.0, shares)
    first[1] = sign
    _, sketches = _round(first, shares)
    second = _honest(3, gen, 1.0, shares)
    flips = torch.rand(DIM, generator=gen, dtype=torch.float64) < 0.01  # 1% of the signs
    second[1] = torch.where(flips, -sign, sign)
    assert _judge(second, shares, sketches) == []
    second[1] = sign.clone()  # the same member replaying its last copy is caught
    assert _judge(second, shares, sketches) == [(1, REPLAYED, -1)]


def test_a_member_that_moved_by_a_few_percent_of_itself_is_no_replay() -> None:
    """One local step with momentum a round (a member with a tiny part): its
    pseudo-gradient moves by a few percent of itself a round while the others move by
    all of theirs. Not a replay; a copy that moved by under 1% of itself is."""
    gen = torch.Generator().manual_seed(9)
    shares = [0.45, 0.1, 0.45]
    first = _honest(3, gen, 1.0, shares)
    _, sketches = _round(first, shares)
    second = _honest(3, gen, 1.0, shares)
    wiggle = torch.randn(DIM, generator=gen, dtype=torch.float64)
    second[1] = first[1] + 0.03 * first[1].norm() / wiggle.norm() * wiggle  # 3% of itself
    assert _judge(second, shares, sketches) == []
    second[1] = first[1] + 0.002 * first[1].norm() / wiggle.norm() * wiggle  # 0.2%
    assert _judge(second, shares, sketches) == [(1, REPLAYED, -1)]


@pytest.mark.parametrize("seed", range(10))
def test_a_sign_flip_times_ten_is_gross_and_an_honest_round_is_not(seed: int) -> None:
    """Gross: beyond ``GROSS`` times ``far_ratio`` (two far rounds' evidence, ``far.py``).
    A far round of an honest member's is not gross; a sign flip times 10 is."""
    copies, shares = _attacked(seed)
    copies[1] = -10 * copies[1]
    reports, _ = _round(copies, shares)
    found = judge_round(reports, shares, [0, 1, 2, 3], Rules())
    assert gross(found, Rules()) == [1]
    [far] = [f for f in found if f.kind == FAR]
    assert far.score > GROSS * Rules().far_ratio
    assert gross(found, Rules(far_ratio=far.score / GROSS * 1.01)) == []  # (just under)
    near = [Finding(2, FAR, "far", score=GROSS * 4.0 - 0.1), Finding(3, COPIED, "copied", 0)]
    assert gross(near, Rules()) == []
