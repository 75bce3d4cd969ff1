"""The pure parts of trust: aggregators, the verdict, strikes, the fingerprint."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.errors import ConfigError
from potluck.trust import CenteredClip, Rules, SpotCheck, TrimmedMean, Trust
from potluck.trust.fingerprint import fingerprint
from potluck.trust.verdict import (
    DIVERGED,
    FAR,
    NON_FINITE,
    Evidence,
    Reports,
    Strikes,
    judge,
)


def _honest(n: int = 4, m: int = 64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.ones(m) + 0.1 * torch.randn(n, m, generator=gen)


@pytest.mark.parametrize("aggregator", [CenteredClip(), TrimmedMean(trim=0)])
def test_close_copies_aggregate_to_their_weighted_mean(aggregator: object) -> None:
    copies, weights = _honest(), torch.tensor([1.0, 2.0, 3.0, 2.0])
    got = aggregator.aggregate(copies, weights)  # type: ignore[attr-defined]
    expected = (weights / weights.sum()) @ copies
    assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("aggregator", [CenteredClip(), TrimmedMean(trim=1)])
def test_one_far_copy_moves_the_aggregate_little(aggregator: object) -> None:
    copies, weights = _honest(), torch.ones(4)
    honest_mean = copies[:3].mean(0)
    copies[3] = -10 * copies[3]  # a sign flip times 10
    got = aggregator.aggregate(copies, weights)  # type: ignore[attr-defined]
    plain = copies.mean(0)
    assert (got - honest_mean).norm() < 0.1 * (plain - honest_mean).norm()


def test_a_copy_far_beyond_the_others_spread_gets_no_say_unless_clipping_only() -> None:
    copies, weights = _honest(), torch.tensor([1.0, 2.0, 1.0, 1.0])
    honest = (weights[:3] / weights[:3].sum()) @ copies[:3]
    copies[3] = -10 * copies[3]
    assert torch.allclose(CenteredClip().aggregate(copies, weights), honest, atol=1e-6)
    clipped = CenteredClip(reject_at=None).aggregate(copies, weights)
    spread = float((copies[:3] - copies[:3].median(dim=0).values).norm(dim=1).median())
    assert float((clipped - honest).norm()) > 0.05 * spread  # clipped: it still pulls
    # a copy within reject_at clip radii is clipped, not left out
    copies[3] = honest + 3.0 * spread * torch.nn.functional.normalize(torch.ones(64), dim=0)
    kept = CenteredClip().aggregate(copies, weights)
    assert float((kept - honest).norm()) > 0.05 * spread


@pytest.mark.parametrize("parts", [[64, 64, 64, 2], [32, 32, 32, 1], [100] * 5 + [3],
                                   [10, 10, 10, 1000], [10, 10, 1000]])
def test_an_honest_copy_of_a_small_part_is_never_left_out(parts: list[int]) -> None:
    """A rank with few samples sends a noisier gradient (its noise ~ 1/sqrt(samples)):
    farther off, honestly. Its say must stay (clipped at most), trial after trial; and
    a rank with most of the step must never be left out either."""
    gen = torch.Generator().manual_seed(len(parts))
    weights = torch.tensor(parts, dtype=torch.float32)
    for _ in range(10):
        signal = torch.randn(20000, generator=gen)
        copies = torch.stack([signal + torch.randn(20000, generator=gen) / k ** 0.5
                              for k in parts])
        clipped_only = CenteredClip(reject_at=None).aggregate(copies, weights)
        assert torch.equal(CenteredClip().aggregate(copies, weights), clipped_only)


def test_with_two_copies_or_a_split_majority_nobody_is_left_out() -> None:
    two = torch.tensor([[1.0, -0.1], [0.0, 0.0]])
    assert torch.equal(CenteredClip().aggregate(two, torch.ones(2)),
                       CenteredClip(reject_at=None).aggregate(two, torch.ones(2)))
    # two camps far apart: leaving out half would let the other half decide alone
    camps = torch.cat([torch.zeros(2, 16), 100.0 * torch.ones(2, 16)])
    camps += 0.01 * torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    assert torch.equal(CenteredClip().aggregate(camps, torch.ones(4)),
                       CenteredClip(reject_at=None).aggregate(camps, torch.ones(4)))


def test_non_finite_copies_are_left_out_and_none_usable_is_nan() -> None:
    copies, weights = _honest(), torch.ones(4)
    honest_mean = copies[:3].mean(0)
    copies[3, 5] = float("nan")
    assert torch.allclose(CenteredClip().aggregate(copies, weights), honest_mean, atol=1e-6)
    assert torch.isnan(CenteredClip().aggregate(torch.full((4, 8), float("inf")),
                                                 weights)).all()


@pytest.mark.parametrize("case", ["nan", "inf_one", "inf_three", "neg_inf_two", "inf_all",
                                  "nan_and_inf"])
def test_non_finite_copies_anywhere_aggregate_as_the_finite_ones_alone(case: str) -> None:
    # CenteredClip takes every row as finite until a distance from the start says
    # otherwise (``_started``): whatever the non-finite values' places, the result is
    # that of the finite rows alone, bit for bit.
    copies = _honest(n=6)
    if case == "nan":
        copies[2, 3] = float("nan")
    elif case == "inf_one":
        copies[4, 0] = float("inf")
    elif case == "inf_three":  # the median there is +inf: the finite rows' distances say so
        copies[[1, 2, 3], 7] = float("inf")
    elif case == "neg_inf_two":
        copies[[0, 5], 1] = float("-inf")
    elif case == "inf_all":  # inf - inf: NaN in every row's distance
        copies[:, 2] = float("inf")
        copies[1, 3] = float("nan")
    else:
        copies[0, 0], copies[3, 6] = float("nan"), float("-inf")
    weights = torch.tensor([1.0, 2.0, 1.0, 3.0, 1.0, 2.0])
    finite = torch.isfinite(copies).all(dim=1)
    for aggregator in (CenteredClip(), CenteredClip(reject_at=None)):
        got, measured = aggregator.measured(copies, weights)
        assert measured is None  # a row was left out: its distances are not for free
        if not finite.any():
            assert torch.isnan(got).all()
            continue
        want, _ = aggregator.measured(copies[finite].clone(), weights[finite])
        assert torch.equal(got, want)


def test_zero_weight_copies_do_not_count() -> None:
    copies = _honest()
    copies[1] = 1e6
    got = CenteredClip().aggregate(copies, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert torch.allclose(got, copies[[0, 2, 3]].mean(0), atol=1e-6)
    for bad in (1, 0):  # a NaN weight is not > 0: its copy does not count either
        weights = torch.ones(4)
        weights[bad] = float("nan")
        copies = _honest()
        copies[bad] = 1e6
        got = CenteredClip().aggregate(copies, weights)
        kept = [i for i in range(4) if i != bad]
        assert torch.allclose(got, copies[kept].mean(0), atol=1e-6)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="tau_scale"):
        CenteredClip(tau_scale=0)
    with pytest.raises(ConfigError, match=r"reject_at=0\.5\) must be >= 1"):
        CenteredClip(reject_at=0.5)
    assert CenteredClip(tau_scale=5.0).reject_at == 2.0  # any clip radius goes with it
    with pytest.raises(ConfigError, match="trim"):
        TrimmedMean(trim=-1)
    with pytest.raises(ConfigError, match="far_ratio"):
        Rules(far_ratio=0.5)
    with pytest.raises(ConfigError, match="strikes"):
        Rules(strikes={"bogus": 1})


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Rules(far_ratio="4"), "far_ratio='4' must be > 1"),
    (lambda: Rules(strikes=None), "strikes=None must be a dict"),
    (lambda: Rules(strikes={"far from the center": True}), "values ints >= 1"),
    (lambda: Rules(memory=True), "memory=True must be an int"),
    (lambda: SpotCheck(lambda m, b: m(b), every=True), r"SpotCheck\(every=True\)"),
    (lambda: Trust(fingerprint_every=True), r"Trust\(fingerprint_every=True\)"),
    (lambda: Trust(audit_every=False), r"Trust\(audit_every=False\)"),
    (lambda: Trust(aggregator=CenteredClip), "pass an aggregator object"),
])
def test_wrong_types_are_refused_in_their_own_words(make: Any, message: str) -> None:
    """A bool is not a count, a class is not an aggregator, a string is not a ratio:
    each is refused where it is given, not deep inside a step."""
    with pytest.raises(ConfigError, match=message):
        make()


def _reports(distance: list[list[float]], finite: list[list[float]] | None = None,
             fingerprint_: list[int] | None = None) -> Reports:
    n = len(distance)
    return Reports(finite=finite or [[1.0] * n for _ in range(n)], distance=distance,
                   owns=[10.0] * n, fingerprint=fingerprint_ or [7] * n)


def test_a_far_sender_is_named_by_the_median_over_owners() -> None:
    near, far = 1.0, 100.0
    distance = [[near, near, near, far] for _ in range(4)]
    found = judge(_reports(distance), [8] * 4, [0, 1, 2, 3], Rules())
    assert [(r, k) for r, k, *_ in found] == [(3, FAR)]


def test_one_lying_owner_can_neither_accuse_nor_acquit() -> None:
    near, far = 1.0, 100.0
    # Owner 3 (the attacker) reports honest rank 0 far and itself near.
    distance = [[near, near, near, far], [near, near, near, far],
                [near, near, near, far], [far, near, near, near]]
    found = judge(_reports(distance), [8] * 4, [0, 1, 2, 3], Rules())
    assert [(r, k) for r, k, *_ in found] == [(3, FAR)]


def test_samples_scale_the_distance_a_smaller_part_is_noisier() -> None:
    # Rank 3 trained on 1/16 of the samples of the others: its gradient is 4x noisier.
    distance = [[1.0, 1.0, 1.0, 16.0] for _ in range(4)]
    assert judge(_reports(distance), [16, 16, 16, 1], [0, 1, 2, 3], Rules()) == []


def test_non_finite_is_a_rank_only_when_most_are_finite() -> None:
    finite = [[1.0, 1.0, 0.0, 1.0] for _ in range(4)]
    found = judge(_reports([[1.0] * 4] * 4, finite), [8] * 4, [0, 1, 2, 3], Rules())
    assert [(r, k) for r, k, *_ in found] == [(2, NON_FINITE)]
    overflow = [[0.0, 0.0, 0.0, 1.0] for _ in range(4)]  # an fp16 overflow everywhere
    assert judge(_reports([[1.0] * 4] * 4, overflow), [8] * 4, [0, 1, 2, 3], Rules()) == []


def test_a_diverged_fingerprint_is_named_only_with_a_majority() -> None:
    found = judge(_reports([[1.0] * 4] * 4, fingerprint_=[5, 5, 9, 5]), [8] * 4,
                  [0, 1, 2, 3], Rules())
    assert [(r, k) for r, k, *_ in found] == [(2, DIVERGED)]
    split = judge(_reports([[1.0] * 4] * 4, fingerprint_=[5, 5, 9, 9]), [8] * 4,
                  [0, 1, 2, 3], Rules())
    assert split == []


def test_quarantined_ranks_do_not_count() -> None:
    distance = [[1.0, 1.0, 1.0, 1e9] for _ in range(4)]
    assert judge(_reports(distance), [8] * 4, [0, 1, 2], Rules()) == []


def test_strikes_quarantine_after_enough_of_a_kind_within_memory() -> None:
    strikes = Strikes(Rules(memory=10))
    far = [Evidence("w3", 3, step, DIVERGED, "diverged") for step in (1, 20, 21)]
    assert not strikes.add(far[0])
    assert not strikes.add(far[1])  # step 1 is out of memory by step 20
    assert strikes.add(far[2])
    assert list(strikes.quarantined) == ["w3"]
    assert not strikes.add(Evidence("w3", 3, 22, NON_FINITE, "nan"))  # once is enough
    restored = Strikes(Rules())
    restored.load_state_dict(strikes.state_dict())
    assert restored.quarantined == strikes.quarantined
    assert Strikes(Rules()).add(Evidence("w1", 1, 3, NON_FINITE, "nan"))  # one strike


def test_fingerprint_sees_a_single_flipped_bit() -> None:
    params = [torch.randn(100), torch.randn(7, 3).to(torch.bfloat16), torch.arange(5)]
    before = fingerprint(params)
    assert fingerprint([p.clone() for p in params]) == before
    params[0].view(torch.int32)[42] ^= 1
    assert fingerprint(params) != before
    assert 0 <= before < 2 ** 63
    for dtype in (torch.float64, torch.float32, torch.float16):  # every sign bit too
        values = [torch.randn(10).to(dtype), torch.randn(3).to(dtype)]
        whole = fingerprint(values)
        for tensor in values:
            tensor[1] = -tensor[1]
            assert fingerprint(values) != whole, dtype
            tensor[1] = -tensor[1]


def test_copies_at_the_median_do_not_shrink_the_clip_radius_to_nothing() -> None:
    copies = torch.stack([torch.ones(8), 1.5 * torch.ones(8), torch.zeros(8), torch.zeros(8)])
    got = CenteredClip().aggregate(copies, torch.ones(4))
    assert torch.allclose(got, copies.mean(0), atol=1e-6)  # not the all-zero median


def test_a_partial_strikes_setting_keeps_the_other_defaults() -> None:
    rules = Rules(strikes={FAR: 3})
    assert rules.strikes[FAR] == 3 and rules.strikes[DIVERGED] == 2


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 17, 24, 31, 32, 33])
def test_the_lower_median_is_torch_median_also_with_ties(n: int) -> None:
    from potluck.trust.aggregate import lower_median
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(-3, 4, (n, 257), generator=gen).float()  # many ties
    assert torch.equal(lower_median(x), x.median(dim=0).values)


@pytest.mark.parametrize("n", range(1, 17))
def test_the_median_network_is_right_for_every_input_of_zeros_and_ones(n: int) -> None:
    """The 0-1 principle: a comparator network that picks the median of every input of
    zeros and ones picks it of every input. One column per such input."""
    from potluck.trust.aggregate import lower_median
    columns = torch.arange(1 << n)
    x = ((columns.unsqueeze(0) >> torch.arange(n).unsqueeze(1)) & 1).float()
    assert torch.equal(lower_median(x), x.median(dim=0).values)


def test_finite_rows_sees_nan_and_inf_anywhere() -> None:
    from potluck.trust.aggregate import finite_rows
    x = torch.ones(4, 9)
    x[1, 8], x[2, 0], x[3, 4] = float("nan"), float("inf"), -float("inf")
    assert finite_rows(x).tolist() == [True, False, False, False]


def test_a_gradient_dtype_that_cannot_carry_trusts_words_is_refused_up_front() -> None:
    from potluck.trust.part import _check_dtypes
    _check_dtypes(torch.nn.Linear(2, 2).to(torch.bfloat16))  # 4 values a word: fine
    odd = torch.nn.Module()
    odd.weight = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex128))
    with pytest.raises(ConfigError, match=r"parameter 'weight' is torch.complex128 \(16 "):
        _check_dtypes(odd)
    odd.weight = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))  # 8 bytes
    with pytest.raises(ConfigError, match=r"is torch.complex64 .* trust aggregates real"):
        _check_dtypes(odd)


@pytest.mark.parametrize("elastic", [False, True])
def test_a_resumed_fixed_job_notes_who_is_still_quarantined(elastic: bool) -> None:
    """The status page clears its trust cells when a fixed job restarts; the restored
    quarantines are noted again so that the cells are set anew (an elastic joiner's
    copy of the state is no news)."""
    from types import SimpleNamespace

    from potluck import events
    from potluck.trust import Trust
    from potluck.trust.part import TrustPart

    cohort: Any = SimpleNamespace(elastic=elastic, rank=0, world_size=4)
    part = TrustPart(Trust(), cohort, torch.nn.Linear(2, 2), lambda: None)
    struck = Evidence("rank3", 3, 7, FAR, "5.0x the median").as_dict()
    state = {"strikes": {"evidence": [struck], "quarantined": {"rank3": [struck, struck]}},
             "events": [], "steps": 9}
    heard: list[events.Note] = []
    stop = events.listen(heard.append)
    try:
        part.load_state_dict(state)
    finally:
        stop()
    assert list(part.quarantined) == ["rank3"]
    expected = [] if elastic else [("quarantine", "rank3", 9)]
    assert [(n.what, n.member, n.step) for n in heard] == expected
    assert all("still quarantined" in n.text and "far from the center" in n.text
               for n in heard)


def test_the_hooks_buffers_are_kept_per_bucket_and_name_on_the_cpu() -> None:
    from potluck.trust.exchange import Scratch

    scratch = Scratch()
    take = scratch.taker(0, torch.float32, torch.device("cpu"))
    first = take("result", 12)
    assert take("result", 12).data_ptr() == first.data_ptr()  # the next step's same one
    assert take("mine", 12).data_ptr() != first.data_ptr()
    other = scratch.taker(1, torch.float32, torch.device("cpu"))("result", 12)
    assert other.data_ptr() != first.data_ptr()
    smaller = take("result", 7)  # an unaudited step after an audited one: a slice of it
    assert smaller.numel() == 7 and smaller.data_ptr() == first.data_ptr()
    larger = take("result", 13)  # more than ever asked for: a new one
    assert larger.numel() == 13 and larger.data_ptr() != first.data_ptr()
    assert scratch.taker(0, torch.float16, torch.device("cpu"))("result", 13).dtype == (
        torch.float16)
    kept = take("mine", 12)
    scratch.clear()  # a new generation
    assert take("mine", 12).data_ptr() != kept.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64, torch.bool])
def test_the_fingerprint_read_in_place_is_the_word_sums_fingerprint(dtype: torch.dtype) -> None:
    """On the CPU the fingerprint sums the bits with numpy, in place; it must be the
    value the general way (``word_sums`` in torch, as on an accelerator) gives."""
    from potluck.trust.fingerprint import _MASK, _WORD, word_sums
    gen = torch.Generator().manual_seed(7)
    tensors = [(100 * torch.randn(n, generator=gen)).to(dtype) for n in (1, 7, 1000, 65537)]
    folded = 0
    for pair in torch.stack([word_sums(t) for t in tensors]).tolist():
        for value in pair:
            folded = (folded * 1_000_003 + (value & _WORD)) & _MASK
    assert fingerprint(tensors) == folded
    strided = [t[::2] for t in tensors]  # not contiguous: the general way
    assert fingerprint(strided) == fingerprint([t.contiguous() for t in strided])
    scalar = torch.tensor(3.0).to(dtype)  # 0-d
    assert fingerprint([scalar]) == fingerprint([scalar.reshape(1)])
    from potluck.trust.fingerprint import hash64
    one = tensors[2][::2][:1]  # one value of a strided view: "contiguous", stride 2
    assert hash64([one], 5) == hash64([torch.tensor([one.item()], dtype=dtype)], 5)
    assert hash64(strided, 5) == hash64([t.contiguous() for t in strided], 5)


def test_an_owners_distances_and_finite_flags_are_those_of_the_aggregate() -> None:
    """What an owner reports of each copy is what ``distances`` and ``finite_rows`` say
    of it, bit for bit, however the aggregate was reached: clean, with a copy left out,
    with a copy of no weight, with non-finite or overflowing copies, or none usable."""
    from potluck.trust.aggregate import aggregate_measured, distances, finite_rows
    clean = _honest(m=2000)
    attacked, broken, huge, nothing = clean.clone(), clean.clone(), clean.clone(), clean.clone()
    attacked[3] = -10 * attacked[3]
    broken[2, 7] = float("inf")
    huge[1] = 1e20  # finite, but its distance overflows
    nothing[:, 0] = float("nan")
    for weights in (torch.tensor([1.0, 2.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0, 1.0])):
        for copies in (clean, attacked, broken, huge, nothing):
            for aggregator in (CenteredClip(), CenteredClip(reject_at=None), TrimmedMean(1)):
                value, d2, finite = aggregate_measured(aggregator, copies, weights)
                exact = {"rtol": 0.0, "atol": 0.0, "equal_nan": True}
                torch.testing.assert_close(value, aggregator.aggregate(copies, weights), **exact)
                assert finite == finite_rows(copies).tolist()
                torch.testing.assert_close(torch.tensor(d2), distances(copies, value), **exact)


def test_the_kept_fingerprint_views_follow_in_place_updates_and_new_storage() -> None:
    from potluck.trust.fingerprint import Fingerprints
    net = torch.nn.Linear(8, 3)
    prints = Fingerprints()
    params = [p.data for p in net.parameters()]
    assert prints(params) == fingerprint(params)
    with torch.no_grad():
        net.weight.add_(1.0)  # in place: the kept views see it
    params = [p.data for p in net.parameters()]
    assert prints(params) == fingerprint(params)
    net.weight.data = net.weight.data.double()  # new storage and dtype: views made again
    params = [p.data for p in net.parameters()]
    assert prints(params) == fingerprint(params)
    assert prints(params[:1]) == fingerprint(params[:1]) and prints([]) == 0
    weight = net.weight.data
    assert prints([weight.t()]) == fingerprint([weight.t()])  # same storage, other layout
    assert prints([weight]) == fingerprint([weight])


def test_a_copy_three_honest_noises_off_is_never_averaged_in_whole() -> None:
    """A copy gets its full weight only near the honest ones: 3 honest copies and 1
    moved along a random direction (4 equal weights), the largest distance still
    averaged whole is about 2.7 times an honest copy's noise (the clip radius). Beyond
    3 it is clipped or left out."""
    gen = torch.Generator().manual_seed(0)
    center = torch.randn(20000, generator=gen)
    noise = torch.randn(3, 20000, generator=gen)
    direction = torch.nn.functional.normalize(torch.randn(20000, generator=gen), dim=0)
    spread = float(noise.norm(dim=1).mean())
    for off, whole in [(2.5, True), (3.0, False), (5.0, False), (50.0, False)]:
        copies = torch.cat([center + noise, (center + off * spread * direction)[None]])
        got = CenteredClip().aggregate(copies, torch.ones(4))
        assert torch.allclose(got, copies.mean(0), atol=1e-6) is whole, off


@pytest.mark.parametrize(("honest", "attackers"), [(2, 1), (3, 2), (4, 2), (3, 1)])
@pytest.mark.parametrize("scale", [-10.0, 1e3, 1e20])
def test_a_colluding_minority_far_off_moves_the_aggregate_little(honest: int, attackers: int,
                                                                 scale: float) -> None:
    """Attackers short of half, all at one far point (a sign flip times 10, a huge
    copy, one whose distance overflows): the aggregate stays within the honest spread,
    whatever their share of the weight (1 of 3, 2 of 5 are a third or more)."""
    gen = torch.Generator().manual_seed(honest * 10 + attackers)
    center = torch.ones(4000)
    copies = center + 0.1 * torch.randn(honest + attackers, 4000, generator=gen)
    copies[honest:] = scale * center
    got = CenteredClip().aggregate(copies, torch.ones(honest + attackers))
    honest_mean = copies[:honest].mean(0)
    spread = float((copies[:honest] - honest_mean).norm(dim=1).max())
    assert float((got - honest_mean).norm()) < spread


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_python_roundings_are_torchs(dtype: torch.dtype) -> None:
    """The clean case decides and squares in Python: ``_at_most`` rounds a radius as a
    comparison with a ``dtype`` tensor does, and ``_squares`` squares as ``dtype`` does,
    also past the dtype's range (inf) and below it (zero or subnormal)."""
    from potluck.trust.aggregate import _at_most, _squares

    gen = torch.Generator().manual_seed(5)
    big = torch.finfo(dtype).max
    values = torch.cat([torch.randn(2000, generator=gen, dtype=torch.float64) * scale
                        for scale in (1e-30, 1e-3, 1.0, 1e3, 1e19, 1e150)]).to(dtype)
    values = torch.cat([values, torch.tensor([0.0, -0.0, big, -big], dtype=dtype)])
    listed = values.tolist()
    assert _squares(listed, dtype) == values.square().tolist()
    limits = torch.randn(2000, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(
        -40, 40, (2000,), generator=gen)
    for limit in [*limits.tolist(), 1e300, -1e300, 0.0]:
        assert _at_most(limit, dtype) == float(torch.tensor(limit, dtype=torch.float64).to(dtype))
