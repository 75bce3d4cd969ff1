"""The data cursor's pure core: split arithmetic, permutation, state transitions, sampler."""

from __future__ import annotations

import itertools
import random
import re
from fractions import Fraction

import pytest
import torch

from potluck.data import CursorState, DataCursor, epoch_permutation, split_block, split_counts
from potluck.errors import ConfigError, CursorError


def random_shares(rng: random.Random, world_size: int) -> list[float]:
    shares = [rng.choice([0.0, 0.5, 1.0, 1.0, 2.0, 3.0, rng.random()]) for _ in range(world_size)]
    if not any(shares):
        shares[rng.randrange(world_size)] = 1.0
    return shares


# ------------------------------------------------------------------------------ split


def test_split_counts_equal_and_proportional() -> None:
    assert split_counts(12, [1, 1, 1]) == [4, 4, 4]
    assert split_counts(10, [1, 1, 1]) == [4, 3, 3]  # tie: lower rank first
    assert split_counts(12, [1, 2, 3]) == [2, 4, 6]
    assert split_counts(4, [1, 2, 3]) == [1, 1, 2]
    assert split_counts(5, [0, 1]) == [0, 5]
    assert split_counts(0, [1, 2]) == [0, 0]


def test_split_counts_property_largest_remainder() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        world_size = rng.randint(1, 8)
        shares = random_shares(rng, world_size)
        total = rng.randint(0, 300)
        counts = split_counts(total, shares)
        assert sum(counts) == total and all(c >= 0 for c in counts)
        weight = sum(Fraction(s) for s in shares)
        for share, count in zip(shares, counts, strict=True):
            quota = total * Fraction(share) / weight
            assert quota - 1 < count < quota + 1  # never off by a whole sample
            if share == 0:
                assert count == 0


def fraction_split(total: int, shares: list[float]) -> list[int]:
    """Largest remainder in ``Fraction`` arithmetic: the reference ``split_counts`` meets."""
    quotas = [total * Fraction(s) / sum(Fraction(x) for x in shares) for s in shares]
    counts = [int(q) for q in quotas]
    order = sorted(range(len(quotas)), key=lambda r: -(quotas[r] - counts[r]))
    for rank in order[:total - sum(counts)]:
        counts[rank] += 1
    return counts


def test_split_counts_equals_exact_rational_largest_remainder() -> None:
    rng = random.Random(1)
    for _ in range(3000):
        world_size = rng.randint(1, 8)
        shares = [rng.choice([0.0, 1.0, rng.random(), rng.random() * 1e-300,
                              rng.random() * 1e300, float(rng.randint(1, 9))])
                  for _ in range(world_size)]
        if not any(shares):
            shares[0] = 1.0
        total = rng.randint(0, 5000)
        assert split_counts(total, shares) == fraction_split(total, shares), (total, shares)


def test_split_block_is_contiguous_and_covers() -> None:
    parts = split_block(10, 22, [1, 0, 2])
    assert parts == [range(10, 14), range(14, 14), range(14, 22)]


@pytest.mark.parametrize(
    ("shares", "message"),
    [([], "shares=[]"), ([1, -1], "shares[1]=-1"), ([0, 0], "all zero"),
     ([1, float("nan")], "finite"), ([True], "shares[0]")],
)
def test_bad_shares_are_refused(shares: list[float], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        split_counts(4, shares)


# ------------------------------------------------------------------------ permutation


def test_permutation_depends_on_seed_and_epoch_only() -> None:
    a = epoch_permutation(100, seed=3, epoch=0)
    assert torch.equal(a, epoch_permutation(100, seed=3, epoch=0))
    assert sorted(a.tolist()) == list(range(100))
    assert not torch.equal(a, epoch_permutation(100, seed=3, epoch=1))
    assert not torch.equal(a, epoch_permutation(100, seed=4, epoch=0))


# ------------------------------------------------------------------------------ state


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"dataset_len": 10, "global_batch": 0}, "global_batch=0"),
     ({"dataset_len": 0, "global_batch": 1}, "dataset_len=0"),
     ({"dataset_len": 10, "global_batch": 11, "drop_last": True}, "drop every sample"),
     ({"dataset_len": 10, "global_batch": 2, "seed": -1}, "seed=-1"),
     ({"dataset_len": 10, "global_batch": 2, "cursor": 10}, "cursor=10")],
)
def test_bad_state_is_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CursorState(**kwargs)  # type: ignore[arg-type]


def test_short_last_step_or_dropped_tail() -> None:
    keep = CursorState(10, 4)
    assert [s.block for s in keep.rest_of_epoch()] == [(0, 4), (4, 8), (8, 10)]
    drop = CursorState(10, 4, drop_last=True)
    assert [s.block for s in drop.rest_of_epoch()] == [(0, 4), (4, 8)]
    assert drop.advanced().advanced() == CursorState(10, 4, drop_last=True, epoch=1)
    assert CursorState(10, 20).steps_per_epoch == 1  # one short step per epoch


def test_every_sample_once_per_epoch_for_many_settings() -> None:
    """Concatenating all ranks' parts over an epoch gives the permutation, in order."""
    rng = random.Random(1)
    for _ in range(300):
        n, drop_last = rng.randint(1, 60), rng.random() < 0.5
        global_batch = rng.randint(1, n if drop_last else n + 5)
        cursor = DataCursor(n, global_batch, seed=rng.randint(0, 9), drop_last=drop_last)
        perm = cursor.permutation(0).tolist()
        stream: list[int] = []
        while cursor.epoch == 0:
            shares = random_shares(rng, rng.randint(1, 5))  # may change every step
            for rank in range(len(shares)):
                stream += cursor.rank_indices(rank, shares)
            cursor.commit()
        assert stream == perm[: n - n % global_batch if drop_last else n]


