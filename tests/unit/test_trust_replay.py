"""A copy that repeats one its sender sent before, bit for bit, is flagged; zeros, a rank
with no weight and an honest change are not; the owners' majority decides (pure)."""

from __future__ import annotations

import torch

from potluck.trust import Rules, wire
from potluck.trust.replay import ReplayWatch
from potluck.trust.verdict import REPLAYED, Reports, judge

SENDERS = (0, 1, 2)


def _rows(seed: int) -> torch.Tensor:
    return torch.randn(3, 50, generator=torch.Generator().manual_seed(seed))


def test_a_copy_sent_again_is_flagged_and_nothing_else_is() -> None:
    watch, ones = ReplayWatch(memory=5), torch.ones(3)
    first, second = _rows(1), _rows(2)
    assert watch.check(0, SENDERS, first, ones) == [False] * 3
    assert watch.check(0, SENDERS, second, ones) == [False] * 3
    replay = _rows(4)
    replay[2] = first[2]  # rank 2 sends its copy of two steps ago
    replay[1] = second[1]
    replay[1, 7] = torch.nextafter(replay[1, 7], torch.tensor(9.0))  # one bit apart
    assert watch.check(0, SENDERS, replay, ones) == [False, False, True]
    assert watch.check(1, SENDERS, first, ones) == [False] * 3  # another bucket
    zeros = torch.zeros(3, 50)
    assert watch.check(0, SENDERS, zeros, ones) == [False] * 3
    assert watch.check(0, SENDERS, zeros, ones) == [False] * 3  # all zeros: no samples
    assert watch.check(0, SENDERS, first, torch.tensor([1.0, 1.0, 0.0])) == [
        True, True, False]  # (rank 2 has no weight this step)
    watch.forget()
    assert watch.check(0, SENDERS, first, ones) == [False] * 3


def test_copies_read_in_place_beside_their_headers_sum_as_copied_out() -> None:
    from potluck.trust.fingerprint import word_sums
    from potluck.trust.replay import _sums

    for dtype in (torch.float32, torch.float64, torch.float16):
        buffer = torch.randn(3, 53, generator=torch.Generator().manual_seed(5)).to(dtype)
        rows = buffer[:, :51]  # as the exchange hands them: each row followed by a header
        assert _sums(rows) == _sums(rows.contiguous()), dtype
        assert word_sums(rows, dim=1).dtype == torch.int32
        before = _sums(rows)
        for column in (0, -1):  # a bit in either half changes that row's sums alone
            words = rows.view({2: torch.int16, 4: torch.int32, 8: torch.int32}[
                rows.element_size()])
            words[1, column] ^= 1
            after = _sums(rows)
            assert after[1] != before[1] and after[0] == before[0], (dtype, column)
            words[1, column] ^= 1


def test_eight_byte_and_two_byte_values_are_watched_too() -> None:
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        watch, rows = ReplayWatch(), _rows(3).to(dtype)
        assert watch.check(0, SENDERS, rows, torch.ones(3)) == [False] * 3
        assert watch.check(0, SENDERS, rows, torch.ones(3)) == [True] * 3


def test_the_owners_majority_flags_a_replay_and_it_rides_in_the_report() -> None:
    owners = senders = (0, 1, 2, 3)
    rows = torch.stack([wire.encode_report(1, [True] * 4, [1.0] * 4, [5] * 4,
                                           replayed=[False, False, False, o != 1])
                        for o in owners])
    reports = wire.decode_reports([(owners, senders, rows)], 4)
    assert reports.replayed[0] == [0.0, 0.0, 0.0, 1.0] and reports.replayed[1][3] == 0.0
    assert reports.finite[0] == [1.0] * 4
    found = judge(reports, [1] * 4, range(4), Rules())
    assert [(f.rank, f.kind) for f in found] == [(3, REPLAYED)]

    def flagged_by(voters: set[int]) -> list[int]:
        votes = [[float(o in voters and s == 3) for s in range(4)] for o in range(4)]
        quiet = Reports(finite=[[1.0] * 4] * 4, distance=[[1.0] * 4] * 4, owns=[1.0] * 4,
                        fingerprint=[5] * 4, replayed=votes)
        return [f.rank for f in judge(quiet, [1] * 4, range(4), Rules()) if f.kind == REPLAYED]

    assert flagged_by({0}) == []  # one lying owner cannot accuse
    assert flagged_by({0, 1}) == [3]  # two of the three others can
    assert flagged_by({3}) == []  # its own word about itself does not count


def test_nobody_is_flagged_when_most_senders_repeat_and_negative_zeros_are_zeros() -> None:
    # a slice that stopped changing for everyone (a parameter no longer trained)
    votes = [[float(o != s) for s in range(4)] for o in range(4)]
    reports = Reports(finite=[[1.0] * 4] * 4, distance=[[1.0] * 4] * 4, owns=[1.0] * 4,
                      fingerprint=[5] * 4, replayed=votes)
    assert [f for f in judge(reports, [1] * 4, range(4), Rules()) if f.kind == REPLAYED] == []
    watch, negative = ReplayWatch(), -torch.zeros(3, 50)
    assert watch.check(0, SENDERS, negative, torch.ones(3)) == [False] * 3
    assert watch.check(0, SENDERS, negative, torch.ones(3)) == [False] * 3
