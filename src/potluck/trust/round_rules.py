"""Who misbehaved in a round, from the slice owners' reports on the pseudo-gradients (pure).

Each owner of a slice of a round's pseudo-gradient reports, for every sender, numbers
about the sender's copy of its slice (``slice_report``): whether it is finite, its
squared distance to the robust aggregate, its squared norm, its squared distance to the
sender's own copy of the last round (through a sketch), and its squared distance to
every other sender's copy. A round's reports are summed over its pieces (the
fragments, the dtypes): owner ``o``'s numbers then cover its slice of every piece.

Every honest member holds the same reports and runs the same rules (``judge_round``),
so honest members never disagree. A sender is judged by the median over owners, so
with an honest majority one lying owner can neither accuse nor acquit anyone.

The rules, each on ratios to the median sender (so they follow the model's scale):

- **non-finite**: more than half of the owners saw a non-finite value from it;
- **far from the center**: its distance to the aggregate, over its growth with its
  assigned share relative to the median share (a member that ran more local steps
  drifted farther by chance), is over ``Rules.far_ratio`` times the median sender's;
  far rounds quarantine as far steps do (``far.py``: a designed false-positive rate),
  and a round beyond ``GROSS`` times ``far_ratio`` is *gross* (``gross``), taken to be
  as unlikely for an honest member as two far rounds. A round's copy sums its local
  steps, so one sample's outlier does not make it that far (the benches' honest
  members: 1.9 times the median member's distance at most);
- **free rider**: its norm, over its growth with its relative share, is under
  ``FREE_RATIO`` times the median sender's: a zero or a scaled-down pseudo-gradient
  (work not done, or not sent). A pseudo-gradient grows with the local steps between
  their square root (noise) and linearly (drift); each rule takes the bound that spares
  an honest member;
- **copied**: its distance to another sender's copy is under ``COPY_RATIO`` (squared)
  of an honest pair's (twice the median member's distance to the center). Two members
  never train the same round alike, so one of the two copied the other (or both are
  one attacker). Nobody can tell which: both are flagged, as in a dispute, so a copy
  costs the copier its own seat;
- **replayed**: its distance to its own copy of the last round is under
  ``COPY_RATIO`` (squared) of the median sender's round-to-round change.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from potluck.trust.verdict import (
    COPIED,
    FAR,
    FREE_RIDER,
    NON_FINITE,
    REPLAYED,
    Finding,
    Rules,
    median,
)

FREE_RATIO = 0.3  # honest members' weighted norms are within a few tens of % of each other
COPY_RATIO = 0.01  # squared: a copy is 10x closer than an honest pair, at least
REPLAY_CHANGE = 1e-4  # squared, over the norm's: a replay moved by under 1% of itself
GROSS = 2.0  # times far_ratio: a gross round (8x the median member's distance)
SKETCH = 256  # values in the sketch an owner keeps of each sender's copy

# The columns of a report row: one row per sender, then one column per sender.
FINITE, DISTANCE, NORM, REPLAY = range(4)
FIELDS = 4


def sketch(copies: torch.Tensor) -> torch.Tensor:
    """Count sketches of ``copies`` (``[s, m]``, or one copy ``[m]``): ``SKETCH`` float64
    sums of each copy's values, each times a fixed random sign. The squared distance of
    two sketches is an unbiased estimate of their copies' squared distance, and equal
    copies sketch alike."""
    rows = copies.reshape(-1, copies.shape[-1])
    m = rows.shape[1]
    k = min(SKETCH, max(m, 1))
    signs = _signs(m, rows.dtype, str(rows.device))
    padded = torch.zeros(rows.shape[0], -(-m // k) * k, dtype=rows.dtype, device=rows.device)
    padded[:, :m] = rows * signs
    out = padded.view(rows.shape[0], -1, k).sum(dim=1, dtype=torch.float64)
    return out if copies.dim() > 1 else out[0]


@functools.lru_cache(maxsize=32)
def _signs(m: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0x5EED ^ m)
    signs = torch.randint(0, 2, (m,), generator=gen, dtype=torch.int8) * 2 - 1
    return signs.to(device=device, dtype=dtype)


def slice_report(copies: torch.Tensor, value: torch.Tensor, previous: Sequence[torch.Tensor | None],
                 shares: Sequence[float] | None = None
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """An owner's report on its slice: ``[senders, FIELDS + senders]`` float64 (the
    columns above; ``REPLAY`` is NaN where ``previous`` has no sketch of that sender),
    and this round's sketch of each copy (kept for the next round's replay check).
    ``copies`` ``[senders, m]`` are the decoded copies, ``value`` their aggregate,
    ``shares`` the senders' assigned parts (None: equal). A member's distance is to the
    aggregate scaled to its part (``expected``): a member that ran fewer local steps
    drifted less far, honestly."""
    s = copies.shape[0]
    x = copies if copies.dtype in (torch.float32, torch.float64) else copies.float()
    out = torch.zeros(s, FIELDS + s, dtype=torch.float64)
    norms = torch.linalg.vector_norm(x, dim=1, dtype=torch.float64).pow(2)
    finite = torch.isfinite(norms)  # (a non-finite value makes the norm so; so does an
    out[:, FINITE] = finite.to(torch.float64).cpu()  # overflow, as bad a copy)
    scale = torch.tensor(expected(shares if shares is not None else [1.0] * s),
                         dtype=x.dtype, device=x.device)
    off = x - scale[:, None] * value.to(x.dtype)
    out[:, DISTANCE] = torch.linalg.vector_norm(off, dim=1, dtype=torch.float64).pow(2).cpu()
    out[:, NORM] = norms.cpu()
    sketches = list(sketch(x).cpu())
    for i, (now, before) in enumerate(zip(sketches, previous, strict=True)):
        same = before is not None and before.shape == now.shape
        out[i, REPLAY] = float(((now - before) ** 2).sum()) if same else math.nan  # type: ignore[operator]
    safe = torch.where(finite[:, None], x, torch.zeros_like(x))
    pairs = torch.cdist(safe, safe).to(torch.float64).pow(2).cpu()
    gone = ~finite.cpu()
    pairs[gone, :], pairs[:, gone] = math.inf, math.inf  # (no pair with a non-finite copy)
    out[:, FIELDS:] = pairs
    return out, sketches


def expected(shares: Sequence[float]) -> list[float]:
    """Each member's pseudo-gradient over the weighted mean's, were it a drift that
    grows with the member's part: ``s_i * sum(s) / sum(s ** 2)`` (1 for equal parts)."""
    total, squares = sum(shares), sum(v * v for v in shares)
    return [v * total / squares if squares > 0 else 1.0 for v in shares]


