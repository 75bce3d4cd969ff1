"""``tests/order.py``: the long tests go first, dealt evenly to xdist's first slices."""

from __future__ import annotations

import pytest

from tests.order import LONG, estimate, slices, worksteal_sizes


@pytest.mark.timeout(10)
def test_worksteal_sizes_are_what_xdist_hands_out_first() -> None:
    assert worksteal_sizes(7, 2) == [3, 4]
    assert worksteal_sizes(8, 2) == [4, 4]
    assert worksteal_sizes(5, 1) == [5]
    assert sum(worksteal_sizes(1001, 3)) == 1001


@pytest.mark.timeout(10)
def test_the_long_ones_open_each_slice_and_the_seconds_are_even() -> None:
    weights = [0, 50, 0, 0, 40, 0, 30, 0, 20, 0]
    cut = slices([5, 5], weights)
    assert sorted(i for part in cut for i in part) == list(range(10))  # each test once
    assert [len(part) for part in cut] == [5, 5]
    assert cut[0][:2] == [1, 8] and cut[1][:2] == [4, 6]  # 50 + 20 beside 40 + 30
    assert cut[0][2:] == [0, 2, 3] and cut[1][2:] == [5, 7, 9]  # the rest in order


@pytest.mark.timeout(10)
def test_a_slice_that_is_full_takes_no_more_long_ones() -> None:
    cut = slices([1, 3], [9, 8, 7, 0])
    assert cut == [[0], [1, 2, 3]]


@pytest.mark.timeout(10)
def test_the_longest_prefix_gives_the_estimate() -> None:
    some = next(iter(LONG))
    assert estimate(some + "anything[1]") == LONG[some]
    assert estimate("tests/unit/no_such_test.py::test") == 0.0
