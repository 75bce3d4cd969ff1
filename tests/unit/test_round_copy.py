"""Which member of a copied pair did the work (``trust/round_copy.py``), and the pair
settled by it in ``round_work.settle_copies``.

The simulated rounds: a two-layer MLP on Gaussian blobs, 30% of the labels drawn at
random (a network fits its own samples' noise a little, which is what tells the member
that did the work), 4 members
each training ``STEPS`` SGD steps on its own part of the round from the same start.
The chunk values are the ones ``round_check`` measures: the other targets' mean
against the shared pseudo-gradient, on chunks of ``CHUNK`` samples of each part.
"""

from __future__ import annotations

import functools
import math
import os

import pytest
import torch
from torch.nn import functional as F

from potluck.errors import ConfigError
from potluck.trust.round_check import WorkCheck
from potluck.trust.round_copy import (
    CHUNK,
    COPY_Z,
    chunks,
    combined,
    copier,
    pair_z,
    t_as_z,
)
from potluck.trust.round_work import WINDOW, RoundCheck, settle_copies
from potluck.trust.verdict import COPIED, Finding

DIM, HIDDEN, CLASSES, STEPS, BATCH, LR, MEMBERS, FLIP = 8, 128, 4, 8, 32, 0.5, 4, 0.3
PART = STEPS * BATCH  # 256 samples: 32 chunks a side
FULL = os.environ.get("POTLUCK_FULL_SWEEPS") == "1"  # the measured sweeps, not the suite's
SEEDS = 2000 if FULL else 100


