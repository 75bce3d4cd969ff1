"""Who misbehaved in a step, from the owners' reports every rank received (pure).

Each owner of gradient slices reports, for every sender, whether all its copies were
finite and their squared distance to the owner's aggregates (``Reports``). Every honest
rank holds the same reports and runs the same rules, so honest ranks never disagree
about who is out. A liar's own reports are outvoted: a sender is judged by the median
over owners, so with an honest majority one owner cannot accuse or acquit anyone.

The rules (``Rules``):

- **non-finite**: more than half of the owners saw a non-finite value from the sender
  while most senders were finite (when most are not, e.g. an fp16 overflow under a
  ``GradScaler``, it is the step that is bad, not a rank: it is skipped on every rank);
- **far from the center**: the sender's distance to the aggregates, scaled by the
  square root of its samples (a smaller part of the batch is a noisier gradient) and
  divided by the median sender's, is over ``far_ratio``, by the median over owners;
- **diverged replica**: the parameters' fingerprint differs from the majority's;
- **wrong aggregate**: more than half of the other owners recomputed an audited
  owner's aggregate from every rank's copy of its slice and found it off (the audit,
  ``audit.py``; each reports what it found in the next step's report);
- **disputed**: more than half of the other owners found a sender's copy carried for
  an audit differs from the one the audited owner says it received; or a rank
  reports an owner handed it other aggregates or reports than most ranks were handed.
  Honest members never disagree about bytes, so one of the two lied, and nobody can
  tell which: both are out (``settle_disputes``: pairs in order, a pair with a member
  already out counts for nothing). So each honest member removed costs an attacker
  its own seat, colluders included, and the honest majority holds. A replica that
  diverged because its owner handed it another aggregate is repaired but not struck;
- **wrong gradient**: more than half of the other owners recomputed the rank's
  gradient on its own samples and found their slices of its copy off (the spot
  check, ``spot.py``);
- **replayed gradient**: more than half of the other owners received a copy from the
  rank that is bit for bit one it sent them before (``replay.py``), while most senders
  were not flagged (when most are, a slice stopped changing for everyone).

One piece of evidence is a strike; ``Strikes`` quarantines a member once it has
``Rules.strikes[kind]`` strikes of a kind within ``Rules.memory`` steps.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from potluck.errors import ConfigError
from potluck.trust.far import MOST_IN_A_ROW, FarWatch, gross_chance, needed, too_often

NON_FINITE = "non-finite gradient"
FAR = "far from the center"
DIVERGED = "diverged replica"
WRONG_AGGREGATE = "wrong aggregate"
WRONG_GRADIENT = "wrong gradient"
DISPUTED = "disputed"
REPLAYED = "replayed gradient"
FREE_RIDER = "free rider"  # rounds only (round_rules.py)
COPIED = "copied pseudo-gradient"  # rounds only
NO_WORK = "no work on its data"  # rounds only (round_work.py)
WRONG_STEPS = "wrong local steps"  # rounds only (round_rerun.py)
KINDS = (NON_FINITE, FAR, DIVERGED, WRONG_AGGREGATE, WRONG_GRADIENT, DISPUTED, REPLAYED,
         FREE_RIDER, COPIED, NO_WORK, WRONG_STEPS)
_DEFAULT_STRIKES = {NON_FINITE: 1, FAR: 2, DIVERGED: 2, WRONG_AGGREGATE: 1, WRONG_GRADIENT: 1,
                    DISPUTED: 1, REPLAYED: 1, FREE_RIDER: 2, COPIED: 1,
                    NO_WORK: 1, WRONG_STEPS: 1}  # (no work: already the mean of a few rounds)


@dataclass(frozen=True)
class Rules:
    far_ratio: float = 4.0
    """A sender this many times farther from the center than the median sender is far."""
    strikes: dict[str, int] = field(default_factory=lambda: dict(_DEFAULT_STRIKES))
    """Strikes of each kind, within ``memory`` steps, that quarantine a member."""
    memory: int = 50
    """Steps within which a kind's strikes count (not "far": see ``false_positive``)."""
    false_positive: float = 1e-8
    """The chance, per honest sender and step, of a quarantine for being far, once
    ``far_window`` measured the honest rate (``potluck.trust.far``)."""
    far_window: int = 200
    """Steps over which honest senders' rate of far steps is measured (>= 16)."""

    def __post_init__(self) -> None:
        if not isinstance(self.strikes, Mapping):
            raise ConfigError(f"strikes={self.strikes!r} must be a dict of strike kinds to "
                              f"counts, e.g. {{{KINDS[0]!r}: 2}} (the kinds left out keep "
                              "their defaults)")
        # A partial dict changes those kinds only; the others keep their defaults.
        merged = {**_DEFAULT_STRIKES, **self.strikes}
        object.__setattr__(self, "strikes", merged)
        if (isinstance(self.far_ratio, bool) or not isinstance(self.far_ratio, (int, float))
                or not self.far_ratio > 1):
            raise ConfigError(f"far_ratio={self.far_ratio!r} must be > 1 (honest senders "
                              "are about 1 apart from the median sender), e.g. 4.0")
        unknown = set(self.strikes) - set(KINDS)
        if unknown or any(isinstance(v, bool) or not (isinstance(v, int) and v >= 1)
                          for v in self.strikes.values()):
            raise ConfigError(f"strikes={self.strikes!r}: keys are "
                              f"{', '.join(repr(k) for k in KINDS)}; values ints >= 1")
        if isinstance(self.memory, bool) or not (isinstance(self.memory, int) and self.memory >= 1):
            raise ConfigError(f"memory={self.memory!r} must be an int >= 1 (steps)")
        if (isinstance(self.false_positive, bool)
                or not isinstance(self.false_positive, (int, float))
                or not 0 < self.false_positive < 1):
            raise ConfigError(f"false_positive={self.false_positive!r} must be a probability "
                              "between 0 and 1 (an honest sender's chance, per step, of a "
                              "quarantine for being far), e.g. 1e-8")
        if (isinstance(self.far_window, bool) or not isinstance(self.far_window, int)
                or self.far_window < MOST_IN_A_ROW):
            raise ConfigError(f"far_window={self.far_window!r} must be an int >= "
                              f"{MOST_IN_A_ROW} (steps over which honest senders' rate of "
                              "far steps is measured; the longest run of far steps that "
                              "quarantines must fit in it), e.g. 200")


