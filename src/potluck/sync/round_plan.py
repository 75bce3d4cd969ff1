"""How a round is shared (pure): local steps per rank, samples per local step, weights.

- A round is ``H * global_batch`` samples of the epoch permutation. The plan gives each
  rank a number of local steps ``H_r``, summing to ``N * H``; the loader splits the
  round's samples in proportion to them, so every local step is about
  ``global_batch / N`` samples whatever the plan, and the global batch, the round and
  the learning-rate schedule never change.
- **Fast workers never wait**: ``H_r`` is proportional to rank r's measured speed
  (samples per second of local work in the last round: forward, backward, the inner
  optimizer, loading), each at least 1, so every rank's round takes about the same
  wall time. Each rank's speed is its rounds' smoothed average (``SpeedMeter``), sent
  with its uncertainty; a new plan replaces the current one only when it is predicted
  to make the round at least ``min_gain`` faster, the speeds lie beyond their noise
  from the current plan, and two syncs in a row call for it (``replan_round``, the
  every-step planner's rule). A plan that followed one round's noise cost a round up
  to a step's worth on every rank: 4 equal ranks whose round speeds scatter by 10%
  took rounds about 10% longer than even ones, by 20% about 20% longer. A round
  nobody is measured for yet starts even and exchanges speeds after a short start
  (``segments``), so even the first round is planned.
- **The rule of the average**: rank r's pseudo-gradient weighs ``n_r / n``, its samples
  over the samples of every rank that takes part in the sync, so a sample counts the
  same wherever it was trained. Normally that is the whole round; when a member is lost
  mid-round the survivors commit the round alone, ``n`` is theirs, and the lost part of
  the block (``lost_ranges``) is owed: the cursor hands it out again.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from potluck.balance.planner import Plan, plan_shares, replan
from potluck.data.state import Range
from potluck.errors import ConfigError
from potluck.sync.config import check_split


def segments(block: Range, *, inner_steps: int, global_batch: int, world_size: int,
             measure: float, measured: bool) -> tuple[Range, ...]:
    """How a round's ``block`` is handed out: whole, or, when nobody's speed is known
    (``measured`` False) and ``measure`` > 0, its first ``measure`` of ``inner_steps``
    global batches (at least one, and at least a sample per rank) split evenly, then
    the rest split by the speeds the ranks exchange in between. A block with less than
    a global batch (or a sample per rank) after that start stays whole: a short last
    round, an owed range."""
    start, stop = block
    if measured or measure <= 0:
        return (block,)
    batches = max(1, round(inner_steps * measure), -(-world_size // global_batch))
    first = batches * global_batch
    if stop - start < first + max(global_batch, world_size):
        return (block,)
    return ((start, start + first), (start + first, stop))


def local_steps(samples: int, global_batch: int, world_size: int) -> int:
    """Local steps for a part of ``samples``: about ``global_batch / N`` samples each
    (at least one step, at most one per sample)."""
    return max(1, min(samples, round(samples * world_size / global_batch)))


def plan_round(speeds: Sequence[float | None], inner_steps: int, *,
               current: Sequence[int] | None = None, min_gain: float = 0.05,
               split: Sequence[int] | None = None) -> tuple[int, ...]:
    """Local steps per rank for the next round (``speeds``: samples/s, None: unmeasured)."""
    world_size = len(speeds)
    if split is not None:
        check_split(split)
        if len(split) != world_size or sum(split) != world_size * inner_steps:
            raise ConfigError(
                f"DiLoCo(split={tuple(split)}) for {world_size} ranks and inner_steps="
                f"{inner_steps}: give one count per rank, summing to {world_size} x "
                f"{inner_steps} = {world_size * inner_steps} (a round's local steps)")
        return tuple(split)
    total = world_size * inner_steps
    plan = _standing(current, world_size, total)
    return plan_shares(speeds, total, current=plan, min_gain=min_gain).counts


def replan_round(speeds: Sequence[float | None], noise: Sequence[float | None],
                 inner_steps: int, *, current: Sequence[int] | None, calls: int,
                 min_gain: float = 0.05) -> tuple[tuple[int, ...], int]:
    """A sync's decision in a running job: local steps per rank for the next round, and
    how many syncs in a row have called for a move (pass it back as ``calls``).
    ``noise``: each speed's relative standard error (None: unknown); ``current`` None
    (or of another world size) means even."""
    world_size = len(speeds)
    total = world_size * inner_steps
    decided, calls = replan(speeds, total, current=_standing(current, world_size, total),
                            calls=calls, noise=noise, min_gain=min_gain)
    return decided.counts, calls


def _standing(current: Sequence[int] | None, world_size: int, total: int) -> Plan | None:
    """The round's plan as the planner takes it (None: none, or one of another world
    size or round length)."""
    if current is not None and len(current) == world_size and sum(current) == total:
        return Plan(tuple(current), (1,) * world_size)
    return None


def fragment_points(local: int, fragments: int) -> tuple[int, ...]:
    """After which of its ``local`` steps a rank sends fragments ``0 .. P-2`` of a round
    (Streaming DiLoCo): at ``ceil(local * (f + 1) / P)``, spread over its part of the
    round; the last fragment goes with the round's sync. Every rank sends them in the
    same order whatever its number of local steps, so the collectives match up."""
    return tuple(-(-local * (f + 1) // fragments) for f in range(fragments - 1))


def lost_ranges(block: tuple[int, int],
                parts: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The positions of ``block`` that none of ``parts`` (the members' parts that reach
    the sync) covers, as ranges in order: what the lost members had trained on."""
    start, stop = block
    lost, at = [], start
    for a, b in sorted(p for p in parts if p[0] < p[1]):
        if not start <= a < b <= stop or a < at:
            raise ConfigError(f"part [{a}, {b}) is outside the round's block [{start}, {stop}) "
                              "or overlaps another: the members disagree about the round")
        if a > at:
            lost.append((at, a))
        at = b
    if at < stop:
        lost.append((at, stop))
    return tuple(lost)


def agreed_lost(block: Range, parts: Sequence[Range]) -> tuple[Range, ...] | None:
    """``lost_ranges``, or None when the parts overlap: the members split the round
    differently (a member was lost while they exchanged speeds, and only some of them
    got the speeds), so a sample was trained twice and the round must start again."""
    inside = [p for p in parts if p[0] < p[1]]
    ordered = sorted(inside)
    if any(a[1] > b[0] for a, b in itertools.pairwise(ordered)):
        return None
    return lost_ranges(block, inside)


def weight(samples: int, round_samples: int) -> float:
    """Rank r's pseudo-gradient's weight in the average (see the module doc)."""
    if round_samples < 1 or not 0 <= samples <= round_samples:
        raise ConfigError(f"a part of {samples} samples of a round of {round_samples} "
                          "cannot be weighed: the part is within the round")
    return samples / round_samples
