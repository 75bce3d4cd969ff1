"""The spot re-run under rounds: which round, whom, which steps, and the verdict (pure).

``Trust(spot_check=SpotCheck(loss, every=N, steps=K, checkers=C))`` under rounds. On
average one round in ``every`` is checked (``checked``: from a hash of the round's
reports, which nobody knew while it trained). Then every member commits a digest of
its *payload*: its inner optimizer state at the round's start and its parameters after
its first ``K`` local steps (and, where a replica starts a round from its own
parameters, those: Streaming DiLoCo with ``mixing > 0``). A hash of the reports and the
digests picks one target and ``C`` checkers among the trusted members (``pick``). The
target sends each checker its payload; each checker re-runs the target's first local
steps (``stretch``: the batches the loader handed it) from the round's start and
reports how far its result is from the target's (``relative``); the results are
all-gathered and ``judge_rerun`` strikes the target when more than half the checkers
found it off. The I/O is ``round_spot.py``.

Bytes on a checked round (``check_bytes``): the target sends ``C`` payloads; every
member sends a 40-byte commitment and an 8-byte result to each other member.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple

from potluck.data.split import equal_shares, split_counts
from potluck.sync.round_plan import fragment_points, local_steps
from potluck.trust.round_work import round_seed
from potluck.trust.verdict import WRONG_STEPS, Finding

Range = tuple[int, int]
COMMIT_BYTES = 40  # a 32-byte digest and the payload's 8-byte length
DIGEST_BYTES = 32


class Pick(NamedTuple):
    """A checked round's target and its checkers (ranks)."""

    target: int
    checkers: tuple[int, ...]


def checked(round_: int, digest: bytes, every: int) -> bool:
    """Whether round ``round_`` is checked: one in ``every`` on average, drawn from
    ``digest`` (the round's reports)."""
    return round_seed(round_, digest) % every == 0


def pick(round_: int, digest: bytes, senders: Sequence[int], checkers: int) -> Pick | None:
    """The target and up to ``checkers`` checkers among ``senders`` (the trusted members),
    drawn from ``digest`` (the reports and the commitments): the same on every member.
    None: fewer than two trusted members."""
    if len(senders) < 2 or checkers < 1:
        return None
    seed = round_seed(round_, digest)
    target = senders[seed % len(senders)]
    others = sorted((r for r in senders if r != target),
                    key=lambda r: hashlib.blake2b(f"{seed}:{r}".encode(),
                                                  digest_size=8).digest())
    return Pick(target, tuple(others[:checkers]))


def batches(parts: Sequence[Range], global_batch: int, counted: int) -> list[Range]:
    """A member's batches of a round, one per local step, in order: each of its
    ``parts`` (one per segment, as ``[start, stop)`` positions) cut as the loader cuts it
    (``local_steps`` of ``global_batch / counted`` samples, contiguous, equal within one
    sample)."""
    out: list[Range] = []
    for start, stop in parts:
        if stop <= start:
            continue
        steps = local_steps(stop - start, global_batch, counted)
        at = start
        for count in split_counts(stop - start, equal_shares(steps)):
            out.append((at, at + count))
            at += count
    return out


def stretch(parts: Sequence[Range], global_batch: int, counted: int, steps: int,
            fragments: int = 1) -> list[Range]:
    """The batches a re-run takes: the member's first ``steps``, and none after its
    replica first changed mid-round (Streaming DiLoCo applies fragment 0 after the
    point where it sends fragment 1: ``fragment_points`` of its last segment)."""
    every = batches(parts, global_batch, counted)
    cut = len(every)
    held = [p for p in parts if p[1] > p[0]]
    if fragments > 2 and held:
        last = len(batches(held[-1:], global_batch, counted))
        points = fragment_points(last, fragments)
        cut = min(cut, len(every) - last + points[1])
    return every[:min(steps, cut)]


def judge_rerun(results: Sequence[float], chosen: Pick, tolerance: float) -> list[Finding]:
    """The finding against the target when more than half its checkers found its
    partial update off by more than ``tolerance`` (``results[rank]``: a checker's
    relative difference; inf: its payload did not match its commitment or its layout;
    NaN: no result, counted as not off)."""
    off = [results[c] for c in chosen.checkers
           if not math.isnan(results[c]) and not results[c] <= tolerance]
    if 2 * len(off) <= len(chosen.checkers):
        return []
    said = ", ".join("its payload did not match" if math.isinf(v) else f"{v:.3g}" for v in off)
    return [Finding(chosen.target, WRONG_STEPS,
                    f"{len(off)} of {len(chosen.checkers)} checkers re-ran its first local "
                    f"steps and found its parameters off ({said}; tolerance {tolerance:g})")]


def relative(diff_sq: float, moved_sq: float) -> float:
    """The relative L2 difference of a re-run's partial update and the target's:
    ``sqrt(|theirs - mine|^2 / |mine - start|^2)``."""
    if not math.isfinite(diff_sq):
        return math.inf
    if moved_sq > 0:
        return math.sqrt(diff_sq / moved_sq)
    return 0.0 if diff_sq == 0 else math.inf


def payload_bytes(param_bytes: int, state_bytes: int, own_start: bool) -> int:
    """A payload: the inner optimizer state, the replica's start (``own_start``), and
    the parameters after the stretch."""
    return state_bytes + param_bytes * (2 if own_start else 1)


def payload_limit(param_bytes: int) -> int:
    """The largest payload a commitment may claim (an inner state of up to 6 copies of
    the parameters, and 1 MiB): a larger one is not sent, and the target is off."""
    return 8 * param_bytes + (1 << 20)


def check_bytes(payload: int, members: int, checkers: int) -> tuple[int, int]:
    """Bytes a checked round sends: ``(the target's, every other member's)``."""
    small = (COMMIT_BYTES + 8) * (members - 1)
    return checkers * payload + small, small