def test_lost_parts_are_owed_and_served_before_the_rest() -> None:
    """A step committed without some of its block (a worker lost mid-round) owes those
    positions: each owed range is a step of its own, served next, even past the epoch's
    last block, so the epoch still trains every position exactly once."""
    state = CursorState(10, 4)
    state = state.advanced(lost=((1, 2),))  # block [0, 4): position 1 never arrived
    assert state.cursor == 4 and state.block == (1, 2) and state.steps_left == 3
    state = state.advanced()  # the owed step
    assert state.block == (4, 8)
    state = state.advanced(lost=((4, 5), (6, 8)))
    assert [s.block for s in state.rest_of_epoch()] == [(4, 5), (6, 8), (8, 10)]
    last = state.advanced().advanced().advanced(lost=((9, 10),))
    assert (last.epoch, last.cursor, last.block) == (0, 10, (9, 10))  # not rolled over yet
    assert last.advanced(lost=((9, 10),)).block == (9, 10)  # lost again: owed again
    assert last.advanced() == CursorState(10, 4, epoch=1)
    saved = DataCursor(10, 4)
    saved.load_state_dict(last.to_dict())
    assert saved.state == last
    with pytest.raises(ConfigError, match=r"lost range \[3, 6\) is not within"):
        CursorState(10, 4).advanced(lost=((3, 6),))
    with pytest.raises(ConfigError, match="owed range"):
        CursorState(10, 4, owed=((5, 11),))


def test_every_sample_once_with_random_losses() -> None:
    """Random parts lost at random steps: every epoch still covers the permutation
    exactly once."""
    rng = random.Random(3)
    for _ in range(200):
        n, global_batch = rng.randint(1, 40), rng.randint(1, 12)
        cursor = DataCursor(n, global_batch, seed=rng.randint(0, 9))
        trained: list[int] = []
        while cursor.epoch == 0:
            start, stop = cursor.state.block
            cut = sorted({rng.randint(start, stop) for _ in range(3)} | {start, stop})
            parts = list(itertools.pairwise(cut))
            lost = tuple(p for p in parts if rng.random() < 0.3)
            for a, b in parts:
                if (a, b) not in lost:
                    trained += cursor.permutation(0)[a:b].tolist()
            cursor.commit(lost=lost)
        assert sorted(trained) == list(range(n))


def test_state_dict_round_trip_and_validation() -> None:
    cursor = DataCursor(50, 8, seed=7)
    cursor.commit()
    cursor.commit()
    saved = cursor.state_dict()
    assert all(type(v) is int for k, v in saved.items() if k != "owed")
    assert saved["owed"] == []
    fresh = DataCursor(50, 8)
    fresh.load_state_dict(saved)
    assert fresh.state == cursor.state and fresh.global_indices() == cursor.global_indices()
    with pytest.raises(ConfigError, match="dataset_len=50 but this cursor has dataset_len=49"):
        DataCursor(49, 8).load_state_dict(saved)
    with pytest.raises(ConfigError, match="missing"):
        DataCursor(50, 8).load_state_dict({"epoch": 0})


def test_rank_out_of_range_is_refused() -> None:
    cursor = DataCursor(10, 2)
    with pytest.raises(ConfigError, match="rank=2 is out of range for 2"):
        cursor.rank_indices(2, world_size=2)
    with pytest.raises(ConfigError, match="neither shares nor world_size"):
        cursor.batch_sampler(0)
    with pytest.raises(ConfigError, match="world_size=3 but len"):
        cursor.batch_sampler(0, [1, 1], world_size=3)


# ---------------------------------------------------------------------------- sampler


def test_sampler_starts_at_committed_cursor_and_runs_ahead() -> None:
    cursor = DataCursor(12, 4, seed=2)
    sampler = cursor.batch_sampler(1, world_size=2)
    first = list(sampler)  # does not wait for commits
    assert len(first) == 3 and all(len(part) == 2 for part in first)
    cursor.commit()
    assert len(sampler) == 2
    assert list(sampler) == first[1:]  # a new iterator starts at the committed step
    sampler.reshard(0, [1, 3])
    assert next(iter(sampler)) == cursor.global_indices()[:1]


def test_loader_refuses_conflicts_and_catches_missed_commit() -> None:
    cursor = DataCursor(8, 2)
    with pytest.raises(ConfigError, match="batch_size"):
        cursor.loader(list(range(8)), rank=0, world_size=1, batch_size=2)
    with pytest.raises(ConfigError, match="len\\(dataset\\)=7"):
        cursor.loader(list(range(7)), rank=0, world_size=1)
    loader = cursor.loader(list(range(8)), rank=0, world_size=1)
    batches = iter(loader)
    next(batches)
    with pytest.raises(CursorError, match="commit"):
        next(batches)  # no commit after the first step


def test_loader_yields_none_for_an_empty_share() -> None:
    cursor = DataCursor(6, 3)
    assert list(cursor.loader(list(range(6)), rank=0, shares=[0, 1], strict=False)) == [None] * 2
