"""The audit of one slice owner's aggregates (pure, given what the exchange kept).

After a step, a hash of its reports picks one owner (``TrustPart``); nobody knew the
pick when it sent its copies or handed out its aggregates. Then:

1. every rank keeps its own copy of that owner's slices and the aggregate it was
   handed (``AuditPlan.of``); the owner itself keeps a digest of every copy it received
   (``received_digests``) and reports them in the next step;
2. in the next step every rank's copy rides along with its aggregate, tagged with the
   audit its carrier believes was picked (``exchange.py``, ``wire.audit_tag``), so
   every rank holds all of them;
3. each rank then finds an ``AuditResult`` (``outcome``): the tags agree, each carried
   copy is the one the owner says it received (the digests), and the owner's
   aggregate is what those copies make. It reports the result in the step after;
4. the verdict (``verdict.audited``) goes by the majority of the other owners' results,
   so a lying voter can neither accuse nor acquit an owner, and ranks that were carried
   different copies (a sender that carried one thing to some and another to others)
   still reach one verdict.

With a codec the copies are the encoded ones, as they were sent (``lanes.py``): the
digests are of the bytes, and the auditors decode the carried copies as the owner
decoded the ones it received, so they aggregate the owner's inputs bit for bit.

A sender that carries another copy than the one it sent cannot make an honest owner's
aggregate look wrong: the copy's digest differs from the owner's, so the result is a
dispute between the two (each gets a strike; one of them lied and nobody else can tell
which). An owner that makes up a digest to hide a wrong aggregate turns its audit into
a dispute with an honest sender: a strike each instead of its quarantine.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from potluck.trust import wire
from potluck.trust.aggregate import Aggregator
from potluck.trust.exchange import Kept
from potluck.trust.fingerprint import hash64
from potluck.trust.verdict import AuditResult, Outcome

TOLERANCE = 1e-5  # relative: the same code on the same inputs, maybe other threads


@dataclass(frozen=True)
class Audited:
    """One bucket of an audit: this rank's copy of the audited owner's slice (carried in
    the next step), the aggregate the owner handed out, the copies' weights, and the
    bucket's layout (the next step's bucket must have the same)."""

    copy: torch.Tensor
    given: torch.Tensor
    weights: torch.Tensor
    owners: tuple[int, ...]
    piece: int


@dataclass(frozen=True)
class AuditPlan:
    """Audit ``owner``'s slices of ``step``: per bucket, what the audit needs of it (not
    the whole step's buckets: two gradients' worth for a step more); as the audited
    owner, ``received`` holds the digest of each sender's copies it aggregated, keyed
    by ``of``'s ``key`` (drawn from the step's reports, after every copy was sent; the
    owner reports it, and auditors hash the carried copies under it: ``outcome``)."""

    owner: int
    step: int
    buckets: dict[int, Audited]
    received: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, owner: int, step: int, kept: dict[int, Kept], me: int, *,
           key: int) -> AuditPlan:
        buckets = {index: Audited(k.copy_of(owner).clone(), k.aggregate_of(owner).clone(),
                                  k.weights, k.owners, k.piece)
                   # (clones, needed: the hook reuses its buffers on the CPU, and the next
                   # step's first bucket overwrites this rank's copy before it is carried)
                   for index, k in kept.items()}
        received: dict[int, int] = {}
        if me == owner and kept:
            senders = next(iter(kept.values())).senders
            received = {sender: digest([k.copies[k.senders.index(sender)]
                                        for _, k in sorted(kept.items())
                                        if sender in k.senders], key)
                        for sender in senders}
        return cls(owner, step, buckets, received)

    @property
    def owners(self) -> tuple[int, ...]:
        """The slice owners of the planned step (none when it kept no bucket)."""
        return next(iter(self.buckets.values())).owners if self.buckets else ()

    def received_digests(self, senders: Sequence[int]) -> list[int]:
        """Per sender, the digest of its copies this owner received (0: none kept)."""
        return [self.received.get(sender, 0) for sender in senders]


def voting(audited: int, me: int, owners: Sequence[int]) -> bool:
    """Whether rank ``me``'s audit result counts in the verdict on owner ``audited``
    (``verdict.audited``): it must own a slice, and not be the audited owner itself."""
    return me != audited and me in owners


def digest(pieces: Sequence[torch.Tensor], key: int | None = None) -> int:
    """The first 64 bits of a BLAKE3 digest of the pieces' bytes, in order (never 0,
    which means "none"; ``fingerprint.hash64``), keyed by ``key``. An audit's digests
    are keyed by its step's key, which no sender knew when it sent its copy: unkeyed,
    64 bits would let a sender search about 2^32 pairs of copies for two that digest
    alike, send one and carry the other; keyed, it would have to find another copy
    with the digest of the one it sent, about 2^64 tries. Keyed BLAKE3 on the host
    on every device: a keyed sum on the accelerator (``keyed_digest``) is linear, and
    a carrier, who knows the key by then, could solve for another copy with its
    digest."""
    return hash64(pieces, key)


class Agreement(enum.Enum):
    AGREED = "agreed"
    VOID = "void"
    MISTAGGED = "mistagged"


def audit_agreement(plan: AuditPlan, carried: dict[int, Kept]) -> Agreement:
    """What the carried copies' tags say about this rank's plan: ``AGREED`` (every tag
    names it), ``VOID`` (another owner's tag names another audit: the reports the ranks
    hashed differed, so the copies do not belong together and no verdict can come of
    them), or ``MISTAGGED`` (only the audited owner's own tag differs: it knows it is
    audited, since it hashes the same reports, and a tag of its own cannot void its
    audit; that is evidence against it)."""
    expected, mistagged = wire.audit_tag(plan.owner, plan.step), False
    for kept in carried.values():
        tags = kept.audit_tags()
        if not tags:
            continue  # this bucket carried no copies (it changed since)
        for owner, tag in zip(kept.owners, tags, strict=True):
            if tag == expected:
                continue
            if owner != plan.owner:
                return Agreement.VOID
            mistagged = True
    return Agreement.MISTAGGED if mistagged else Agreement.AGREED


def carried_in_full(plan: AuditPlan, carried: dict[int, Kept]) -> bool:
    """Whether every bucket of the plan came back with copies in its layout (not when
    the buckets were rebuilt in between: then there is nothing to audit)."""
    for index, audited in plan.buckets.items():
        later = carried.get(index)
        if (later is None or later.owners != audited.owners
                or later.mine.dtype != audited.copy.dtype
                or later.audit_copies().shape[1] != audited.copy.numel()):
            return False
    return bool(plan.buckets)


def carried_digests(plan: AuditPlan, carried: dict[int, Kept], key: int) -> dict[int, int]:
    """Per carrier, the digest of the copies it carried (in the plan's bucket order),
    keyed by ``key``: the audited owner's, as it reported it (``outcome``)."""
    ordered = [carried[index] for index in sorted(plan.buckets)]
    owners = ordered[0].owners
    return {owner: digest([k.audit_copies()[k.owners.index(owner)] for k in ordered], key)
            for owner in owners}


def audit_difference(plan: AuditPlan, carried: dict[int, Kept], aggregator: Aggregator) -> float:
    """The largest difference, relative to the slice's size, between what ``plan.owner``
    handed out in ``plan.step`` and the aggregate of every rank's carried copy, beyond
    the bucket dtype's rounding (``beyond_rounding``). NaN when the copies did not all
    come back (``carried_in_full``)."""
    if not carried_in_full(plan, carried):
        return math.nan
    worst = 0.0
    for index, audited in plan.buckets.items():
        later = carried[index]
        copies = later.lanes.copies(later.audit_copies(), audited.piece)  # (decoded)
        expected = aggregator.aggregate(copies, audited.weights)
        worst = max(worst, beyond_rounding(audited.given, expected))
    return worst


def beyond_rounding(given: torch.Tensor, expected: torch.Tensor) -> float:
    """How far ``given`` (an owner's aggregate, in its bucket's dtype) is from
    ``expected`` (the auditor's, in float32) beyond rounding, relative to ``1 +`` the
    largest ``|expected|``. The auditor's float32 aggregate may differ from the owner's
    in its last bits (other threads, another GPU model's reduction order), and rounded
    to a 16-bit bucket dtype that can flip one of its ulps: up to ``eps(dtype) * |x|``
    per value is rounding, not a lie (so an owner can shade each value by about one
    ulp of its bucket dtype unseen)."""
    info = torch.finfo(given.dtype)
    rounded = expected.to(given.dtype)  # rounded as the owner's was
    if torch.equal(given, rounded):  # value for value (+0 and -0 alike; never with a NaN)
        return 0.0  # the usual case, one pass: the same code on the same inputs agrees
    rounded = rounded.float()
    given = given.float()
    diff = (given - rounded).abs()
    # Alike: both NaN; the same infinity; or the dtype's largest finite value against
    # the infinity of its sign (a float32 value just past it rounds either way).
    alike = ((torch.isnan(given) & torch.isnan(rounded)) | (given == rounded)
             | ((given.abs() == info.max) & torch.isinf(rounded)
                & (given.sign() == rounded.sign()))
             | ((rounded.abs() == info.max) & torch.isinf(given)
                & (given.sign() == rounded.sign())))
    diff = torch.where(alike, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=math.inf)
    size = torch.maximum(given.abs(), rounded.abs())
    slack = torch.nan_to_num(info.eps * size, nan=0.0, posinf=0.0)
    scale = 1.0 + float(torch.nan_to_num(expected, nan=0.0, posinf=0.0,
                                         neginf=0.0).abs().max())
    return float((diff - slack).clamp_min(0.0).max()) / scale


def outcome(plan: AuditPlan, carried: dict[int, Kept], received: Sequence[int],
            aggregator: Aggregator, key: int) -> AuditResult | None:
    """This rank's audit of ``plan``: the copies ``carried`` in the step after it, and
    ``received`` (per rank: the digests the audited owner reported of the copies it
    received; 0 for none), keyed by ``key``, the one the audited owner reported with
    them. Not the key this rank drew: an owner that told ranks different
    reports gives them different keys, and the carried copies hashed under another
    key than the audited owner's would all differ from its digests, its own among
    them, so an honest audited owner would be found wrong. The owner's key was drawn
    after every copy was sent whatever it says; one that reports another key only
    spoils its own audit. None when the copies did not come back in full."""
    if not carried_in_full(plan, carried):
        return None
    agreement = audit_agreement(plan, carried)
    if agreement is not Agreement.AGREED:
        return AuditResult(plan.owner, plan.step, Outcome[agreement.name])
    carriers = carried_digests(plan, carried, key)
    claimed = {sender: received[sender] if sender < len(received) else 0
               for sender in carriers}
    if any(value == 0 for value in claimed.values()):
        return AuditResult(plan.owner, plan.step, Outcome.UNDISCLOSED)
    differ = sorted(s for s, value in carriers.items() if value != claimed[s])
    if plan.owner in differ:  # its own copy is not the one it says it had
        return AuditResult(plan.owner, plan.step, Outcome.WRONG, math.inf)
    if differ:
        return AuditResult(plan.owner, plan.step, Outcome.DISPUTED, disputed=differ[0])
    worst = audit_difference(plan, carried, aggregator)
    return AuditResult(plan.owner, plan.step,
                       Outcome.WRONG if worst > TOLERANCE or math.isnan(worst)
                       else Outcome.AGREED, worst)
