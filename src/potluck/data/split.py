"""Split arithmetic: how one step's block of samples is divided among ranks.

Pure functions of their inputs. Shares are non-negative weights (samples/s, or 1 each);
rank ``r`` gets a contiguous sub-block whose length is proportional to its share,
rounded by largest remainder so that the lengths sum exactly to the block. Ties go to
the lower rank. The arithmetic is exact (each float share is an integer over a power of
two, so the quotas are integers over one common denominator), so every rank computes
the same split from the same float shares, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from potluck.errors import ConfigError


def equal_shares(world_size: int) -> tuple[float, ...]:
    """Shares of ``world_size`` ranks that each train on the same number of samples."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(
            f"world_size={world_size!r} is invalid: it must be an integer >= 1. "
            "Pass the number of ranks in the cohort."
        )
    return (1.0,) * world_size


def check_shares(shares: Sequence[float]) -> tuple[float, ...]:
    """Validate shares (non-empty, finite, >= 0, not all zero); return them as a tuple."""
    values = tuple(shares)
    if not values:
        raise ConfigError("shares=[] is invalid: give one non-negative weight per rank.")
    for rank, share in enumerate(values):
        if (not isinstance(share, (int, float)) or isinstance(share, bool)
                or not math.isfinite(share) or share < 0):
            raise ConfigError(
                f"shares[{rank}]={share!r} is invalid: every share must be a finite "
                "number >= 0. Use 0 for a rank that should train on no samples."
            )
    if not any(share > 0 for share in values):
        raise ConfigError(
            f"shares={list(values)} are all zero: at least one rank must have a positive "
            "share, or no rank would train on the step's samples."
        )
    return values


def split_counts(total: int, shares: Sequence[float]) -> list[int]:
    """Per-rank sample counts for a block of ``total`` samples; they sum to ``total``."""
    if total < 0:
        raise ConfigError(f"total={total} is invalid: a block cannot have fewer than 0 samples.")
    ratios = [share.as_integer_ratio() for share in check_shares(shares)]
    denominator = math.lcm(*(d for _, d in ratios))
    weights = [n * (denominator // d) for n, d in ratios]  # shares x denominator, exactly
    weight_sum = sum(weights)
    # Rank r's quota is total * weights[r] / weight_sum: its floor and its remainder.
    counts = [total * weight // weight_sum for weight in weights]
    remainders = [total * weight % weight_sum for weight in weights]
    left = total - sum(counts)
    # Largest fractional part first; ties to the lower rank (stable sort on -remainder).
    order = sorted(range(len(weights)), key=lambda r: -remainders[r])
    for rank in order[:left]:
        counts[rank] += 1
    return counts


def split_block(start: int, stop: int, shares: Sequence[float]) -> list[range]:
    """The contiguous sub-ranges of ``[start, stop)`` owned by each rank, in rank order."""
    if stop < start:
        raise ConfigError(f"block [{start}, {stop}) is invalid: stop must be >= start.")
    ranges: list[range] = []
    offset = start
    for count in split_counts(stop - start, shares):
        ranges.append(range(offset, offset + count))
        offset += count
    return ranges


def resolve_shares(shares: Sequence[float] | None, world_size: int | None) -> tuple[float, ...]:
    """Shares from either argument: explicit weights, or equal shares for ``world_size``."""
    if shares is None:
        if world_size is None:
            raise ConfigError(
                "neither shares nor world_size was given: pass world_size=N for equal "
                "shares, or shares=[w0, w1, ...] with one weight per rank."
            )
        return equal_shares(world_size)
    values = check_shares(shares)
    if world_size is not None and world_size != len(values):
        raise ConfigError(
            f"world_size={world_size} but len(shares)={len(values)}: give one share per "
            "rank, or leave world_size out."
        )
    return values


def check_rank(rank: int, world_size: int) -> None:
    """``rank`` must index one of ``world_size`` ranks."""
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank={rank!r} is out of range for {world_size} rank(s): it must be an "
            f"integer in [0, {world_size}). Pass this process's rank in the cohort."
        )
