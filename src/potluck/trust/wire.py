"""What rides on the robust exchange's two all-to-alls besides the gradient (pure).

Trust needs a few numbers from every rank each step: its parameters' fingerprint, and
each owner's report on the copies it aggregated. Rather than a collective of their own,
they travel as 64-bit *words* appended to the gradient slices, their bytes reinterpreted
in the bucket's dtype (a word is 2 float32 values, 4 bf16 ones): an all-to-all only
moves bytes, so every bit arrives as sent.

- A sender's message to each owner: its slice, then one word, its fingerprint, then
  in the pass's last bucket its unused-parameter bitmap (one byte per parameter, in
  ``words_for`` words).
- An owner's message to each rank: its aggregate, then its report, ``report_words``
  words (``encode_report``: what it saw of each sender, its spot check and its audit
  of the last step, and as an audited owner the digests of the copies it received),
  then in the last bucket the OR of its senders' bitmaps (``either``), then any audit
  copy (``audit.py``) and its tag, one word (``audit_tag``: which owner's slice of
  which step it is).

``decode_reports`` turns the reports every rank received into the ``Reports`` that
``verdict.judge`` reads.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Sequence

import torch

from potluck.trust.verdict import AuditResult, Handed, Outcome, Reports, SpotResult

WORD = 8  # bytes


@functools.lru_cache(maxsize=16)
def per_word(dtype: torch.dtype) -> int:
    """Values of ``dtype`` in one word."""
    size = torch.empty(0, dtype=dtype).element_size()
    if WORD % size:
        raise ValueError(f"gradient buckets of {dtype} cannot carry 8-byte words")
    return WORD // size


def to_values(words: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``words`` (int64, 1-D) as values of ``dtype`` (the same bytes)."""
    return words.contiguous().view(dtype)


def to_words(values: torch.Tensor) -> torch.Tensor:
    """The inverse of ``to_values``: a run of values back to int64 words (copied: a
    run inside a bucket need not start on a word boundary)."""
    return values.reshape(-1).clone().view(torch.int64)