class Finding(NamedTuple):
    """One piece of evidence in one step, before it is recorded: against ``rank``; in a
    dispute, ``party`` is the other rank of the two (-1: none); ``score``: a far
    round's ratio to the median member (None: none)."""

    rank: int
    kind: str
    detail: str
    party: int = -1
    score: float | None = None


@dataclass(frozen=True)
class Evidence:
    """One strike against a member, as every honest rank recorded it."""

    member: str  # the member's id (worker id on an elastic cohort, "rank<i>" on a fixed one)
    rank: int  # its rank in the step's generation
    step: int
    kind: str
    detail: str
    party: str = ""  # in a dispute: the other member of the two

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SpotResult:
    """An owner's spot check of ``target``'s copy: the relative difference on its slices
    and whether it is over the tolerance (``spot.py``)."""

    target: int
    difference: float
    mismatch: bool
    unreproducible: bool = False  # the owner could not recompute its own gradient either


class Outcome(enum.IntEnum):
    """What one rank found when it recomputed an audited owner's aggregate."""

    AGREED = 1  # the aggregate is what every rank's copies make
    WRONG = 2  # it is not
    MISTAGGED = 3  # the owner tagged its own carried copy for another audit (it knew)
    UNDISCLOSED = 4  # the owner did not report the digests of the copies it received
    DISPUTED = 5  # a sender's carried copy is not the one the owner says it received
    VOID = 6  # another owner's copy was carried for another audit: no verdict


@dataclass(frozen=True)
class AuditResult:
    """An owner's audit of ``owner``'s aggregates of ``step`` (``audit.py``): the
    outcome, the relative difference it recomputed, and with ``DISPUTED`` the lowest
    sender whose carried copy differed."""

    owner: int
    step: int
    outcome: Outcome
    difference: float = 0.0
    disputed: int = -1

    @property
    def against_owner(self) -> bool:
        return self.outcome in (Outcome.WRONG, Outcome.MISTAGGED, Outcome.UNDISCLOSED)