def judge_round(reports: torch.Tensor, shares: Sequence[float], senders: Sequence[int],
                rules: Rules) -> list[Finding]:
    """The evidence of one round. ``reports`` is ``[owners, senders, FIELDS + senders]``,
    each owner's reports summed over the round's pieces; ``shares`` each sender's
    assigned part of the round; ``senders`` their ranks (the findings name ranks)."""
    owners, s = reports.shape[0], reports.shape[1]
    if s < 3 or owners == 0:  # two copies cannot tell which one is wrong
        return []
    rows = reports.tolist()
    found: list[Finding] = []
    bad = {i for i in range(s) if 2 * sum(r[i][FINITE] < 0.5 for r in rows) > owners}
    for i in sorted(bad):
        found.append(Finding(senders[i], NON_FINITE, f"{owners} slice owner(s), most saw a "
                                                     "non-finite value in its pseudo-gradient"))
    good = [i for i in range(s) if i not in bad]
    middle = median([shares[i] for i in good]) or 1.0
    relative = [max(shares[i] / middle, 1e-12) for i in range(s)]
    # A round's pseudo-gradient grows with its local steps, between their square root
    # (noise) and linearly (drift): each rule scales by the bound that spares honest
    # members (the far one by the most growth, the free rider one by the least).
    more = [max(r, math.sqrt(r)) for r in relative]
    less = [min(r, math.sqrt(r)) for r in relative]
    far = _scores(rows, good, lambda r, i: math.sqrt(max(r[i][DISTANCE], 0.0)) / more[i])
    for i, score in far.items():
        if score > rules.far_ratio:
            found.append(Finding(senders[i], FAR, f"{score:.1f}x the median member's distance "
                                 f"from the robust center (limit {rules.far_ratio:g})",
                                 score=score))
    norms = _scores(rows, good, lambda r, i: math.sqrt(max(r[i][NORM], 0.0)) / less[i])
    for i, score in norms.items():
        if score < FREE_RATIO:
            found.append(Finding(senders[i], FREE_RIDER, f"its norm, for its share, is {score:.2f}"
                                 f"x the median member's (limit {FREE_RATIO:g})"))
    found += _copies(rows, good, senders)
    found += _replays(rows, good, senders)
    return found


