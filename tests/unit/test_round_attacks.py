"""The lab's attacks on a round's pseudo-gradient (``potluck_lab.round_attacks``): what
each one sends given this rank's delta and the other members', and the wrapper around
a round sum, on a group faked in one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.futures import Future

from potluck.sync.round_sum import Piece
from potluck_lab.round_attacks import (
    OMNISCIENT,
    ROUND_ATTACKS,
    RoundAttack,
    Strength,
    View,
    first_round,
    other_labels,
    rewrite,
)

DELTA = torch.tensor([1.0, -2.0, 0.5, 4.0])
HONEST = (torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 2.0, 1.0, 0.0]),
          torch.tensor([2.0, 5.0, 2.0, 2.0]))


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize(("name", "expected"), [
    ("sign_flip", DELTA * -10.0),
    ("nan", torch.full((4,), float("nan"))),
    ("ipm", torch.tensor([-1.0, -1.5, -1.0, -1.0])),  # -0.5 x the honest mean (2, 3, 2, 2)
    ("free_rider", torch.zeros(4)),
    ("free_rider_scaled", DELTA * 0.1),
    ("copy", HONEST[0]),
    ("other_data", DELTA),
])
def test_each_attack_sends_its_transformation_of_the_delta(
        name: str, expected: torch.Tensor) -> None:
    sent = rewrite(name, DELTA, View(HONEST), _gen())
    torch.testing.assert_close(sent, expected, equal_nan=True)


def test_alie_sends_the_honest_mean_minus_z_standard_deviations_per_coordinate() -> None:
    honest = torch.stack(HONEST)
    expected = honest.mean(0) - 1.5 * honest.std(0)
    sent = rewrite("alie", DELTA, View(HONEST), _gen(), Strength(z=1.5))
    torch.testing.assert_close(sent, expected)
    assert not torch.equal(sent, honest.mean(0))  # the spread moved it


def test_noise_adds_gaussian_noise_a_hundred_times_the_deltas_rms() -> None:
    delta = torch.randn(20_000, generator=_gen())
    added = rewrite("noise", delta, View(), torch.Generator().manual_seed(1)) - delta
    rms = float(delta.pow(2).mean().sqrt())
    assert float(added.std()) == pytest.approx(100 * rms, rel=0.05)
    assert abs(float(added.mean())) < 2 * rms  # centred


def test_replay_sends_the_last_rounds_delta_and_its_own_in_the_first() -> None:
    previous = torch.tensor([9.0, 8.0, 7.0, 6.0])
    torch.testing.assert_close(rewrite("replay", DELTA, View(previous=previous), _gen()),
                               previous)
    torch.testing.assert_close(rewrite("replay", DELTA, View(), _gen()), DELTA)
    assert first_round("replay") == 2 and first_round("sign_flip") == 1


def test_the_delta_given_is_not_changed_and_a_new_tensor_comes_back() -> None:
    for name in ROUND_ATTACKS:
        delta = DELTA.clone()
        sent = rewrite(name, delta, View(HONEST, previous=DELTA * 2), _gen())
        assert torch.equal(delta, DELTA), name
        assert sent.data_ptr() != delta.data_ptr(), name


def test_an_omniscient_attack_without_the_others_deltas_and_an_unknown_name_are_refused() -> None:
    for name in OMNISCIENT:
        with pytest.raises(ValueError, match="other members' deltas"):
            rewrite(name, DELTA, View(), _gen())
    with pytest.raises(ValueError, match="attack 'stale': one of sign_flip"):
        rewrite("stale", DELTA, View(), _gen())
    with pytest.raises(ValueError, match="attack 'bit_flip'"):
        RoundAttack(lambda piece, group: Future(), "bit_flip", True)


def test_other_labels_move_every_label_to_another_class_one_to_one() -> None:
    labels = torch.tensor([0, 1, 2, 7, 7, 3])
    moved = other_labels(labels, 8)
    assert torch.equal(moved, torch.tensor([1, 2, 3, 0, 0, 4]))
    assert (moved != labels).all()
    assert sorted(other_labels(torch.arange(8), 8).tolist()) == list(range(8))


class _Work:
    def wait(self) -> bool:
        return True


class _Group:
    """Rank ``rank`` of ``len(deltas)``; its all-gather hands out ``deltas`` (the
    other ranks' true deltas, as they would send them) with its own in its place."""

    def __init__(self, rank: int, deltas: list[torch.Tensor]) -> None:
        self._rank, self.deltas, self.gathers = rank, deltas, 0

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return len(self.deltas)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> _Work:
        self.gathers += 1
        for i, row in enumerate(outputs[0]):
            row.copy_(inputs[0] if i == self._rank else self.deltas[i])
        return _Work()


def _sent(attack: RoundAttack, group: _Group, delta: torch.Tensor, round_: int = 1,
          key: str = "cpu/float32") -> torch.Tensor:
    seen: list[torch.Tensor] = []

    def inner(piece: Piece, group: Any) -> Future[torch.Tensor]:
        seen.append(piece.delta.clone())
        future: Future[torch.Tensor] = Future()
        future.set_result(piece.delta)
        return future

    attack.inner = inner
    attack(Piece(delta.clone(), 0.25, key, 0, round_, (0, 1)), group)  # type: ignore[arg-type]
    return seen[0]


def test_the_wrapper_rewrites_on_the_attacker_only_and_every_rank_joins_the_oracle() -> None:
    deltas = [*HONEST, DELTA]
    for rank in range(4):
        group = _Group(rank, deltas)
        attack = RoundAttack(lambda piece, group: Future(), "ipm", active=rank == 3)
        sent = _sent(attack, group, deltas[rank])
        expected = torch.stack(HONEST).mean(0) * -0.5 if rank == 3 else deltas[rank]
        torch.testing.assert_close(sent, expected)
        assert group.gathers == 1, rank  # the same collectives on every rank


def test_the_wrapper_gathers_nothing_for_an_attack_that_needs_no_oracle() -> None:
    group = _Group(3, [*HONEST, DELTA])
    sent = _sent(RoundAttack(lambda piece, group: Future(), "sign_flip", True), group, DELTA)
    torch.testing.assert_close(sent, DELTA * -10.0)
    assert group.gathers == 0


def test_the_wrapper_replays_each_keys_own_true_delta_of_the_round_before() -> None:
    group = _Group(3, [*HONEST, DELTA])
    attack = RoundAttack(lambda piece, group: Future(), "replay", True)
    first, second = DELTA, DELTA * 3
    torch.testing.assert_close(_sent(attack, group, first, 1), first)
    torch.testing.assert_close(_sent(attack, group, first * 7, 1, key="other"), first * 7)
    torch.testing.assert_close(_sent(attack, group, second, 2), first)
    torch.testing.assert_close(_sent(attack, group, DELTA * 5, 3), second)  # true, not sent