@dataclass(frozen=True)
class Handed:
    """What a rank was handed by each owner in a step, as digests, for its next report:
    ``key``, the digest key it drew from that step's reports (a rank that drew another
    was told other reports than the rest); per owner, the keyed digest of its whole
    row, the aggregates, report and any carried audit copy (``fingerprint.keyed_digest``:
    cheap, and drawn after they were sent; the report in it changes nothing, since
    these digests are compared only between ranks that drew the same key, so were told
    the same reports) and a BLAKE3 digest of the report words (the key is drawn from
    them, so theirs must not depend on it)."""

    key: int
    aggregates: dict[int, int]
    reports: dict[int, int]


@dataclass(frozen=True)
class Reports:
    """What every rank reported about one step; row r is rank r's report."""

    finite: Sequence[Sequence[float]]  # [owner][sender]: 1 if all copies were finite
    distance: Sequence[Sequence[float]]  # [owner][sender]: squared distance to the aggregates
    owns: Sequence[float]  # [owner]: values the owner aggregated (0: it owned nothing)
    fingerprint: Sequence[int]  # [rank]: its parameters' fingerprint, before the update
    spot: Sequence[SpotResult | None] = ()  # [owner]: its spot check of the last step
    audit: Sequence[AuditResult | None] = ()  # [owner]: its audit result of the last step
    received: Sequence[Sequence[int]] = ()  # [owner][sender]: an audited owner's digests
    handed: Sequence[Sequence[int]] = ()  # [owner][rank]: digest of what rank handed it
    told: Sequence[Sequence[int]] = ()  # [owner][rank]: digest of the reports rank sent it
    key: Sequence[int] = ()  # [owner]: the key of its digests of the last step
    replayed: Sequence[Sequence[float]] = ()  # [owner][sender]: 1 if a copy was a replay


def judge(reports: Reports, samples: Sequence[float], trusted: Sequence[int],
          rules: Rules, excused: Collection[int] = (),
          handed: tuple[list[Finding], set[int]] | None = None) -> list[Finding]:
    """Each piece of evidence in one step (``Finding``); ``trusted`` are
    the ranks whose copies and reports count (the others were quarantined already);
    ``excused``: ranks handed other aggregates since the fingerprints were last
    compared (``handed_out``'s second part), not struck for a diverged replica;
    ``handed``: ``handed_out``'s result for these reports, when the caller has it."""
    owners = [r for r in trusted if reports.owns[r] > 0]
    found, another = handed_out(reports, trusted, owners) if handed is None else handed
    found = list(found)
    found += [
        Finding(i, DIVERGED, f"parameters' fingerprint {reports.fingerprint[i]:#x} differs from "
                      "the majority's") for i in diverged(reports.fingerprint, trusted)
        if i not in another and i not in excused]  # (repaired: its owner's doing)
    if not owners:
        return settle_disputes(found, ())
    found += spot_checked(reports, trusted, owners)
    found += audited(reports, trusted, owners)
    finite_votes = {i: sum(reports.finite[o][i] < 0.5 for o in owners) for i in trusted}
    mostly_finite = sum(v * 2 <= len(owners) for v in finite_votes.values()) * 2 > len(trusted)
    for i in trusted:
        if mostly_finite and finite_votes[i] * 2 > len(owners):
            found.append(Finding(i, NON_FINITE, f"{finite_votes[i]} of {len(owners)} slice owners "
                                         "received non-finite values from it"))
    replay_votes = {i: sum(o < len(reports.replayed) and reports.replayed[o][i] > 0.5
                           for o in owners if o != i) for i in trusted}
    mostly_fresh = sum(v * 2 <= len(owners) for v in replay_votes.values()) * 2 > len(trusted)
    for i, votes in replay_votes.items():  # (most flagged: a slice that stopped changing)
        others = len(owners) - (i in owners)
        if mostly_fresh and votes * 2 > others:
            found.append(Finding(i, REPLAYED, f"{votes} of {others} other slice owners "
                                              "received a copy from it that is bit for bit "
                                              "one it sent before"))
    flagged = {f.rank for f in found if f.kind == NON_FINITE}
    for i, score in far_scores(reports, samples, trusted, owners).items():
        if i not in flagged and score > rules.far_ratio:
            found.append(Finding(i, FAR, f"{score:.1f}x the median sender's distance from the "
                                  f"robust center (limit {rules.far_ratio:g})"))
    return settle_disputes(found, ())


