"""What rides on the robust exchange: 64-bit words in any bucket dtype, the owners'
reports and the fingerprints every rank decodes alike (pure)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from potluck.trust import wire


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16,
                                   torch.float64])
def test_words_survive_any_bucket_dtype_bit_for_bit(dtype: torch.dtype) -> None:
    # extremes, and patterns that read as NaN or Inf in the narrow dtypes
    words = torch.tensor([0, -1, (1 << 63) - 1, -(1 << 63), 0x7FF8_0000_0000_0001,
                          0x7C01_7FC1_FFFF_FF80, wire.float_word(math.pi)], dtype=torch.int64)
    values = wire.to_values(words, dtype)
    assert values.dtype == dtype and values.numel() == words.numel() * wire.per_word(dtype)
    carried = torch.cat([torch.randn(3).to(dtype), values]).clone()[3:]  # moved, as on the wire
    assert torch.equal(wire.to_words(carried), words)
    assert wire.word_float(wire.float_word(-2.5e-300)) == -2.5e-300


def test_reports_decode_to_what_each_owner_saw_summed_over_buckets() -> None:
    owners = senders = (0, 1, 3)  # rank 2 is out: it owns nothing and nobody hears it
    one = torch.stack([wire.encode_report(10, [True, True, o != 1], [1.0, 2.0, 3.0 + o],
                                          [5, 5, 9]) for o in owners])
    two = torch.stack([wire.encode_report(4, [True, True, True], [0.5, 0.5, 0.5], [5, 5, 9])
                       for _ in owners])
    reports = wire.decode_reports([(owners, senders, one), (owners, senders, two)], 4)
    assert reports.owns == [14.0, 14.0, 0.0, 14.0]
    assert reports.finite[1] == [1.0, 1.0, 1.0, 0.0] and reports.finite[0][3] == 1.0
    assert reports.distance[3] == [1.5, 2.5, 0.0, 6.5]
    assert reports.fingerprint == [5, 5, 0, 9]


def test_a_fingerprint_without_a_majority_of_owners_counts_as_no_fingerprint() -> None:
    owners = senders = (0, 1, 2, 3)
    # rank 3 told owners 0 and 1 one fingerprint and owners 2 and 3 another
    rows = torch.stack([wire.encode_report(1, [True] * 4, [1.0] * 4,
                                           [7, 7, 7, 11 if o < 2 else 12]) for o in owners])
    prints = wire.decode_reports([(owners, senders, rows)], 4).fingerprint
    assert prints[:3] == [7, 7, 7]
    assert prints[3] not in (7, 11, 12) and prints[3] < 0


def test_an_owners_spot_check_rides_in_its_report() -> None:
    from potluck.trust.verdict import SpotResult
    owners = senders = (0, 1, 2)
    rows = torch.stack([wire.encode_report(3, [True] * 3, [1.0] * 3, [1, 1, 1],
                                           SpotResult(2, 0.25, True) if o == 0 else None)
                        for o in owners])
    spots = wire.decode_reports([(owners, senders, rows)], 3).spot
    assert spots == [SpotResult(2, 0.25, True), None, None]


def test_the_bitmap_words_are_or_ed_byte_by_byte() -> None:
    """``either`` merges bitmap words (one byte per parameter, 0 or 1): a byte is
    nonzero where any row's is, so an owner's OR over its senders and a rank's over the
    owners keep every parameter any of them produced."""
    assert wire.words_for(0) == 0 and wire.words_for(1) == 1
    assert wire.words_for(8) == 1 and wire.words_for(9) == 2
    rows = []
    for used in ([0, 2], [2, 9], []):
        marks = torch.zeros(16, dtype=torch.uint8)
        marks[used] = 1
        rows.append(marks.view(torch.int64).tolist())
    merged = torch.tensor(wire.either(rows), dtype=torch.int64).view(torch.uint8)
    assert merged.nonzero().flatten().tolist() == [0, 2, 9]
    assert wire.either([]) == []


@pytest.mark.parametrize(("numel", "owners"), [(12, 4), (13, 4), (2, 4), (1, 1), (7, 3)])
def test_a_copy_laid_out_in_the_lanes_is_the_padded_gradient(numel: int, owners: int) -> None:
    from potluck.trust.exchange import _laid_out

    flat = torch.arange(1, numel + 1, dtype=torch.float32)
    piece = -(-numel // owners)
    lanes = torch.full((owners, piece + 2), -1.0)  # a lane is the slice, then header words
    rows = _laid_out(flat, lanes[:, :piece])
    padded = torch.cat([flat, torch.zeros(piece * owners - numel)])
    assert torch.equal(rows, padded.view(owners, piece))
    assert (lanes[:, piece:] == -1).all()  # the header words are left alone


def _exchange_finishing(failure: BaseException) -> tuple[Any, Any]:
    """A trust exchange whose aggregation of a pending bucket (0) raises ``failure``, and
    that bucket's stand-in (its future and its bucket's index and rank)."""
    from types import SimpleNamespace

    from potluck.trust import CenteredClip
    from potluck.trust.exchange import Ledger, RobustExchange

    exchange = RobustExchange(CenteredClip(), Ledger(), lambda: None, lambda n: range(n),
                              lambda: 0)

    def gathered(scattered: Any) -> Any:
        raise failure

    exchange._gathered = gathered  # type: ignore[method-assign]
    pending = SimpleNamespace(bucket=SimpleNamespace(index=0, rank=2),
                              result=torch.futures.Future())
    return exchange, pending


def test_an_earlier_buckets_own_error_names_that_bucket_and_fails_its_future() -> None:
    from potluck.errors import CommHookError

    exchange, pending = _exchange_finishing(ValueError("a shape the aggregator refused"))
    with pytest.raises(CommHookError, match=r"bucket 0's aggregation \(run in bucket 1's "
                                            r"call\) on rank 2 .*ValueError: a shape"):
        exchange._finish(pending, 1)
    with pytest.raises(ValueError, match="a shape"):  # nothing waits on it forever
        pending.result.wait()


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), RuntimeError("Gloo connection "
                                                                       "closed by peer")])
def test_an_interrupt_or_a_lost_peer_in_an_earlier_bucket_is_raised_as_it_is(
        failure: BaseException) -> None:
    exchange, pending = _exchange_finishing(failure)
    with pytest.raises(type(failure)):  # (Ctrl-C stays Ctrl-C; a backend failure a lost peer)
        exchange._finish(pending, 1)
    assert pending.result.done()
    with pytest.raises(RuntimeError):
        pending.result.wait()
