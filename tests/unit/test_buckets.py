"""Bucket assignment is a pure function: sizes, keys and order in, index lists out."""

from __future__ import annotations

import random

import pytest

from potluck.errors import ConfigError
from potluck.reducer.buckets import assign_buckets


def test_every_index_exactly_once_in_ready_order() -> None:
    rng = random.Random(0)
    sizes = [rng.randint(1, 50) for _ in range(40)]
    keys = [rng.choice(["f32", "bf16"]) for _ in range(40)]
    order = list(range(40))
    rng.shuffle(order)
    buckets = assign_buckets(sizes, keys, order, cap_bytes=60, first_cap_bytes=10)
    flat = [i for bucket in buckets for i in bucket]
    assert sorted(flat) == list(range(40))
    position = {index: pos for pos, index in enumerate(order)}
    for bucket in buckets:
        assert [position[i] for i in bucket] == sorted(position[i] for i in bucket)
        assert len({keys[i] for i in bucket}) == 1


def test_caps_first_bucket_small_then_cap_exceeded_by_at_most_one_tensor() -> None:
    sizes = [4] * 10
    buckets = assign_buckets(sizes, ["k"] * 10, list(reversed(range(10))), 12, 4)
    assert buckets == [[9], [8, 7, 6], [5, 4, 3], [2, 1, 0]]


def test_tensor_larger_than_cap_travels_alone() -> None:
    buckets = assign_buckets([1, 100, 1, 1], ["k"] * 4, [0, 1, 2, 3], 10, 10)
    assert buckets == [[0, 1], [2, 3]]
    buckets = assign_buckets([100, 1, 1], ["k"] * 3, [0, 1, 2], 10, 10)
    assert buckets == [[0], [1, 2]]


def test_buckets_sorted_by_completion_across_keys() -> None:
    # a,b interleaved keys: the "a" bucket completes at position 2, "b" at position 3.
    sizes = [5, 5, 5, 5]
    keys = ["a", "b", "a", "b"]
    buckets = assign_buckets(sizes, keys, [0, 1, 2, 3], 10, 10)
    assert buckets == [[0, 2], [1, 3]]
    buckets = assign_buckets(sizes, keys, [1, 0, 3, 2], 10, 10)
    assert buckets == [[1, 3], [0, 2]]


def test_one_bucket_when_cap_is_huge() -> None:
    assert assign_buckets([3, 3, 3], ["k"] * 3, [2, 1, 0], 10**9, 10**9) == [[2, 1, 0]]


def test_empty_model_has_no_buckets() -> None:
    assert assign_buckets([], [], [], 10, 1) == []


@pytest.mark.parametrize(
    ("sizes", "keys", "order", "cap", "match"),
    [
        ([1, 2], ["k"], [0, 1], 10, "one key per tensor"),
        ([1, 2], ["k", "k"], [0, 0], 10, "permutation"),
        ([1, 2], ["k", "k"], [0, 1], 0, "positive"),
    ],
)
def test_bad_input_is_a_clear_error(
    sizes: list[int], keys: list[str], order: list[int], cap: int, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        assign_buckets(sizes, keys, order, cap)