def unreproducible(reports: Reports, owners: Sequence[int]) -> list[int]:
    """The owners whose spot check found that the loss does not recompute even their
    own gradient, if they are more than half of the owners that checked (a minority may
    be lying, or broken machines: it stops nobody); else empty."""
    checked = [o for o in owners if o < len(reports.spot) and reports.spot[o] is not None]
    said = [o for o in checked if reports.spot[o].unreproducible]  # type: ignore[union-attr]
    return said if said and len(said) * 2 > len(checked) else []


def spot_checked(reports: Reports, trusted: Sequence[int],
                 owners: Sequence[int]) -> list[Finding]:
    """A target whose copies more than half of the owners that recomputed them (all but
    itself) found wrong."""
    checks: dict[int, list[SpotResult]] = {}
    for o in owners:
        spot = reports.spot[o] if o < len(reports.spot) else None
        if spot is not None and spot.target != o and spot.target in trusted:
            checks.setdefault(spot.target, []).append(spot)
    found: list[Finding] = []
    for target, seen in sorted(checks.items()):
        wrong = sum(s.mismatch for s in seen)
        if wrong * 2 > len(owners) - (target in owners):
            middle = median([s.difference for s in seen])
            found.append(Finding(target, WRONG_GRADIENT,
                          f"{wrong} of {len(seen)} owners recomputed its gradient on its own "
                          f"samples and found it off by {middle:.3g} (relative, median)"))
    return found


def handed_out(reports: Reports, trusted: Sequence[int],
               owners: Sequence[int]) -> tuple[list[Finding], set[int]]:
    """Owners that handed some ranks other reports or aggregates than the rest in the
    last step: each rank reports, per owner, a digest of each (``Handed``). A rank whose
    digest of what an owner handed it is not the one most others report was handed
    something else, or lies about it: a dispute. The reports' digests are BLAKE3,
    comparable between any ranks; the aggregates' are keyed by a hash of the step's
    reports, so they are compared only between ranks that drew the majority's key (a
    rank told other reports drew another, and its dispute is over those reports). Also
    who was handed other aggregates (or is among reporters split with no majority:
    nobody can tell whose are the real ones): its replica diverging is no strike."""
    found: list[Finding] = []
    another: set[int] = set()
    keys = {r: reports.key[r] for r in owners if r < len(reports.key) and reports.key[r]}
    common = _majority(list(keys.values()))
    # A rank whose key is not the majority's (every rank, when none has a majority) was
    # told other reports: its aggregates' digests cannot be compared, so a replica of it
    # that diverged may be an owner's doing too. (No keys at all: a generation's first
    # step, with nothing handed before it to compare.)
    if keys:
        another |= {r for r in owners if common is None or keys.get(r) != common}
    for owner in trusted:
        told = {r: reports.told[r][owner] for r in owners
                if r != owner and r < len(reports.told) and reports.told[r][owner]}
        disputes, split = _minority(owner, told, "reports")
        found += disputes
        another |= split
        handed = {r: reports.handed[r][owner] for r in owners
                  if r != owner and r < len(reports.handed) and reports.handed[r][owner]
                  and keys.get(r) == common}
        disputes, split = _minority(owner, handed, "aggregates")
        found += disputes
        another |= split | {f.rank for f in disputes if f.rank != owner}
    return found, another