def gross(found: Sequence[Finding], rules: Rules) -> list[int]:
    """The ranks of ``found``'s far findings beyond ``GROSS`` times ``far_ratio``."""
    return [f.rank for f in found if f.kind == FAR and f.score is not None
            and f.score > GROSS * rules.far_ratio]


def _scores(rows: list[list[list[float]]], good: list[int],
            score: Callable[[list[list[float]], int], float]) -> dict[int, float]:
    """Each good sender's score over the median sender's, by the median over owners."""
    per: dict[int, list[float]] = {i: [] for i in good}
    for r in rows:
        values = {i: score(r, i) for i in good}
        middle = median(list(values.values()))
        for i, v in values.items():
            per[i].append(v / middle if middle > 0 else (1.0 if v == 0 else math.inf))
    return {i: median(v) for i, v in per.items()}


def _copies(rows: list[list[list[float]]], good: list[int],
            senders: Sequence[int]) -> list[Finding]:
    """Pairs nearer than ``COPY_RATIO`` of an honest pair, for most owners. An honest
    pair's squared distance is about the sum of the two members' to the center, so the
    reference is twice the median member's (an attacker far from the others would move
    a median over pairs, half of which may hold it, but not this one)."""
    pairs = [(i, j) for a, i in enumerate(good) for j in good[a + 1:]]
    if not pairs:
        return []
    votes = dict.fromkeys(pairs, 0)
    for r in rows:
        middle = 2 * median([r[i][DISTANCE] for i in good])
        for i, j in pairs:
            if middle > 0 and r[i][FIELDS + j] <= COPY_RATIO * middle:  # (0: cannot tell)
                votes[(i, j)] += 1
    found = []
    for (i, j), v in votes.items():
        if 2 * v > len(rows):
            for a, b in ((i, j), (j, i)):
                found.append(Finding(senders[a], COPIED, f"its pseudo-gradient is (nearly) the "
                                     f"one rank {senders[b]} sent, for {v} of {len(rows)} "
                                     "slice owners (one of the two copied)", senders[b]))
    return found


def _replays(rows: list[list[list[float]]], good: list[int],
             senders: Sequence[int]) -> list[Finding]:
    """Senders whose copy is (nearly) their own of the last round, for most owners. A
    sender's change is measured against its own size (``REPLAY / NORM``), then against
    the median member's: a member with a small part of the round moves little, and its
    few local steps can repeat themselves (one Adam step is about the gradient's sign),
    but it still changes by a fair fraction of itself. A replay changes by nothing: the
    change must also be under 1% of its norm (``REPLAY_CHANGE``), since one local step of
    an optimizer with momentum moves a member's pseudo-gradient by only a few percent a
    round, honestly."""
    found = []
    for i in good:
        votes = known = 0
        for r in rows:
            changes = {j: _change(r[j]) for j in good}
            known_changes = [c for c in changes.values() if math.isfinite(c)]
            if not math.isfinite(changes[i]) or len(known_changes) < 3:
                continue
            known += 1
            middle = median(known_changes)
            votes += middle > 0 and changes[i] <= min(COPY_RATIO * middle, REPLAY_CHANGE)
        if known and 2 * votes > len(rows):
            found.append(Finding(senders[i], REPLAYED, f"its pseudo-gradient is (nearly) its "
                                 f"own of the last round, for {votes} of {len(rows)} slice "
                                 "owners"))
    return found


def _change(row: list[float]) -> float:
    """A sender's squared change since the last round over its squared norm (NaN: no
    last round, or a zero copy, which the free rider rule judges)."""
    if not math.isfinite(row[REPLAY]) or not row[NORM] > 0:
        return math.nan
    return row[REPLAY] / row[NORM]
