"""Spot checks (pure and local): the recomputed gradient is the loop's, the model and
the random stream are untouched, and the verdict needs most of the other owners."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from potluck.errors import ConfigError
from potluck.trust import Rules, SpotCheck
from potluck.trust.spot import (
    in_slices,
    recompute_gradient,
    relative,
    slice_error,
    snapshot,
)
from potluck.trust.verdict import WRONG_GRADIENT, Reports, SpotResult, judge, spot_checked


def _loss(model: Any, batch: Any) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def test_the_recomputed_gradient_is_the_loops_and_touches_nothing() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    batch = (torch.randn(16, 6), torch.randint(0, 3, (16,)))
    state = snapshot(net)
    kept = {name: t.clone() for name, t in state.items()}
    stats = net[1].running_mean.clone()
    rng = torch.get_rng_state()
    got = recompute_gradient(net, state, _loss, batch)
    got_again = recompute_gradient(net, state, _loss, batch, wanted={"0.weight"})
    assert torch.equal(got_again["0.weight"], got["0.weight"])
    assert all(torch.equal(state[n], kept[n]) for n in kept)  # nor the snapshot (buffers)
    assert torch.equal(net[1].running_mean, stats)  # BatchNorm's statistics untouched
    assert torch.equal(torch.get_rng_state(), rng)  # the training's random stream too
    assert all(p.grad is None for p in net.parameters())
    _loss(net, batch).backward()
    for name, p in net.named_parameters():
        assert torch.allclose(got[name], p.grad, rtol=1e-6, atol=1e-7), name


def test_only_the_wanted_gradients_are_computed_and_equal_the_whole_ones() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    batch = (torch.randn(16, 6), torch.randint(0, 3, (16,)))
    state = snapshot(net)
    whole = recompute_gradient(net, state, _loss, batch)
    for wanted in ({"2.weight"}, {"0.bias", "4.weight"}, {"4.bias"}):
        got = recompute_gradient(net, state, _loss, batch, wanted=wanted)
        assert set(got) == set(whole)
        for name, grad in got.items():
            assert torch.equal(grad, whole[name] if name in wanted
                               else torch.zeros_like(whole[name])), (wanted, name)
    seq = nn.Sequential(nn.Linear(4, 2))
    seq.register_parameter("spare", nn.Parameter(torch.ones(3)))  # the loss never reaches it
    for wanted in ({"spare"}, set()):
        got = recompute_gradient(seq, snapshot(seq), lambda m, b: m(b).sum(), torch.randn(3, 4),
                                 wanted=wanted)
        assert all(torch.equal(g, torch.zeros_like(g)) for g in got.values()), wanted


@pytest.mark.parametrize("seed", range(6))
def test_an_owners_slices_of_the_partial_gradient_are_the_whole_ones(seed: int) -> None:
    # Buckets of parameters in any order, slices that cut parameters, more owners than
    # a bucket has values: each owner's slices of the gradients computed for its own
    # parameters (in_slices) are the whole gradient's, bit for bit.
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3), nn.Tanh(), nn.Linear(3, 1))
    batch = torch.randn(9, 5, generator=gen)
    loss = lambda m, b: m(b).pow(2).mean()  # noqa: E731
    state = snapshot(net)
    whole = recompute_gradient(net, state, loss, batch)
    named = dict(net.named_parameters())
    order = [list(named)[i] for i in torch.randperm(len(named), generator=gen).tolist()]
    cut = sorted(torch.randperm(len(order) - 1, generator=gen)[:2].add(1).tolist())
    groups = [order[:cut[0]], order[cut[0]:cut[1]], order[cut[1]:]]
    owners = tuple(range(int(torch.randint(1, 7, (1,), generator=gen))))
    buckets = []
    for group in groups:
        numel = sum(named[n].numel() for n in group)
        buckets.append((owners, -(-numel // len(owners)), [named[n] for n in group]))
    by_id = {id(p): n for n, p in named.items()}
    for me in owners:
        wanted = {by_id[id(p)] for p in in_slices(buckets, me)}
        got = recompute_gradient(net, state, loss, batch, wanted=wanted)
        for _, piece, params in buckets:
            flat_got = torch.cat([got[by_id[id(p)]].reshape(-1) for p in params])
            flat_whole = torch.cat([whole[by_id[id(p)]].reshape(-1) for p in params])
            mine = slice(me * piece, (me + 1) * piece)
            assert torch.equal(flat_got[mine], flat_whole[mine]), (seed, me, params)
    assert in_slices(buckets, len(owners)) == []  # not an owner: no slice


def test_a_forward_that_writes_its_weights_leaves_the_snapshot_as_it_was() -> None:
    # Embedding(max_norm=...) renormalizes the rows it looks up, in place, in forward
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(10, 4, max_norm=0.5), nn.Flatten(), nn.Linear(8, 3))
    with torch.no_grad():
        net[0].weight.mul_(10.0)  # (rows far over the norm)
    batch = (torch.tensor([[1, 2], [3, 1]]), torch.tensor([0, 2]))
    state = snapshot(net)
    kept = {name: t.clone() for name, t in state.items()}
    first = recompute_gradient(net, state, _loss, batch, wanted={"2.weight"})
    again = recompute_gradient(net, state, _loss, batch)
    assert all(torch.equal(state[n], kept[n]) for n in kept)
    assert torch.equal(first["2.weight"], again["2.weight"])


def test_a_snapshot_is_a_copy_the_model_does_not_move() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    state = snapshot(net)
    kept = {name: t.clone() for name, t in [*net.named_parameters(), *net.named_buffers()]}
    assert set(state) == set(kept)
    assert all(torch.equal(state[n], kept[n]) and state[n].data_ptr() != t.data_ptr()
               for n, t in [*net.named_parameters(), *net.named_buffers()])
    with torch.no_grad():
        net[0].weight.add_(1.0)
    net(torch.randn(5, 4))  # (moves the BatchNorm statistics)
    assert all(torch.equal(state[n], kept[n]) for n in kept)


def test_an_unused_parameter_gets_a_zero_gradient() -> None:
    seq = nn.Sequential(nn.Linear(4, 2))
    seq.register_parameter("spare", nn.Parameter(torch.ones(3)))
    grads = recompute_gradient(seq, snapshot(seq), lambda m, b: m(b).sum(), torch.randn(3, 4))
    assert torch.equal(grads["spare"], torch.zeros(3))


def test_a_loss_that_is_not_a_scalar_is_refused_clearly() -> None:
    net = nn.Linear(4, 2)
    with pytest.raises(ConfigError, match="scalar loss"):
        recompute_gradient(net, snapshot(net), lambda m, b: m(b), torch.randn(3, 4))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="every"):
        SpotCheck(_loss, every=0)
    with pytest.raises(ConfigError, match="tolerance"):
        SpotCheck(_loss, tolerance=2.0)
    with pytest.raises(ConfigError, match="callable"):
        SpotCheck("loss")  # type: ignore[arg-type]


def test_slice_error_compares_the_owned_slice_and_ignores_padding() -> None:
    flat = torch.arange(10.0)
    assert slice_error(flat, flat[4:8].clone(), 4) == (0.0, float((flat[4:8] ** 2).sum()))
    diff, _ = slice_error(flat, torch.tensor([8.0, 9.0, 123.0]), 8)  # 123: padding
    assert diff == 0.0
    assert relative([(1.0, 4.0), (0.0, 0.0)]) == 0.5
    assert relative([]) == 0.0


def test_slice_error_counts_only_what_lies_beyond_the_slack() -> None:
    flat = torch.tensor([1.0, 2.0, 3.0])
    copy = torch.tensor([1.1, 1.5, float("nan")])
    slack = torch.tensor([0.2, 0.2, 10.0])
    diff, norm = slice_error(flat, copy, 0, slack)
    assert diff == float("inf") and norm == 14.0  # a NaN is off whatever the slack
    diff, _ = slice_error(flat[:2], copy[:2], 0, slack[:2])
    assert diff == pytest.approx(0.3 ** 2)  # 0.1 is within its slack, 0.5 is 0.3 beyond


def _spots(results: list[SpotResult | None]) -> Reports:
    n = len(results)
    return Reports(finite=[[1.0] * n] * n, distance=[[1.0] * n] * n, owns=[5.0] * n,
                   fingerprint=[3] * n, spot=results)


def test_a_wrong_gradient_needs_most_of_the_other_owners() -> None:
    wrong, right = SpotResult(3, 0.9, True), SpotResult(3, 0.0, False)
    found = judge(_spots([wrong, wrong, right, None]), [8] * 4, range(4), Rules())
    assert [(i, kind) for i, kind, *_ in found] == [(3, WRONG_GRADIENT)]
    # one lying owner cannot accuse an honest rank
    assert spot_checked(_spots([SpotResult(2, 5.0, True), SpotResult(2, 0.0, False),
                                None, SpotResult(2, 0.0, False)]), range(4), range(4)) == []
    # nor can the target acquit itself: its own report is not a vote
    assert spot_checked(_spots([wrong, wrong, None, SpotResult(3, 0.0, False)]), range(4),
                        range(4))[0][0] == 3
