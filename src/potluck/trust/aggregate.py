"""Robust aggregation of one slice: every rank's copy in, one aggregate out (pure).

``copies`` is ``[n, m]`` (row i: rank i's copy of the slice) and ``weights`` is ``[n]``,
each rank's assigned part of the step (never a number the rank claimed): a row of
weight 0 is left out. Both aggregators equal the weighted mean when the copies agree
closely, and bound what one far-off copy can do when they do not.

- ``CenteredClip`` (Karimireddy, He and Jaggi, 2021): start at the coordinate-wise
  median, then ``iterations`` times move the center by the weighted mean of the copies'
  offsets, each offset clipped to length ``tau``. ``tau`` is ``tau_scale`` times the
  median distance of the copies from the start, so it follows the gradients' own
  spread. When no copy is farther than ``tau`` from the weighted mean, that mean is
  the fixed point and the result (the clean case: one pass); a far copy is clipped,
  so it pulls with at most its weight times ``tau``. A copy farther from the start than
  ``reject_at`` clip radii gets no say at all in this slice: a gross attacker's
  gradient (a sign flip, noise) would otherwise pull with its full ``tau`` until it is
  quarantined. As in the trust verdict's "far" score, a copy's distance is scaled by
  the square root of its weight over the median weight (a smaller part of the step is
  a noisier gradient, honestly farther off). Nobody is left out when half of the
  copies or more, or half of the weight or more, would go (so never with 2 copies).
  ``reject_at=None`` clips only.
- ``TrimmedMean``: per coordinate, drop the ``trim`` largest and smallest values, and
  take the weighted mean of the rest.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from potluck.errors import ConfigError


@runtime_checkable
class Aggregator(Protocol):
    """``aggregate(copies [n, m], weights [n]) -> [m]``; deterministic."""

    @property
    def name(self) -> str: ...

    def aggregate(self, copies: torch.Tensor, weights: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Measuring(Protocol):
    """An aggregator that can also hand back each copy's squared distance to its
    aggregate, when computing the aggregate gave them for free (None otherwise)."""

    def measured(self, copies: torch.Tensor,
                 weights: torch.Tensor) -> tuple[torch.Tensor, list[float] | None]: ...


def aggregate_measured(aggregator: Aggregator, copies: torch.Tensor,
                       weights: torch.Tensor) -> tuple[torch.Tensor, list[float], list[bool]]:
    """What an owner reports of its slice: the aggregate, each copy's squared distance
    to it (``distances``) and whether each copy is all finite (``finite_rows``; asked
    only when a distance is not finite, since a non-finite value makes it so)."""
    if isinstance(aggregator, Measuring):
        value, d2 = aggregator.measured(copies, weights)
    else:
        value, d2 = aggregator.aggregate(copies, weights), None
    if d2 is None:
        d2 = distances(copies, value).tolist()
    finite = ([True] * len(d2) if all(math.isfinite(d) for d in d2)
              else finite_rows(copies).tolist())
    return value, d2, finite


@dataclass(frozen=True)
class CenteredClip:
    tau_scale: float = 2.0
    iterations: int = 5
    reject_at: float | None = 2.0
    name: str = "centered_clip"

    def __post_init__(self) -> None:
        if not self.tau_scale > 0:
            raise ConfigError(f"CenteredClip(tau_scale={self.tau_scale!r}) must be > 0: the "
                              "clip radius in units of the copies' median spread, e.g. 2.0")
        if not (isinstance(self.iterations, int) and self.iterations >= 1):
            raise ConfigError(f"CenteredClip(iterations={self.iterations!r}) must be an int "
                              ">= 1, e.g. 5")
        if self.reject_at is not None and not self.reject_at >= 1:
            raise ConfigError(
                f"CenteredClip(reject_at={self.reject_at!r}) must be >= 1: a copy farther "
                "than this many clip radii is left out, so never one inside the radius; "
                "e.g. 2.0, or None to clip only")

    def aggregate(self, copies: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.measured(copies, weights)[0]

    def measured(self, copies: torch.Tensor,
                 weights: torch.Tensor) -> tuple[torch.Tensor, list[float] | None]:
        """The aggregate, and each copy's squared distance to it when they came for free
        (``distances``' values: the clean case, where the weighted mean is the result and
        its distances were what decided that; None otherwise). The decisions on the
        ``n`` per-copy numbers (the clip radius, who is left out, whether anyone is
        clipped) are made in Python on their values: a few tensor operations of a few
        values each cost more than the passes over the copies for a small slice."""
        x, w, center, spread = _started(copies, weights)
        n = x.shape[0]
        if n == 1:
            return x[0].clone(), None
        apart = sorted(s for s in spread if s > 0)  # copies at the median (e.g. zeros of
        if not apart:  # unused parameters) must not shrink the radius to nothing
            return center, None  # every copy is equal
        tau = self.tau_scale * apart[(len(apart) - 1) // 2]  # (torch.median's: the lower)
        whole = n == copies.shape[0]  # no copy was dropped by _kept
        if self.reject_at is not None:
            near = self._near(spread, w.tolist())
            if near is not None:
                x, w, whole = x[near], w[near] / w[near].sum(), False
        mean = w @ x
        offsets = (x - mean).norm(dim=1).tolist()
        if max(offsets) <= _at_most(tau, x.dtype):  # nobody is clipped at the weighted
            # mean: it is the fixed point (a NaN or an overflow to inf is never within
            # the radius)
            return mean, (_squares(offsets, x.dtype) if whole else None)
        for _ in range(self.iterations):
            offsets = x - center
            norms = offsets.norm(dim=1)
            clipped = norms > tau
            scale = torch.where(clipped, tau / norms.clamp_min(1e-30), torch.ones_like(norms))
            center = center + (w * scale) @ offsets
            if not bool(clipped.any()):
                break  # nobody was clipped: that move landed on the weighted mean
        return center, None

    def _near(self, spread: list[float], w: list[float]) -> torch.Tensor | None:
        """The rows whose weight-scaled distance from the start is within ``reject_at``
        clip radii (of the scaled distances), as a mask; None (keep every row) when all
        are, or half of the rows or of the weight (``w`` sums to 1) or more would go."""
        assert self.reject_at is not None
        middle = sorted(w)[(len(w) - 1) // 2]
        scaled = [s * math.sqrt(v / middle) for s, v in zip(spread, w, strict=True)]
        apart = sorted(s for s in scaled if s > 0)
        limit = self.reject_at * self.tau_scale * apart[(len(apart) - 1) // 2]
        near = [s <= limit for s in scaled]
        kept = sum(near)
        if (kept == len(near) or 2 * kept <= len(near)
                or sum(v for v, ok in zip(w, near, strict=True) if not ok) >= 0.5):
            return None
        return torch.tensor(near)


def _started(copies: torch.Tensor, weights: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[float]]:
    """The rows that count and their weights (``_kept``), their lower median (the
    start: an honest value) and each row's distance from it. Every row is taken as
    finite first, with no pass to ask: a non-finite value in row i at coordinate k makes
    some distance non-finite (if the median there is finite, row i's; if it is not,
    that of any row finite there, or, with none, row i's: NaN or inf minus inf), so
    finite distances prove every row finite, and otherwise ``_kept`` sorts the rows
    out and the start is taken again (a distance that overflowed takes that way too).
    The result is the same either way."""
    if copies.dim() == 2 and copies.shape[0] > 1 and weights.shape == (copies.shape[0],) \
            and all(v > 0 for v in weights.tolist()):
        center = lower_median(copies)
        spread = (copies - center).norm(dim=1).tolist()
        if all(math.isfinite(s) for s in spread):
            w = weights.to(copies.dtype)
            return copies, w / w.sum(), center, spread
    x, w = _kept(copies, weights)
    if x.shape[0] == 1:
        return x, w, x[0], [0.0]
    center = lower_median(x)
    return x, w, center, (x - center).norm(dim=1).tolist()


def _at_most(limit: float, dtype: torch.dtype) -> float:
    """``limit`` rounded to ``dtype`` as a comparison of a ``dtype`` tensor with it
    rounds it, so ``value <= _at_most(limit, dtype)`` in Python decides as
    ``tensor <= limit`` does in torch (numpy rounds to nearest, ties to even, as torch
    does; bfloat16, which numpy lacks, goes through torch)."""
    rounding = _NUMPY_FLOAT.get(dtype)
    if rounding is not None:
        with np.errstate(over="ignore"):  # (past the dtype's range: inf, as in torch)
            return float(rounding(limit))
    return float(torch.tensor(limit, dtype=torch.float64).to(dtype))


def _squares(values: list[float], dtype: torch.dtype) -> list[float]:
    """``torch.tensor(values, dtype=dtype).square().tolist()``, in Python: a value of
    ``dtype`` squared exactly in float64 and rounded once to ``dtype`` is what the
    ``dtype`` product rounds to, for float16 and float32 (their products fit float64's
    mantissa); float64 squares in float64 itself, and bfloat16 goes through torch."""
    rounding = _NUMPY_FLOAT.get(dtype)
    if rounding is None:
        return torch.tensor(values, dtype=dtype).square().tolist()
    with np.errstate(over="ignore"):  # (past the dtype's range: inf, as in torch)
        return [float(rounding(v * v)) for v in values]


_NUMPY_FLOAT: dict[torch.dtype, type[np.floating[Any]]] = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


@dataclass(frozen=True)
class TrimmedMean:
    trim: int = 1
    name: str = "trimmed_mean"

    def __post_init__(self) -> None:
        if not (isinstance(self.trim, int) and self.trim >= 0):
            raise ConfigError(f"TrimmedMean(trim={self.trim!r}) must be an int >= 0: how "
                              "many of the largest and of the smallest values to drop")

    def aggregate(self, copies: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        x, w = _kept(copies, weights)
        n = x.shape[0]
        trim = min(self.trim, (n - 1) // 2)  # always keep at least one value
        if trim == 0:
            return w @ x
        values, order = x.sort(dim=0)
        kept = values[trim:n - trim]
        kept_w = w[order[trim:n - trim]]
        return (kept * kept_w).sum(dim=0) / kept_w.sum(dim=0)


def _kept(copies: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows that count (weight > 0, every value finite) and their weights, summing
    to 1. Non-finite copies are left out here; the verdict names their senders."""
    if copies.dim() != 2 or weights.shape != (copies.shape[0],):
        raise ConfigError(f"aggregate() takes copies [n, m] and weights [n], got "
                          f"{tuple(copies.shape)} and {tuple(weights.shape)}")
    if copies.shape[0] and all(v > 0 for v in weights.tolist()) and all_finite(copies):
        w = weights.to(copies.dtype)  # (the clean case: no masked copy of every row; a
        # NaN weight is not > 0, so it takes the masked way and its row is left out)
        return copies, w / w.sum()
    keep = (weights > 0) & finite_rows(copies)
    count = int(keep.sum())
    if count == 0:  # nothing usable: the step is non-finite, and skipped
        return torch.full_like(copies[:1], float("nan")), torch.ones(
            1, dtype=copies.dtype, device=copies.device)
    w = weights[keep].to(copies.dtype)
    return copies[keep], w / w.sum()


def all_finite(copies: torch.Tensor) -> bool:
    """Whether every value is finite, in one pass: a finite sum of a row means every
    value in it is (a NaN or an infinity makes the sum one); a non-finite sum may be an
    overflow of finite values, so that case asks ``finite_rows``."""
    if bool(torch.isfinite(copies.sum(dim=1)).all()):
        return True
    return bool(finite_rows(copies).all())


def finite_rows(copies: torch.Tensor) -> torch.Tensor:
    """Whether each row is all finite (a NaN or an Inf makes its max or min non-finite)."""
    return torch.isfinite(copies.amax(dim=1)) & torch.isfinite(copies.amin(dim=1))


def lower_median(x: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise lower median of the rows of ``x`` (finite values). For the
    few rows of a cohort, a sorting network run on whole rows with ``minimum`` and
    ``maximum`` (elementwise passes) is several times faster than ``torch.median``
    along the strided dimension; of the network only the comparisons that lead to the
    middle row are run, and of those only the side that is used (``_selection``: 7
    passes for 4 rows, where a full sort takes 10)."""
    n = x.shape[0]
    if n > _NETWORK_ROWS:
        return x.median(dim=0).values
    rows = list(x.unbind(0))
    for low, high, keep_min, keep_max in _selection(n):
        a, b = rows[low], rows[high]
        if keep_min:
            rows[low] = torch.minimum(a, b)
        if keep_max:
            rows[high] = torch.maximum(a, b)
    return rows[(n - 1) // 2]


_NETWORK_ROWS = 32


@functools.lru_cache(maxsize=_NETWORK_ROWS)
def _selection(n: int) -> tuple[tuple[int, int, bool, bool], ...]:
    """The comparators of Batcher's odd-even merge sort for ``n`` rows that the lower
    median's row depends on: ``(low, high, min used, max used)``, in order. The network
    is built for the next power of two; the rows past ``n`` would hold +inf, which no
    comparator moves, so comparators that touch them are dropped."""
    size = 1 << max(0, (n - 1).bit_length())
    network: list[tuple[int, int]] = []
    run = 1
    while run < size:  # merge sorted runs of ``run`` rows into runs of twice as many
        gap = run
        while gap >= 1:
            for start in range(gap % run, size - gap, 2 * gap):
                for i in range(min(gap, size - start - gap)):
                    low, high = start + i, start + i + gap
                    if low // (2 * run) == high // (2 * run) and high < n:
                        network.append((low, high))
            gap //= 2
        run *= 2
    needed, kept = {(n - 1) // 2}, []
    for low, high in reversed(network):  # from the output back: what feeds the median
        keep_min, keep_max = low in needed, high in needed
        if keep_min or keep_max:
            kept.append((low, high, keep_min, keep_max))
            needed |= {low, high}
    return tuple(reversed(kept))


def distances(copies: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Each copy's squared distance to the aggregate; ``inf`` for a non-finite copy (the
    norm's square: one pass over the differences, half the time of squaring them first)."""
    d2 = torch.linalg.vector_norm(copies - value, dim=1).square()
    return torch.where(torch.isfinite(d2), d2, torch.full_like(d2, float("inf")))