def _minority(owner: int, seen: dict[int, int],
              what: str) -> tuple[list[Finding], set[int]]:
    """Disputes between ``owner`` and each rank outside the majority of ``seen`` (rank:
    its digest of what the owner handed it), and the ranks of a split with no
    majority."""
    if len(set(seen.values())) <= 1:
        return [], set()
    majority = _majority(list(seen.values()))
    if majority is None:
        return [], set(seen)
    found = []
    others = f"{sum(v == majority for v in seen.values())} of {len(seen)}"
    for rank in sorted(r for r, value in seen.items() if value != majority):
        found.append(Finding(owner, DISPUTED,
                             f"rank {rank} reports it was handed other {what} in the last "
                             f"step than the ones {others} ranks were handed (one of the two "
                             "lied)", rank))
        found.append(Finding(rank, DISPUTED,
                             f"it reports rank {owner} handed it other {what} in the last "
                             f"step than the ones {others} ranks were handed (one of the two "
                             "lied)", owner))
    return found, set()


def settle_disputes(found: Sequence[Finding], out: Collection[int]) -> list[Finding]:
    """``found`` with each dispute pair (two ``DISPUTED`` findings naming each other, in
    order) kept only if neither of the two is out already (``out``) or taken by an
    earlier pair: an owner that two ranks dispute in one step takes one of them with
    it, not both (one attacker, one honest member at most)."""
    taken, kept = set(out), []
    disputes = [f for f in found if f.kind == DISPUTED]
    for first, second in zip(disputes[::2], disputes[1::2], strict=True):
        if {first.rank, second.rank} & taken or first.party != second.rank:
            continue
        taken |= {first.rank, second.rank}
        kept += [first, second]
    return [f for f in found if f.kind != DISPUTED] + kept


def audited(reports: Reports, trusted: Sequence[int],
            owners: Sequence[int]) -> list[Finding]:
    """The audits the owners reported on: evidence against an audited owner when more
    than half of the other owners found its aggregate wrong (or it hid from the audit),
    and against both it and a sender when more than half found that sender's carried
    copy differs from the one the owner says it received."""
    results: dict[tuple[int, int], list[AuditResult]] = {}
    for o in owners:
        result = reports.audit[o] if o < len(reports.audit) else None
        if result is not None and result.owner != o and result.owner in trusted:
            results.setdefault((result.owner, result.step), []).append(result)
    found: list[Finding] = []
    for (owner, step), seen in sorted(results.items()):
        voters = len(owners) - (owner in owners)
        against = [r for r in seen if r.against_owner]
        if len(against) * 2 > voters:
            kinds = sorted({r.outcome.name.lower() for r in against})
            middle = median([r.difference for r in against])
            found.append(Finding(owner, WRONG_AGGREGATE,
                          f"{len(against)} of {voters} other owners audited its aggregate of "
                          f"step {step} and found it {' or '.join(kinds)} (recomputed from "
                          f"every rank's copy: off by {middle:.3g}, relative, median)"))
            continue
        for sender in sorted({r.disputed for r in seen if r.outcome is Outcome.DISPUTED}):
            votes = sum(r.outcome is Outcome.DISPUTED and r.disputed == sender for r in seen)
            if votes * 2 > voters and sender in trusted and sender != owner:
                found.append(Finding(owner, DISPUTED,
                                     f"in the audit of its step {step}, {votes} of {voters} "
                                     f"other owners found rank {sender}'s carried copy differs "
                                     "from the one it says it received (one of the two lied)",
                                     sender))
                found.append(Finding(sender, DISPUTED,
                                     f"its copy carried for the audit of rank {owner}'s step "
                                     f"{step} differs, for {votes} of {voters} owners, from the "
                                     f"one rank {owner} says it received (one of the two lied)",
                                     owner))
                break
    return found


def far_scores(reports: Reports, samples: Sequence[float], trusted: Sequence[int],
               owners: Sequence[int]) -> dict[int, float]:
    """Each sender's distance ratio, by the median over owners."""
    per_owner: dict[int, list[float]] = {i: [] for i in trusted}
    for o in owners:
        scaled = {i: math.sqrt(max(reports.distance[o][i], 0.0) * max(samples[i], 1))
                  for i in trusted if math.isfinite(reports.distance[o][i])}
        if not scaled:
            continue
        middle = median(list(scaled.values()))
        for i in trusted:
            if i in scaled:
                per_owner[i].append(scaled[i] / middle if middle > 0 else
                                    (0.0 if scaled[i] == 0 else math.inf))
    return {i: median(v) for i, v in per_owner.items() if v}


