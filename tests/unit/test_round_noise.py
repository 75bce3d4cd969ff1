"""The work check's noise (``trust/round_noise.py``) and the rule's parts that use it:
gains compared at the median member's part, and a member flagged only where its
shortfall stands out of its own noise."""

from __future__ import annotations

import math
import random

import pytest
import torch

from potluck.trust.round_noise import (
    JUDGE_Z,
    ROUND_Z,
    SHORT_ROUNDS,
    WINDOW,
    Score,
    gain_noise,
    noisier,
    power,
    sample_leak,
    score_noise,
    short_rounds,
    shortfall_z,
)
from potluck.trust.round_work import judge_work, under, window_mean, work_scores

LIMIT = 0.3  # 1 - RoundCheck's tolerance

# Rounds 1 to 4 of `potluck bench cohort --quick` (4 members, parts of 8 to 36 samples),
# as the check measured them: gains[t][k], and each member's part of the round. The
# rule before parts were compared at the median's quarantined member 3 after round 4
# (scores 0.09, -1.22 and 1.88 of the median's: mean 0.25); it had done its work.
COHORT = [
    ([0.25, 0.2969, 0.25, 0.2031],
     [[0.4177, 0.3862, 0.3718, 0.3389], [0.5132, 0.5045, 0.4649, 0.4189],
      [0.4315, 0.4089, 0.4212, 0.3553], [0.3339, 0.3175, 0.3077, 0.3129]]),
    ([0.25, 0.3125, 0.25, 0.1875],
     [[0.2747, 0.2835, 0.2767, 0.2961], [0.3307, 0.3759, 0.3613, 0.3788],
      [0.2662, 0.2963, 0.3128, 0.3032], [0.2028, 0.2151, 0.2126, 0.2322]]),
    ([0.5625, 0.25, 0.125, 0.0625],
     [[0.3352, 0.2853, 0.2723, 0.2689], [0.1853, 0.1679, 0.1357, 0.1779],
      [0.0865, 0.0779, 0.076, 0.0893], [0.05, 0.0415, 0.0352, 0.0588]]),
    ([0.4375, 0.25, 0.125, 0.1875],
     [[0.0245, 0.0001, 0.0646, -0.0239], [-0.0165, 0.0188, 0.0316, -0.0437],
      [-0.004, -0.0006, 0.0427, 0.0041], [-0.0035, 0.0, 0.021, 0.0145]]),
]


def _windows(rounds: list[list[float]]) -> dict[int, list[float]]:
    """Each member's scores over ``rounds`` (work_scores' answers), NaN left out."""
    return {t: [r[t] for r in rounds if not math.isnan(r[t])] for t in range(len(rounds[0]))}


@pytest.mark.timeout(10)
def test_the_cohort_benchs_honest_slow_member_is_not_flagged() -> None:
    """The slowest member's smaller update lowered the loss less on every sample; the
    double-centering counted that against its own sample's score. At the median's part,
    its scores are 1.34, 0.54, 1.77 and 1.27 of the median member's."""
    rounds = [work_scores(gains, [0, 1, 2, 3], shares) for shares, gains in COHORT]
    recent = _windows(rounds)
    assert judge_work(recent, 1 - LIMIT) == []
    assert min(window_mean(s[:k]) for s in recent.values() for k in (3, 4)) > 0.7