def _forward(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    first = w[:DIM * HIDDEN].view(DIM, HIDDEN)
    return torch.relu(x @ first) @ w[DIM * HIDDEN:].view(HIDDEN, CLASSES)


def _train(start: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w = start.clone()
    for s in range(0, len(x), BATCH):
        w.requires_grad_(True)
        (grad,) = torch.autograd.grad(F.cross_entropy(_forward(w, x[s:s + BATCH]),
                                                      y[s:s + BATCH]), [w])
        w = (w - LR * grad).detach()
    return start - w


@functools.cache
def _task() -> tuple[torch.Tensor, torch.Tensor]:
    """Class centers, a teacher that mislabels some samples, and a start trained a
    little (mid-training)."""
    gen = torch.Generator().manual_seed(99)
    centers = torch.randn(CLASSES, DIM, generator=gen)
    start = torch.randn(HIDDEN * (DIM + CLASSES), generator=gen) / math.sqrt(HIDDEN)
    x, y = _data(gen, centers, 2048)
    return centers, start - _train(start, x, y)


def _data(gen: torch.Generator, centers: torch.Tensor, count: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.randint(0, CLASSES, (count,), generator=gen)
    x = centers[y] + torch.randn(count, DIM, generator=gen) * 1.5
    drawn = torch.rand(count, generator=gen) < FLIP
    return x, torch.where(drawn, torch.randint(0, CLASSES, (count,), generator=gen), y)


def _pair_round(seed: int, shared_from: int) -> float:
    """One round's z-score of the pair (members 0 and 1) whose shared pseudo-gradient
    is member ``shared_from``'s: 0 (member 0 did the work, member 1 copied it) or 2 (a
    third member's: it fits neither part, the null the bound is designed for)."""
    gen = torch.Generator().manual_seed(seed)
    centers, start = _task()
    x, y = _data(gen, centers, MEMBERS * PART)
    others = [k for k in range(MEMBERS) if k not in (0, 1, shared_from)]
    deltas = {k: _train(start, x[k * PART:(k + 1) * PART], y[k * PART:(k + 1) * PART])
              for k in (shared_from, *others)}  # (member 1 copies: it trains nothing)
    shared = deltas[shared_from]
    reference = torch.stack([deltas[k] for k in others]).mean(0)

    def values(member: int) -> list[float]:
        """Each chunk's mean loss, as one loss call a chunk would give it."""
        a, b = member * PART, (member + 1) * PART
        each = (F.cross_entropy(_forward(start - reference, x[a:b]), y[a:b], reduction="none")
                - F.cross_entropy(_forward(start - shared, x[a:b]), y[a:b], reduction="none"))
        return [float(each[s - a:e - a].mean()) for s, e in chunks([(a, b)])]

    return pair_z(values(0), values(1))


def test_pair_z_is_welch_and_says_when_it_cannot_tell() -> None:
    first, second = [1.0, 2.0, 3.0, 4.0], [0.0, 1.0, 2.0, 3.0]
    error = math.sqrt(2 * (5 / 3) / 4)  # each side's variance 5/3, 4 chunks
    # (Welch's degrees of freedom with equal variances and 4 chunks a side: 6)
    assert pair_z(first, second) == pytest.approx(t_as_z(1 / error, 6.0))
    assert pair_z(second, first) == pytest.approx(-t_as_z(1 / error, 6.0))
    assert math.isnan(pair_z(first[:3], second))  # too few chunks
    assert math.isnan(pair_z([1.0] * 4, [1.0] * 4))  # no spread
    assert math.isnan(pair_z([1.0, math.nan, 2.0, 3.0], second))
    assert chunks([(0, 20), (40, 48)]) == [(0, CHUNK), (CHUNK, 16), (16, 20), (40, 48)]


def test_t_as_z_errs_toward_not_striking() -> None:
    # (degrees of freedom, t, the exact normal z of Student's tail there)
    for freedom, t, exact in ((3, 5.0, 2.423), (6, 3.0, 2.257), (30, 3.0, 2.783),
                              (30, 5.0, 4.231)):
        assert exact - 0.45 <= t_as_z(t, freedom) <= exact, (freedom, t)
    assert t_as_z(3.0, 1e6) == pytest.approx(3.0, abs=1e-3)
    assert t_as_z(-3.0, 6.0) == -t_as_z(3.0, 6.0)


def _work_check() -> WorkCheck:
    return WorkCheck(RoundCheck(lambda model, batch: torch.zeros(())),
                     torch.nn.Linear(2, 1), lambda: [], lambda ranges: [])


def test_a_pair_is_looked_at_in_its_first_window_of_measured_rounds_only() -> None:
    work, pair = _work_check(), ("a", "b")
    assert work.remember_pairs({pair: math.nan}) == {pair: []}  # (not measured)
    for z in (1.0, 2.0, 2.5):
        work.remember_pairs({pair: z})
    assert work.remember_pairs({pair: 9.0}) == {pair: [1.0, 2.0, 2.5]}


@pytest.mark.timeout(60)
def test_few_chunks_and_many_rounds_strike_an_honest_member_rarely() -> None:
    """The null again, where the bound is weakest: 4 to 6 chunks a side (a slow member's
    small part) and a pair flagged for 20 rounds. 2,000 pairs; a strike of either
    member counts. Designed: at most about 3 looks at Phi(-3) each, 0.4%; with a normal
    bar on Welch's t and a look every round it was about 2% (40)."""
    gen = torch.Generator().manual_seed(7)
    struck = 0
    for _ in range(2000):
        work, pair = _work_check(), ("a", "b")
        for _ in range(20):
            sides = [torch.randn(int(torch.randint(4, 7, (), generator=gen)), generator=gen)
                     for _ in range(2)]
            zs = work.remember_pairs({pair: pair_z(sides[0].tolist(), sides[1].tolist())})
            if copier((0, 1), zs[pair]) is not None:
                struck += 1
                break
    assert struck <= 12, struck


def test_copier_by_the_combined_z() -> None:
    assert copier((3, 5), [4.0]) == 5  # fits 3's part: 5 copied
    assert copier((3, 5), [-4.0]) == 3
    assert copier((3, 5), [2.5]) is None and copier((3, 5), [math.nan]) is None
    assert combined([2.5, 2.5]) == pytest.approx(5 / math.sqrt(2))
    assert copier((3, 5), [2.5, 2.5]) == 5  # two rounds at 2.5 are 3.5 together
    assert copier((3, 5), [2.5, math.nan]) is None  # (a round it could not tell: left out)


@pytest.mark.timeout(300)
def test_the_member_copied_is_never_struck_and_the_copier_is_within_3_rounds() -> None:
    """Member 1 copies member 0's pseudo-gradient in windows of ``WINDOW`` rounds, the
    pair settled as the trust part settles it (the rounds' z-scores combined). Member 0
    is never named; member 1 is within 3 rounds in 9 of the suite's 10 windows at least.
    With POTLUCK_FULL_SWEEPS=1 (40 windows, 120 rounds): named in its first round in 66
    of 120 rounds, within 3 rounds in 38 of 40 windows, member 0 never. (On the lab's
    bench, whose task memorizes more, one round's z-score was 4.5.)"""
    windows_ = 40 if FULL else 10
    named = []
    for w in range(windows_):
        zs = [_pair_round(WINDOW * w + k, 0) for k in range(WINDOW)]
        picks = [copier((0, 1), zs[:k + 1]) for k in range(WINDOW)]
        named.append(next((p for p in picks if p is not None), None))
        assert 0 not in picks, zs
    assert named.count(1) >= 0.9 * windows_, named


@pytest.mark.timeout(300)
def test_a_shared_pseudo_gradient_that_fits_neither_part_names_nobody_at_the_bound() -> None:
    """The null of the designed bound: the pair's shared pseudo-gradient is a third
    member's, so it fits neither part better. A member is named in no more rounds than
    ``Phi(-3)`` on each side allows (1.35e-3 each; the suite's 100 seeds: 0.14 expected
    on a side, at most 2 allowed; with POTLUCK_FULL_SWEEPS=1, 2,000 seeds: at most 10)."""
    zs = [_pair_round(seed, 2) for seed in range(SEEDS)]
    assert all(math.isfinite(z) for z in zs)
    allowed = 2 if SEEDS <= 100 else 10
    assert sum(z >= COPY_Z for z in zs) <= allowed, sorted(zs)[-5:]
    assert sum(z <= -COPY_Z for z in zs) <= allowed, sorted(zs)[:5]


def test_settle_copies_takes_the_data_first_then_the_windows() -> None:
    """One round of the pair's data settles it before any work window is full; without
    it (or where it cannot tell yet) the windows do, as before; neither: noted."""
    pair = [Finding(1, COPIED, "copy", 2), Finding(2, COPIED, "copy", 1)]
    found, unchecked = settle_copies(pair, {}, 0.7, {(1, 2): [-4.2]})
    assert [f.rank for f in found] == [1] and unchecked == []
    assert "(z = 4.2 over 1 round(s)): it copied" in found[0].detail
    found, unchecked = settle_copies(pair, {}, 0.7, {(1, 2): [1.0]})
    assert found == [] and unchecked == [(1, 2)]
    apart = {1: [1.0] * WINDOW, 2: [0.0] * WINDOW}
    found, _ = settle_copies(pair, apart, 0.7, {(1, 2): [1.0]})
    assert [f.rank for f in found] == [2] and "the other's is not" in found[0].detail


def test_copy_samples_must_be_enough_for_a_spread() -> None:
    with pytest.raises(ConfigError, match=r"copy_samples=8\) must be an int >= 32"):
        RoundCheck(lambda model, batch: torch.zeros(()), copy_samples=8)