def words_for(count: int) -> int:
    """Words that hold ``count`` bytes (a bitmap of one byte per parameter)."""
    return -(-count // WORD)


def either(rows: Iterable[Sequence[int]]) -> list[int]:
    """The words' OR position by position over ``rows`` (of bitmap words: a byte is
    nonzero where any row's is); ``[]`` for no rows."""
    merged: list[int] = []
    for row in rows:
        merged = list(row) if not merged else [a | b for a, b in zip(merged, row, strict=True)]
    return merged


def float_word(value: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def word_float(word: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", word))[0])


def audit_tag(owner: int, step: int) -> int:
    """The word naming an audit copy: ``owner``'s slice of ``step``. Every owner tags
    the copy it carries with the audit it believes was picked; copies whose tags differ
    were picked from reports that differed (an owner told ranks different things), and
    such an audit is void rather than a verdict against an honest owner."""
    if not 0 <= owner < 1 << 20 or not 0 <= step < 1 << 42:
        raise ValueError(f"audit_tag(owner={owner}, step={step}): out of range")
    return (step << 20) | owner


def audit_of(tag: int) -> tuple[int, int]:
    """The inverse of ``audit_tag``: ``(owner, step)``."""
    return tag & ((1 << 20) - 1), tag >> 20


UNREPRODUCIBLE = 2  # a spot check's mismatch word: the owner's own gradient is off too
_HEAD = 8  # owned; the spot check (target + 1 or 0, difference, mismatch); the audit
# (tag, outcome, difference); the key of the handed-out digests
_PER_SENDER = 6  # flags (finite, replayed), squared distance, fingerprint, digest of the
# copy received, digests of the aggregates and of the reports that rank handed out last step


def report_words(senders: int) -> int:
    """Words in one owner's report on one bucket."""
    return _HEAD + _PER_SENDER * senders


def encode_report(owned: int, finite: Sequence[bool], distance: Sequence[float],
                  prints: Sequence[int], spot: SpotResult | None = None,
                  audit: AuditResult | None = None,
                  received: Sequence[int] | None = None, handed: Handed | None = None,
                  senders: Sequence[int] = (),
                  replayed: Sequence[bool] | None = None) -> torch.Tensor:
    """``[owned, spot check of the last step (target + 1 or 0, relative difference,
    mismatch), audit of the last step's carried copies (tag, outcome and disputed
    sender + 1, difference; 0s: none), then per sender: flags (1: its copies were
    finite, 2: one was a replay, ``replay.py``), squared distance, the
    fingerprint it sent, as an audited owner the digest of the copies it received from
    it in the audited step (0: none), and the digests of the aggregates and of the
    reports that rank handed this one in the last step (0: none)]``; ``senders``: the
    senders' ranks, to read ``handed`` by (whose ``key`` ends the head)."""
    words = [owned, 0, 0, 0] if spot is None else [
        owned, spot.target + 1, float_word(spot.difference),
        UNREPRODUCIBLE if spot.unreproducible else int(spot.mismatch)]
    words += [0, 0, 0] if audit is None else [
        audit_tag(audit.owner, audit.step), int(audit.outcome) | (audit.disputed + 1) << 8,
        float_word(audit.difference)]
    words.append(handed.key if handed is not None else 0)
    digests = list(received) if received is not None else [0] * len(prints)
    if handed is not None and len(senders) != len(prints):
        raise ValueError(f"encode_report: {len(prints)} senders' words, but senders={senders}")
    aggregates = [handed.aggregates.get(r, 0) for r in senders] if handed else [0] * len(prints)
    told = [handed.reports.get(r, 0) for r in senders] if handed else [0] * len(prints)
    repeats = list(replayed) if replayed is not None else [False] * len(prints)
    for ok, again, d2, fp, digest, aggregate, report in zip(
            finite, repeats, distance, prints, digests, aggregates, told, strict=True):
        words += [int(ok) | int(again) << 1, float_word(d2), fp, digest, aggregate, report]
    return torch.tensor(words, dtype=torch.int64)


def _audit_result(tag: int, code: int, difference: int) -> AuditResult | None:
    try:
        outcome = Outcome(code & 0xFF)
    except ValueError:
        return None  # none, or a word no honest owner writes
    owner, step = audit_of(tag)
    return AuditResult(owner, step, outcome, word_float(difference), (code >> 8) - 1)


def decode_reports(buckets: Sequence[tuple[Sequence[int], Sequence[int], torch.Tensor]],
                   world_size: int) -> Reports:
    """The step's ``Reports`` from each bucket's ``(owners, senders, reports)``, where
    ``reports[k]`` is owner ``owners[k]``'s report words (every bucket's are summed).

    A sender's fingerprint is the one most owners received from it (a sender that sent
    owners different ones, or whose owners disagree, gets none: it counts as diverged)."""
    n = world_size
    owns = [0.0] * n
    finite = [[1.0] * n for _ in range(n)]
    distance = [[0.0] * n for _ in range(n)]
    spots: list[SpotResult | None] = [None] * n
    audits: list[AuditResult | None] = [None] * n
    received = [[0] * n for _ in range(n)]
    handed = [[0] * n for _ in range(n)]
    told = [[0] * n for _ in range(n)]
    replayed = [[0.0] * n for _ in range(n)]
    keys = [0] * n
    forwarded: dict[int, list[int]] = {}
    for number, (owners, senders, reports) in enumerate(buckets):
        rows = reports.tolist()
        for owner, row in zip(owners, rows, strict=True):
            owns[owner] += float(row[0])
            if number == 0 and 0 < row[1] <= n:
                spots[owner] = SpotResult(row[1] - 1, word_float(row[2]), row[3] == 1,
                                          row[3] == UNREPRODUCIBLE)
            if number == 0:
                audits[owner] = _audit_result(row[4], row[5], row[6])
                keys[owner] = row[7]
            for k, sender in enumerate(senders):
                at = _HEAD + _PER_SENDER * k
                flags, d2, fp, digest, aggregate, report = row[at:at + _PER_SENDER]
                if not flags & 1:
                    finite[owner][sender] = 0.0
                if flags & 2:
                    replayed[owner][sender] = 1.0
                distance[owner][sender] += word_float(d2)
                if number == 0:
                    forwarded.setdefault(sender, []).append(fp)
                    received[owner][sender] = digest
                    handed[owner][sender] = aggregate
                    told[owner][sender] = report
    prints = [0] * n
    for sender, seen in forwarded.items():
        counts = {fp: seen.count(fp) for fp in seen}
        value, count = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))
        prints[sender] = value if count * 2 > len(seen) else _NO_MAJORITY - sender
    return Reports(finite=finite, distance=distance, owns=owns, fingerprint=prints,
                   spot=spots, audit=audits, received=received, handed=handed, told=told,
                   key=keys, replayed=replayed)


_NO_MAJORITY = -(1 << 62)  # below any fingerprint (they are >= 0), one per sender