def _alike(rng: random.Random, shares: list[float]) -> list[list[float]]:
    """A round early in training: every member's update lowers the loss on every sample
    alike, in proportion to its part (gains grow with the part as the rule assumes) and
    to how easy the sample is, plus noise; no member's update fits its own sample better."""
    middle = sorted(shares)[len(shares) // 2]
    size = [min(s / middle, math.sqrt(s / middle)) for s in shares]
    ease = [1 + rng.gauss(0, 0.15) for _ in shares]
    return [[0.3 * size[t] * ease[k] + rng.gauss(0, 0.01) for k in range(len(shares))]
            for t in range(len(shares))]


# Three honest members' rounds of `potluck bench cohort --quick`, as the check measured
# them: (the member, each member's part of the round, gains[t][k]). The bench showed
# no false quarantine in 15 runs here; these are its lowest honest scores whose rounds
# were judged, from three runs. In one seat, the rule that judged a window by the
# median member's signal flagged the member (scores -0.05, 0.17 and 0.22 of the
# median's: mean 0.12), as it did honest members with parts of 8 to 16 samples in
# about 1 run in 2 elsewhere. Their parts: 8, 10 and 12 samples.
SMALL = [
    (2, [0.25, 0.125, 0.25, 0.375],
     [[0.1358, 0.1827, 0.0903, 0.1009], [0.0596, 0.156, 0.0299, 0.0321],
      [0.102, 0.1822, 0.0872, 0.0765], [0.1689, 0.2047, 0.1413, 0.1758]]),
    (2, [0.203125, 0.15625, 0.25, 0.390625],
     [[0.3608, 0.3253, 0.3071, 0.3265], [0.3407, 0.3475, 0.3105, 0.325],
      [0.4114, 0.3858, 0.383, 0.3874], [0.5898, 0.5512, 0.5145, 0.5651]]),
    (1, [0.4375, 0.1875, 0.125, 0.25],
     [[0.1446, 0.1131, 0.1518, 0.1024], [-0.0567, -0.0283, -0.013, -0.0733],
      [0.0822, 0.0723, 0.1155, 0.062], [0.0297, 0.019, 0.0856, -0.0039]]),
]


@pytest.mark.timeout(10)
def test_an_honest_member_with_a_small_part_is_not_flagged_on_noise() -> None:
    """Its shortfall is within its noise: the other members' own-data work spread as
    much. The check abstains: a member that did no work would not have stood out of
    that noise either. (Its samples were harder than the others': centered on its row's
    and column's means alone, its mean score was under the limit; with its samples'
    effect taken out it is 0.71.)"""
    scores = [work_scores(gains, [0, 1, 2, 3], shares)[t] for t, shares, gains in SMALL]
    assert window_mean(scores) > LIMIT
    # judged at a limit over its mean, it is still not flagged: the check abstains
    assert window_mean(scores) < 0.8 and judge_work({0: scores}, 1 - 0.8) == []
    assert shortfall_z(scores) < JUDGE_Z and power(scores) < JUDGE_Z
    assert under(scores, 0.8) is None


def _alike(rng: random.Random, shares: list[float]) -> list[list[float]]:
    """A round early in training: every member's update lowers the loss on every sample
    alike, in proportion to its part (gains grow with the part as the rule assumes) and
    to how easy the sample is, plus noise; no member's update fits its own sample better."""
    middle = sorted(shares)[len(shares) // 2]
    size = [min(s / middle, math.sqrt(s / middle)) for s in shares]
    ease = [1 + rng.gauss(0, 0.15) for _ in shares]
    return [[0.3 * size[t] * ease[k] + rng.gauss(0, 0.01) for k in range(len(shares))]
            for t in range(len(shares))]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shares", [[0.4, 0.28, 0.2, 0.12], [0.25] * 4])
def test_gains_alike_on_every_sample_flag_nobody(shares: list[float]) -> None:
    """Small parts, every update helping every sample alike: the median member's
    double-centered own gain is noise, and so is every ratio to it (of the 1,600
    member-windows of 3 scored rounds, 32 and 24 fall under the limit). A member is
    flagged only where its own shortfall reaches ``JUDGE_Z``: none is (seed 7). Centered
    on its row's and column's means alone, without its samples' effect taken out, 48 fell
    under and 1 was flagged; at a bar of 2, 2 and 7, more than a normal tail at 2
    allows: the spread is read from 3 members."""
    rng, n, count = random.Random(7), len(shares), 400
    ratios_under = found = 0
    for _ in range(count):
        recent = _windows([work_scores(_alike(rng, shares), list(range(n)), shares)
                           for _ in range(WINDOW)])
        ratios_under += sum(window_mean(s) < LIMIT for s in recent.values())
        found += len(judge_work(recent, 1 - LIMIT))
    assert ratios_under >= 20  # what the ratio alone would flag
    assert found <= count * n / 1000, found  # at most 1 member-window in 1,000


@pytest.mark.timeout(10)
def test_a_member_is_flagged_only_where_its_shortfall_stands_out_of_its_noise() -> None:
    clear = [Score(0.0, 1.0, 0.5)] * WINDOW  # no work, its noise half the others' work
    noisy = [Score(0.0, 1.0, 1.5)] * WINDOW  # no work, but a noise that hides it
    worked = [Score(1.0, 0.0, 0.5)] * WINDOW
    assert shortfall_z(clear) == pytest.approx(2 * math.sqrt(WINDOW))
    assert [f.rank for f in judge_work({0: clear}, 1 - LIMIT)] == [0]
    assert judge_work({0: noisy}, 1 - LIMIT) == [] and under(noisy, LIMIT) is None
    assert under(worked, LIMIT) is False  # (cleared: it would have stood out)
    assert under(clear[:2], LIMIT) is None  # (a window not full)
    assert under([0.0] * WINDOW, LIMIT) is True  # a plain float carries no noise to doubt
    # one round counts at most ROUND_Z of its noise: an attack in the window's last round
    # alone is not flagged yet, in its last two it is, however quiet the round before
    began = [Score(1.0, 0.0, 0.3), Score(1.0, 0.0, 0.3), Score(-5.0, 6.0, 1.0)]
    assert shortfall_z(began) == pytest.approx(ROUND_Z / math.sqrt(WINDOW))
    assert judge_work({0: began}, 1 - LIMIT) == []
    assert [f.rank for f in judge_work({0: began[1:] + began[2:]}, 1 - LIMIT)] == [0]
    unknown = [*began[:2], Score(-5.0, math.nan, 1.0)]  # (NaN is no verdict, not a cap)
    assert math.isnan(shortfall_z(unknown)) and judge_work({0: unknown}, 1 - LIMIT) == []


def test_one_round_whose_noise_was_read_too_small_does_not_carry_a_window() -> None:
    """An honest member of nanoGPT under DiLoCo (dropout 0.2, H = 16, int8, 4 workers;
    its first 3 checked rounds, as the run scored them). Its second round's shortfall
    read 4.9 times its noise, from 3 members' spread; the window's z was 3.9 and the
    member was quarantined at round 3. Within ``ROUND_Z`` a round the window's z is 2.8,
    and the check abstains: a member that did no work would reach only 2.9."""
    honest = [Score(-2.724, 3.248, 1.561), Score(-0.275, 1.253, 0.258),
              Score(1.681, -0.116, 0.729)]
    assert shortfall_z(honest) == pytest.approx((3.248 / 1.561 + ROUND_Z - 0.116 / 0.729)
                                                / math.sqrt(WINDOW))
    assert shortfall_z(honest) < power(honest) < JUDGE_Z
    assert judge_work({0: honest}, 1 - LIMIT) == [] and under(honest, LIMIT) is None


# Rounds 1 to 3 of nanoGPT under DiLoCo (dropout 0.2, H = 16, int8, 4 workers, shares by
# speed), as the check measured them: each member's part of the round, and gains[t][k].
# Member 0's samples were the hardest of rounds 1 and 2 (the same text in every run: the
# same seed), and centered on its row's and column's means a third of that counted
# against it: its shortfall read 1.28, 3.42 and 1.84 of its noise, and it was
# quarantined at round 3 ("no work on its data") in 2 of 14 clean runs' tables.
NANOGPT = [
    ([0.367, 0.191, 0.236, 0.205],
     [[1.1157, 1.1492, 1.1587, 1.1123], [0.8155, 0.8436, 0.8462, 0.8126],
      [0.9224, 0.9526, 0.9648, 0.9208], [0.8474, 0.8736, 0.879, 0.8509]]),
    ([0.312, 0.219, 0.25, 0.219],
     [[0.1407, 0.1567, 0.1629, 0.1509], [0.1216, 0.1459, 0.1428, 0.1315],
      [0.1222, 0.1385, 0.1497, 0.1326], [0.125, 0.1365, 0.143, 0.1413]]),
    ([0.279, 0.233, 0.256, 0.233],
     [[0.0047, 0.0175, 0.0001, -0.0027], [0.0011, 0.0166, -0.0054, -0.0033],
      [0.0074, 0.0078, 0.0123, 0.0057], [0.0025, 0.0076, -0.0139, -0.0003]]),
]


@pytest.mark.timeout(10)
def test_a_sample_every_update_gains_less_on_does_not_count_against_its_member() -> None:
    """nanoGPT's honest member 0 above. With its samples' effect taken out, its second
    round's shortfall is 1.6 of its noise, not 3.4, the window's z-score 2.5, and nobody
    is flagged. Its own-data work is still low this early in training, but within its
    noise: the check abstains (a member that did no work would reach a z of 1.95)."""
    rounds = [work_scores(gains, [0, 1, 2, 3], shares) for shares, gains in NANOGPT]
    recent = _windows(rounds)
    assert judge_work(recent, 1 - LIMIT) == []
    second = recent[0][1]
    assert isinstance(second, Score) and second.shortfall / second.noise < 2
    assert shortfall_z(recent[0]) < JUDGE_Z and under(recent[0], LIMIT) is None


def _additive(n: int, ease: list[float], work: list[float], rows: float = 0.1
              ) -> list[list[float]]:
    """Gains without noise: a row effect (how much the target's update gains anywhere:
    ``rows`` times its rank and 1), a column effect (``ease``: how much any update gains
    on the sample) and ``work`` on the diagonal."""
    good = [rows * (t + 1) for t in range(n)]
    return [[1.0 + good[t] + ease[k] + (work[t] if t == k else 0.0) for k in range(n)]
            for t in range(n)]


@pytest.mark.parametrize("n", [4, 6])
def test_members_alike_but_for_their_samples_score_alike(n: int) -> None:
    """The same work and updates alike on samples far apart in ease: every score is the
    median's. Centered on the means alone, the member with the hardest sample scored
    -0.07 at 4 members (0.31 at 6), the easiest 1.71 (1.36)."""
    ease = [-0.06, 0.03, 0.01, 0.0, 0.02, 0.0][:n]
    table = _additive(n, ease, [0.02] * n, rows=0.0)
    scores = work_scores(table, list(range(n)), [1.0 / n] * n)
    assert [float(s) for s in scores] == pytest.approx([1.0] * n)


@pytest.mark.parametrize("n", [3, 4, 6])
def test_a_samples_effect_is_taken_out_of_the_score_and_the_rows_stays(n: int) -> None:
    """Without noise the score is the own-data work plus ``1 / (n - 1)`` of the row's
    effect (an update that gains less everywhere counts against its member), whatever
    the samples' effects; the means of the row and column alone leave ``1 / (n - 1)`` of
    the column's in it too."""
    ease = [-0.6, 0.3, 0.1, 0.0, 0.2, 0.0][:n]
    ease = [e - sum(ease) / n for e in ease]
    work = [0.05 * (k + 1) for k in range(n)]
    table = _additive(n, ease, work)
    good = [0.1 * (t + 1) for t in range(n)]
    for t in range(n):
        others = [k for k in range(n) if k != t]
        row = sum(table[t][k] for k in others) / (n - 1)
        column = sum(table[u][t] for u in others) / (n - 1)
        mean = sum(table[u][k] for u in range(n) for k in range(n) if u != k) / (n * (n - 1))
        centered = table[t][t] - row - column + mean
        leak = sample_leak(column - mean, row - mean, n, noise=0.0)
        row_effect = (good[t] - sum(good) / n) / (n - 1)
        assert leak == pytest.approx(ease[t] / (n - 1))
        assert centered - leak == pytest.approx(work[t] + row_effect)


def test_a_samples_effect_within_its_noise_is_left_in() -> None:
    """The estimate is taken out in the measure it stands out of its own noise (``n``
    members: its variance is ``noise ** 2 * (n - 1) ** 2 / (n ** 2 * (n - 2))``)."""
    n, noise = 4, 0.01
    spread = noise ** 2 * (n - 1) ** 2 / (n ** 2 * (n - 2))
    # a column's effect of c and no row's: its column's mean off the diagonal stands c
    # over the table's, its row's -c / (n - 1)
    def leak(c: float) -> float:
        return sample_leak(c, -c / (n - 1), n, noise)
    sd = math.sqrt(spread)
    assert leak(0.0) == 0.0
    assert leak(0.9 * sd) == 0.0  # (within one standard deviation: nothing)
    assert leak(2 * sd) == pytest.approx(0.75 * 2 * sd / (n - 1))
    far = 20 * sd
    assert leak(far) == pytest.approx((1 - 1 / 400) * far / (n - 1))
    assert leak(-far) == -leak(far)
    assert sample_leak(1.0, 0.0, 2, noise) == 0.0  # (no table of 2 to read it from)


def _lstsq_noise(table: torch.Tensor, keep: list[int], without: int | None) -> float:
    """The fit's noise by torch's least squares: a constant, a row effect and a column
    effect on the cells off the diagonal of ``keep``'s table, ``without``'s row out."""
    at = {u: i for i, u in enumerate(keep)}
    n = len(keep)
    cells = [(u, k) for u in keep for k in keep if u != k and u != without]
    design = torch.zeros(len(cells), 1 + 2 * n, dtype=torch.float64)
    for i, (u, k) in enumerate(cells):
        design[i, 0], design[i, 1 + at[u]], design[i, 1 + n + at[k]] = 1, 1, 1
    values = torch.tensor([float(table[u, k]) for u, k in cells], dtype=torch.float64)
    fit = torch.linalg.lstsq(design, values.unsqueeze(1), driver="gelsd").solution
    residuals = values - (design @ fit).squeeze(1)
    rows = n - (without is not None)
    return math.sqrt(float(residuals.pow(2).sum()) / (len(cells) - rows - n + 1))


@pytest.mark.timeout(10)
def test_gain_noise_is_the_fit_of_the_cells_off_the_diagonal() -> None:
    """Against a least-squares fit of a row effect and a column effect on the cells off
    the diagonal, solved by torch: the whole table, a subset of its members, and each
    with one target's row left out (``n * n - 3 * n + 1`` degrees of freedom, and
    ``n - 2`` fewer without a row)."""
    gen = torch.Generator().manual_seed(0)
    for n in (4, 5, 7, 12):
        table = torch.randn(n + 2, n + 2, generator=gen, dtype=torch.float64)
        table = table * torch.logspace(-3, 3, n + 2, dtype=torch.float64)  # rows' scales
        for keep in (list(range(n)), list(range(2, n + 2))):
            for without in (None, keep[0], keep[-1]):
                expected = _lstsq_noise(table, keep, without)
                assert gain_noise(table.tolist(), keep, without) == pytest.approx(
                    expected, rel=1e-9), (n, keep, without)
    assert gain_noise([[1.0, 2.0], [3.0, 4.0]], [0, 1]) == 0.0
    additive = [[r + c for c in (0.1, 0.5, 0.2, 0.9)] for r in (1.0, 3.0, 2.0, 0.0)]
    assert gain_noise(additive, [0, 1, 2, 3]) == pytest.approx(0.0, abs=1e-12)
    assert gain_noise(additive, [0, 1, 2, 3], without=2) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.timeout(20)
def test_score_noise_is_a_centered_scores_spread() -> None:
    """The spread of a double-centered own gain over tables of independent noise."""
    gen = torch.Generator().manual_seed(1)
    for n in (4, 6):
        tables = torch.randn(20000, n, n, generator=gen, dtype=torch.float64)
        off = ~torch.eye(n, dtype=torch.bool)
        row = (tables[:, 0, 1:]).mean(1)
        column = (tables[:, 1:, 0]).mean(1)
        rest = tables[:, off].mean(1)
        score = tables[:, 0, 0] - row - column + rest
        assert float(score.std()) == pytest.approx(score_noise(n), rel=0.03)


@pytest.mark.timeout(10)
def test_a_smaller_part_is_noisier() -> None:
    keep = [0, 1, 2, 3]
    equal = dict.fromkeys(keep, 1.0)
    assert all(noisier(equal, keep, t) == 1.0 for t in keep)
    small = {**equal, 3: 0.5}
    assert 1.5 < noisier(small, keep, 3) < 2.0  # (its row's noise doubled, not its column's)
    assert noisier(small, keep, 0) == 1.0  # (never stricter than a median part's)
    assert noisier({**equal, 3: 2.0}, keep, 3) == 1.0


# Rounds 1 to 3 of `potluck bench cohort` (seed 0, H = 30, 4 members), as the check
# measured them: each member's part, and gains[t][k]. Member 1 sent its pseudo-gradient
# times -10 in rounds 1 and 2 and trained honestly in round 3; then the cohort had 3
# members (a kill, then the store's host lost), so no round was scored again.
STRETCH = [
    ([0.1958, 0.2573, 0.3125, 0.2344],
     [[1.6453, 1.5846, 1.7750, 1.5462], [-3.1473, -3.0909, -3.1745, -3.9529],
      [1.6291, 1.6051, 1.7669, 1.5598], [1.6510, 1.6080, 1.8043, 1.6283]]),
    ([0.1917, 0.2583, 0.3167, 0.2333],
     [[0.1358, 0.1491, 0.1242, 0.1014], [-12.0379, -12.1058, -12.2668, -12.1130],
      [0.1702, 0.2048, 0.1769, 0.1403], [0.0985, 0.1322, 0.0887, 0.1168]]),
    ([0.1917, 0.2583, 0.3167, 0.2333],
     [[0.1499, 0.1600, 0.1286, 0.1780], [0.1278, 0.2590, 0.1319, 0.1863],
      [0.1303, 0.2483, 0.1516, 0.1748], [0.1282, 0.1836, 0.1237, 0.2100]]),
]


@pytest.mark.timeout(10)
def test_one_good_round_does_not_cancel_two_attacked_ones() -> None:
    """The attacker's rounds 1 and 2 fall short by 6 and hundreds of times their noise,
    its honest round 3 is above the median (-1.7): within ``ROUND_Z`` the window's z is
    2.5, under ``JUDGE_Z``, and the check would abstain. Two rounds at ``ROUND_Z`` flag
    it on their own; the honest members are not flagged."""
    recent = _windows([work_scores(gains, [0, 1, 2, 3], parts) for parts, gains in STRETCH])
    attacker = recent[1]
    assert shortfall_z(attacker) < JUDGE_Z and short_rounds(attacker) == SHORT_ROUNDS
    assert under(attacker, LIMIT) is True
    assert [f.rank for f in judge_work(recent, 1 - LIMIT)] == [1]


def test_two_short_rounds_flag_only_a_window_whose_mean_is_under_the_limit() -> None:
    short, fine = Score(-1.0, 2.0, 0.5), Score(1.0, -0.1, 0.5)  # (z 4 and -0.2)
    assert short_rounds([short, short, fine]) == 2 and short_rounds([short, fine, fine]) == 1
    assert under([short, short, Score(1.0, -2.0, 0.5)], LIMIT) is True  # (z sum 1.7)
    # the same shortfalls with a window mean over the limit: the mean decides
    high = Score(0.5, 2.0, 0.5)
    assert under([high, high, Score(1.0, -2.0, 0.5)], LIMIT) is not True
    assert short_rounds([0.0, 0.0, 0.0]) == 0  # (plain floats carry no noise)
    unknown = Score(1.0, math.nan, 0.5)  # (NaN is no verdict)
    assert short_rounds([short, short, unknown]) == 0