def diverged(fingerprints: Sequence[int], trusted: Sequence[int]) -> list[int]:
    """Trusted ranks whose fingerprint is not the one more than half of them hold
    (none when no fingerprint has a majority: nothing to repair from)."""
    majority = majority_fingerprint(fingerprints, trusted)
    if majority is None:
        return []
    return [i for i in trusted if fingerprints[i] != majority]


def majority_fingerprint(fingerprints: Sequence[int], trusted: Sequence[int]) -> int | None:
    return _majority([fingerprints[i] for i in trusted])


def _majority(values: list[int]) -> int | None:
    """The value more than half of ``values`` are, if any."""
    for value in set(values):
        if values.count(value) * 2 > len(values):
            return value
    return None


def median(values: list[float]) -> float:
    """The median (0 of nothing): the middle value, or the mean of the two middle ones."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


class Strikes:
    """Strikes per member over the last ``rules.memory`` steps; who is quarantined.
    Far steps count in a row instead (``far.py``): ``observe_far`` each step first."""

    def __init__(self, rules: Rules, gross: bool = False) -> None:
        """``gross``: whether the caller marks gross far steps (rounds do): a third rule
        is then in use, and each rule holds a third of ``false_positive``, not a half."""
        self.rules = rules
        self.gross = gross
        self.alpha = rules.false_positive / (3 if gross else 2)
        self.evidence: list[Evidence] = []
        self.quarantined: dict[str, list[Evidence]] = {}
        self.far = FarWatch(rules.far_window)

    def observe_far(self, step: int, judged: Sequence[str], far: Collection[str],
                    gross: Collection[str] = ()) -> None:
        """Step ``step``'s far senders among those ``judged`` (``gross``: those far
        beyond ``far_ratio``, where the caller judges so), before its ``add``s."""
        self.far.record(step, judged, far, gross)

    def far_needed(self, member: str | None = None) -> int:
        """Far steps in a row that quarantine ``member`` now."""
        return needed(self.far.rate(member), self.rules.strikes.get(FAR, 1), self.alpha)

    def _far_out(self, member: str) -> int:
        """How many of ``member``'s last far steps quarantine it (0: none yet): a run
        in a row, more far steps in the window than an honest sender's chance, or
        (with gross steps) a short run with a gross step in it (``far.py``)."""
        run = self.far.run(member)
        if len(run) >= self.far_needed(member):
            return len(run)
        least = self.rules.strikes.get(FAR, 1)
        last = max(least, 2)
        if self.gross and len(run) >= last and any(run[:last]) and gross_chance(
                self.far.rate(member), self.far.gross_rate(member), last) <= self.alpha:
            return last
        far, judged = self.far.counts(member)
        if far >= least and too_often(far, judged, self.far.rate_at_most(member), self.alpha):
            return far
        return 0

    def add(self, evidence: Evidence) -> bool:
        """Record a strike; True if it quarantines the member now."""
        self.evidence.append(evidence)
        if evidence.member in self.quarantined:
            return False
        recent = [e for e in self.evidence if e.member == evidence.member
                  and e.kind == evidence.kind and e.step > evidence.step - self.rules.memory]
        if evidence.kind == FAR:
            out = self._far_out(evidence.member)
            if out:
                window = [e for e in self.evidence if e.member == evidence.member
                          and e.kind == FAR and e.step > evidence.step - self.rules.far_window]
                self.quarantined[evidence.member] = window[-out:]
                return True
            return False
        if len(recent) >= self.rules.strikes.get(evidence.kind, 1):
            self.quarantined[evidence.member] = recent
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"evidence": [e.as_dict() for e in self.evidence[-200:]],
                "quarantined": {m: [e.as_dict() for e in ev]
                                for m, ev in self.quarantined.items()},
                "far": self.far.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evidence = [Evidence(**e) for e in state.get("evidence", [])]
        self.quarantined = {m: [Evidence(**e) for e in ev]
                            for m, ev in state.get("quarantined", {}).items()}
        self.far.load_state_dict(state.get("far", {}))
