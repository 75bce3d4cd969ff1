"""The audit's recomputation from the copies carried in the next step, its tags (an
audit whose carried copies name different audits is void, never a verdict, unless only
the audited owner's own tag differs), the digests that tell a sender's changed copy from
an owner's wrong aggregate, and the majority verdict over the owners' results (pure)."""

from __future__ import annotations

import math

import pytest
import torch

from potluck.trust import CenteredClip, Rules, wire
from potluck.trust.audit import (
    Agreement,
    AuditPlan,
    audit_agreement,
    audit_difference,
    digest,
    outcome,
    voting,
)
from potluck.trust.exchange import Kept
from potluck.trust.verdict import (
    DISPUTED,
    DIVERGED,
    FAR,
    WRONG_AGGREGATE,
    AuditResult,
    Evidence,
    Finding,
    Outcome,
    Reports,
    Strikes,
    audited,
    judge,
    settle_disputes,
)

OWNERS = (0, 1, 2)
PIECE = 4
WORD = wire.per_word(torch.float32)
REPORT = wire.report_words(len(OWNERS)) * WORD  # values
AUDITED, STEP = 1, 41


def gradients() -> torch.Tensor:
    """Every rank's gradient of the audited step, ``[ranks, PIECE * owners]``."""
    return torch.randn(len(OWNERS), PIECE * len(OWNERS),
                       generator=torch.Generator().manual_seed(7))


def kept(received_rows: list[torch.Tensor], copies: torch.Tensor | None = None) -> Kept:
    received = torch.cat(received_rows)
    return Kept(mine=torch.zeros(len(OWNERS), PIECE), received=received, piece=PIECE,
                report=REPORT, owners=OWNERS, senders=OWNERS, weights=torch.ones(3),
                copies=torch.empty(0, PIECE) if copies is None else copies, parameters=())


def audited_step(grads: torch.Tensor, *, lie: float = 0.0) -> Kept:
    """The step as the audited owner kept it: each owner's aggregate of its slice (owner
    1 adds ``lie`` to its own), then its report; the copies of its slice it received."""
    rows = []
    for k in OWNERS:
        value = CenteredClip().aggregate(grads[:, k * PIECE:(k + 1) * PIECE], torch.ones(3))
        rows.append(torch.cat([value + (lie if k == AUDITED else 0.0), torch.zeros(REPORT)]))
    return kept(rows, copies=grads[:, AUDITED * PIECE:(AUDITED + 1) * PIECE].clone())


def carried_step(grads: torch.Tensor, tags: dict[int, tuple[int, int]] | None = None,
                 changed: dict[int, float] | None = None) -> Kept:
    """The next step: each owner's row carries its copy of the slice its tag names
    (``tags``: owner -> (audited owner, step); default: the plan's), plus ``changed``
    (owner -> how much it added to the copy it had sent)."""
    rows = []
    for k in OWNERS:
        owner, step = (tags or {}).get(k, (AUDITED, STEP))
        copy = grads[k, owner * PIECE:(owner + 1) * PIECE] + (changed or {}).get(k, 0.0)
        tag = wire.to_values(torch.tensor([wire.audit_tag(owner, step)]), torch.float32)
        rows.append(torch.cat([torch.zeros(PIECE), torch.zeros(REPORT), copy, tag]))
    return kept(rows)


KEY = 0x5EED


def plan(grads: torch.Tensor, *, lie: float = 0.0, me: int = 0, key: int = KEY) -> AuditPlan:
    return AuditPlan.of(AUDITED, STEP, {0: audited_step(grads, lie=lie)}, me, key=key)


def received(grads: torch.Tensor, *, lie: float = 0.0) -> list[int]:
    """The digests the audited owner reports of the copies it received."""
    return plan(grads, lie=lie, me=AUDITED).received_digests(OWNERS)


def result(grads: torch.Tensor, carried: Kept, *, lie: float = 0.0,
           digests: list[int] | None = None, mine: int = KEY,
           reported: int = KEY) -> AuditResult | None:
    """The audit as a rank that drew key ``mine`` finds it, the audited owner having
    drawn and reported ``reported`` (its digests are keyed by it)."""
    owner_plan = AuditPlan.of(AUDITED, STEP, {0: audited_step(grads, lie=lie)}, AUDITED,
                              key=reported)
    return outcome(plan(grads, lie=lie, key=mine), {0: carried},
                   owner_plan.received_digests(OWNERS) if digests is None else digests,
                   CenteredClip(), reported)


def test_an_honest_owner_recomputes_to_its_aggregate() -> None:
    grads = gradients()
    carried = {0: carried_step(grads)}
    assert audit_agreement(plan(grads), carried) is Agreement.AGREED
    assert audit_difference(plan(grads), carried, CenteredClip()) == pytest.approx(0.0, abs=1e-6)


def test_a_lying_owner_is_seen() -> None:
    grads = gradients()
    assert audit_difference(plan(grads, lie=0.5), {0: carried_step(grads)}, CenteredClip()) > 0.1


@pytest.mark.parametrize("other", [(0, STEP), (AUDITED, STEP - 1)])
def test_copies_tagged_for_another_audit_void_it(other: tuple[int, int]) -> None:
    """Owner 2 picked another audit (the reports it hashed differed): the copies do not
    belong together, and recomputing them would accuse the honest owner 1."""
    grads = gradients()
    carried = {0: carried_step(grads, tags={2: other})}
    assert carried[0].audit_tags()[2] == wire.audit_tag(*other)
    assert audit_agreement(plan(grads), carried) is Agreement.VOID
    void = result(grads, carried[0])
    assert void is not None and void.outcome is Outcome.VOID


def test_the_audited_owner_cannot_void_its_own_audit_with_a_bad_tag() -> None:
    """It hashes the same reports, so it knows it is audited: a lying owner that tags
    its carried copy for another audit is mistagged, which is evidence against it."""
    grads = gradients()
    carried = {0: carried_step(grads, tags={AUDITED: (0, STEP)})}
    assert audit_agreement(plan(grads, lie=0.5), carried) is Agreement.MISTAGGED


def test_a_step_that_carried_no_audit_has_no_tags_and_no_copies() -> None:
    empty = kept([torch.cat([torch.zeros(PIECE), torch.zeros(REPORT)]) for _ in OWNERS])
    assert empty.audit_tags() == [] and empty.audit_copies().shape == (3, 0)
    assert audit_agreement(plan(gradients()), {0: empty}) is Agreement.AGREED
    assert math.isnan(audit_difference(plan(gradients()), {0: empty}, CenteredClip()))


def test_audit_tag_refuses_what_it_cannot_hold() -> None:
    assert wire.audit_tag(3, 5) != wire.audit_tag(5, 3)
    with pytest.raises(ValueError, match="out of range"):
        wire.audit_tag(1 << 20, 0)


def test_the_audited_owner_keeps_a_digest_of_each_copy_it_received_and_only_it() -> None:
    grads = gradients()
    assert plan(grads).received == {} and plan(grads).received_digests(OWNERS) == [0, 0, 0]
    digests = received(grads)
    assert len(set(digests)) == 3 and 0 not in digests
    assert digests[2] == digest([grads[2, AUDITED * PIECE:(AUDITED + 1) * PIECE]], KEY)
    changed = grads[2, AUDITED * PIECE:(AUDITED + 1) * PIECE].clone()
    changed[0] = torch.nextafter(changed[0], torch.tensor(math.inf))  # one ulp
    assert digest([changed], KEY) != digests[2]
    # keyed by the step's key (drawn after the copies were sent): another key, other
    # digests, so no pair of copies found before the key digests alike under it
    assert plan(grads, me=AUDITED, key=KEY + 1).received_digests(OWNERS)[2] != digests[2]


def test_each_rank_finds_an_outcome_honest_lying_changed_hidden_or_void() -> None:
    grads = gradients()
    honest = result(grads, carried_step(grads))
    assert honest is not None and honest.outcome is Outcome.AGREED
    lying = result(grads, carried_step(grads), lie=0.5)
    assert lying is not None and lying.outcome is Outcome.WRONG and lying.difference > 0.1
    # rank 2 carries another copy than the one it sent: a dispute, not a wrong aggregate
    changed = result(grads, carried_step(grads, changed={2: 3.0}))
    assert changed == AuditResult(AUDITED, STEP, Outcome.DISPUTED, disputed=2)
    # the owner's own carried copy is not the one it says it had: against it
    own = result(grads, carried_step(grads, changed={AUDITED: 3.0}))
    assert own is not None and own.outcome is Outcome.WRONG
    hidden = result(grads, carried_step(grads), digests=[0, 0, 0])
    assert hidden is not None and hidden.outcome is Outcome.UNDISCLOSED
    void = result(grads, carried_step(grads, tags={2: (0, STEP)}))
    assert void is not None and void.outcome is Outcome.VOID
    mistagged = result(grads, carried_step(grads, tags={AUDITED: (0, STEP)}))
    assert mistagged is not None and mistagged.outcome is Outcome.MISTAGGED
    empty = kept([torch.cat([torch.zeros(PIECE), torch.zeros(REPORT)]) for _ in OWNERS])
    assert result(grads, empty) is None  # nothing came back: no result at all


def test_the_carried_copies_are_hashed_under_the_audited_owners_key_not_the_auditors() -> None:
    """An owner that told ranks different reports gave them different keys. An auditor
    that drew another key than the audited owner's must still find an honest owner
    right: hashed under its own key, every carried copy would differ from the owner's
    digests, its own among them, and the honest owner would be found wrong."""
    grads = gradients()
    other = result(grads, carried_step(grads), mine=KEY + 1, reported=KEY)
    assert other is not None and other.outcome is Outcome.AGREED
    # the key matters: the owner's digests checked under another key than its own differ
    wrong_key = outcome(plan(grads, key=KEY + 1), {0: carried_step(grads)}, received(grads),
                        CenteredClip(), KEY + 1)
    assert wrong_key is not None and wrong_key.outcome is Outcome.WRONG
    # and a carrier's changed copy is still seen under the owner's key
    changed = result(grads, carried_step(grads, changed={2: 3.0}), mine=KEY + 1)
    assert changed == AuditResult(AUDITED, STEP, Outcome.DISPUTED, disputed=2)


def _reports(results: dict[int, AuditResult | None], n: int = 4) -> Reports:
    return Reports(finite=[[1.0] * n for _ in range(n)],
                   distance=[[1.0] * n for _ in range(n)], owns=[1.0] * n,
                   fingerprint=[5] * n, audit=[results.get(o) for o in range(n)])


def _verdict(results: dict[int, AuditResult | None]) -> list[tuple[int, str]]:
    found = judge(_reports(results), [1] * 4, range(4), Rules())
    return sorted((rank, kind) for rank, kind, *_ in found)


def test_the_verdict_goes_by_the_other_owners_majority() -> None:
    wrong = AuditResult(1, STEP, Outcome.WRONG, 0.3)
    agreed = AuditResult(1, STEP, Outcome.AGREED)
    assert _verdict({0: wrong, 2: wrong, 3: agreed}) == [(1, WRONG_AGGREGATE)]
    # one lying voter can neither accuse an honest owner nor acquit a lying one
    assert _verdict({0: wrong, 2: agreed, 3: agreed}) == []
    assert _verdict({0: agreed, 2: wrong, 3: wrong}) == [(1, WRONG_AGGREGATE)]
    # the owner's own result does not count; nor does a result from one that owns nothing
    assert _verdict({1: wrong, 0: wrong}) == []
    hidden = AuditResult(1, STEP, Outcome.UNDISCLOSED)
    assert _verdict({0: hidden, 2: wrong, 3: agreed}) == [(1, WRONG_AGGREGATE)]


def test_a_sender_that_carried_another_copy_is_disputed_with_the_owner() -> None:
    """Rank 3 carried another copy than it sent to owner 1. Carried alike to everyone,
    the others find a dispute between 3 and 1 (both go), never a wrong aggregate.
    Carried to some only, those that got the honest copy find the owner right, so there
    is no majority against it either."""
    dispute = AuditResult(1, STEP, Outcome.DISPUTED, disputed=3)
    assert _verdict({0: dispute, 2: dispute, 3: AuditResult(1, STEP, Outcome.WRONG)}) == [
        (1, DISPUTED), (3, DISPUTED)]
    agreed = AuditResult(1, STEP, Outcome.AGREED)
    assert _verdict({0: dispute, 2: agreed, 3: AuditResult(1, STEP, Outcome.WRONG)}) == []


def test_results_for_different_audits_are_not_counted_together() -> None:
    wrong = AuditResult(1, STEP, Outcome.WRONG, 0.3)
    other = AuditResult(1, STEP - 1, Outcome.WRONG, 0.3)
    assert _verdict({0: wrong, 2: other, 3: AuditResult(1, STEP, Outcome.AGREED)}) == []


def test_an_audit_result_rides_in_a_report_bit_for_bit() -> None:
    owners = senders = (0, 1, 2)
    results = [AuditResult(1, STEP, Outcome.DISPUTED, 0.0, 2), None,
               AuditResult(0, STEP, Outcome.WRONG, math.inf)]
    rows = torch.stack([wire.encode_report(3, [True] * 3, [1.0] * 3, [1, 1, 1],
                                           audit=results[o],
                                           received=[11, -12, 13] if o == 1 else None)
                        for o in owners])
    reports = wire.decode_reports([(owners, senders, rows)], 3)
    assert list(reports.audit) == results
    assert reports.received[1] == [11, -12, 13] and reports.received[0] == [0, 0, 0]
    assert wire.audit_of(wire.audit_tag(5, 1234)) == (5, 1234)


def _handed(digests: dict[int, dict[int, int]], fingerprints: list[int] | None = None,
            excused: tuple[int, ...] = ()) -> list[tuple[int, str]]:
    """``digests[reporter][owner]``: what each reporter says ``owner`` handed it."""
    reports = Reports(finite=[[1.0] * 4 for _ in range(4)],
                      distance=[[1.0] * 4 for _ in range(4)], owns=[1.0] * 4,
                      fingerprint=fingerprints or [5] * 4,
                      handed=[[digests.get(r, {}).get(o, 0) for o in range(4)]
                              for r in range(4)])
    found = judge(reports, [1] * 4, range(4), Rules(), excused)
    return sorted((rank, kind) for rank, kind, *_ in found)


def test_an_owner_that_handed_one_rank_another_aggregate_is_disputed_with_it() -> None:
    alike = {r: {o: 100 + o for o in range(4)} for r in range(4)}
    assert _handed(alike) == []
    # owner 3 handed rank 0 something else: rank 0's replica diverged (repaired, but it is
    # not struck for it), and the two get a dispute each
    other = {**alike, 0: {**alike[0], 3: 999}}
    assert _handed(other, fingerprints=[6, 5, 5, 5]) == [(0, DISPUTED), (3, DISPUTED)]
    # a lone rank that lies about what an owner handed it cannot do more than that
    lie = {**alike, 1: {**alike[1], 2: 7}}
    assert _handed(lie) == [(1, DISPUTED), (2, DISPUTED)]
    # without a majority (three ranks, three digests), nobody can be told apart: no
    # dispute, and none of them is struck for a replica that diverged with it
    split = {r: {**alike[r], 3: 1 + r} for r in range(3)}
    assert _handed(split) == []
    assert _handed(split, fingerprints=[5, 6, 6, 6]) == []
    # a diverged replica with no such explanation is still struck; one handed another
    # aggregate in a step whose fingerprints were not compared is excused (TrustPart
    # keeps them until the next comparison)
    assert _handed(alike, fingerprints=[6, 5, 5, 5]) == [(0, DIVERGED)]
    assert _handed(alike, fingerprints=[6, 5, 5, 5], excused=(0,)) == []


def test_the_keyed_digest_sees_any_change_and_depends_on_the_key() -> None:
    from potluck.trust.fingerprint import keyed_digest

    values = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    whole = keyed_digest([values], 11)
    assert keyed_digest([values[:400], values[400:]], 11) == whole  # runs, in order
    assert keyed_digest([values], 12) != whole
    for index in (0, 1, 999):
        changed = values.clone()
        changed[index] = -changed[index]  # one sign bit
        assert keyed_digest([changed], 11) != whole
    swapped = values.clone()
    swapped[[3, 4]] = swapped[[4, 3]]  # a plain sum of the bits would not see a swap
    assert keyed_digest([swapped], 11) != whole
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        assert keyed_digest([values.to(dtype)], 11) not in (0, whole)


def _values(kind: str) -> torch.Tensor:
    values = torch.randn(12, 25, generator=torch.Generator().manual_seed(5))
    return {"float64": values.double(), "float16": values.half(),
            "bfloat16": values.bfloat16(), "transposed": values.t(),
            "0-d": values[0, 0], "int32": (values * 100).int()}[kind]


@pytest.mark.parametrize("kind", ["float64", "float16", "bfloat16", "transposed", "0-d",
                                  "int32"])
@pytest.mark.parametrize("key", [7, -5, -(1 << 63), (1 << 63) - 1])
def test_the_keyed_digest_on_the_cpu_is_keyed_blake3_of_the_bytes(
        key: int, kind: str) -> None:
    """Any key (negative ones too) is read as its 8 bytes, unsigned, big-endian (four
    times: BLAKE3's 32-byte key); the values as their bytes in (row-major) order,
    whatever their layout."""
    import blake3

    from potluck.trust.fingerprint import keyed_digest

    values = _values(kind)
    raw = values.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    h = blake3.blake3(raw, key=(key % (1 << 64)).to_bytes(8, "big") * 4)
    expected = int.from_bytes(h.digest(8), "big", signed=True)
    flat = values.reshape(-1)
    assert keyed_digest([flat[:5], flat[5:]] if flat.numel() > 1 else [values], key) \
        == expected


def _splitmix64(key: int, count: int) -> list[int]:
    """The accelerators' key words by their definition, in Python's exact integers."""
    mask, words = (1 << 64) - 1, []
    for i in range(1, count + 1):
        z = (key + i * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        words.append(z - (1 << 64) if z >> 63 else z)
    return words


def _exact_dot(words: list[int], table: list[int]) -> int:
    exact = sum(w * t for w, t in zip(words, table, strict=True)) % (1 << 64)
    return exact - (1 << 64) if exact >> 63 else exact


@pytest.mark.parametrize("key", [7, -5, -(1 << 63), (1 << 63) - 1])
def test_the_accelerators_dot_digest_is_its_definition_in_exact_integers(key: int) -> None:
    """The key's words are splitmix64 of the key and the index alone (so every card draws
    the same ones), and the product and sum wrap in 64 bits: the digest equals the dot
    product of the 32-bit words with them, computed in Python's exact integers and
    reduced modulo 2^64 to a signed word (run here on the CPU's tensors); it sees a
    flipped sign bit and a swap."""
    from potluck.trust.fingerprint import _table, bit_words, chunked_dot_digest, dot_digest

    values = _values("float64").reshape(-1)
    words = values.view(torch.int32).tolist()
    table = _table(0, len(words), key, torch.device("cpu"))
    assert table.tolist() == _splitmix64(key % (1 << 64), len(words))
    digest = dot_digest(bit_words(values).to(torch.int64), table)
    assert digest == _exact_dot(words, table.tolist())
    flipped, swapped = values.clone(), values.clone()
    flipped[7] = -flipped[7]
    swapped[[3, 4]] = swapped[[4, 3]]
    for other in (flipped, swapped):
        assert dot_digest(bit_words(other).to(torch.int64), table) != digest
    # in chunks (any chunk's words computed alone), over tensors of other word sizes
    assert chunked_dot_digest([values[:100], values[100:]], key, chunk=7) == digest
    halves = _values("bfloat16").reshape(-1)
    whole = dot_digest(bit_words(halves).to(torch.int64), _table(0, halves.numel(), key,
                                                                  torch.device("cpu")))
    assert chunked_dot_digest([halves[:31], halves[31:]], key, chunk=16) == whole


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_keyed_digest_on_cuda_is_the_dot_product_with_the_same_words() -> None:
    from potluck.trust.fingerprint import _table, keyed_digest

    values = _values("float64").reshape(-1)
    words = values.view(torch.int32).tolist()
    device = torch.device("cuda")
    assert _table(0, len(words), -5, device).cpu().tolist() == _splitmix64(-5 % (1 << 64),
                                                                         len(words))
    assert keyed_digest([values[:9].to(device), values[9:].to(device)], -5) == _exact_dot(
        words, _splitmix64(-5 % (1 << 64), len(words)))


@pytest.mark.parametrize("key", [None, 0x5EED, -3])
def test_the_copy_digest_is_the_first_64_bits_of_blake3_of_the_bytes(key: int | None) -> None:
    """Keyed (the audit's copies: the key's 8 bytes, unsigned, four times) or not (the
    report words)."""
    import blake3

    from potluck.trust.audit import digest

    a = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    b = torch.randn(7, dtype=torch.float64)
    raw = a.numpy().tobytes() + b.numpy().tobytes()
    expected = (blake3.blake3(raw) if key is None else
                blake3.blake3(raw, key=(key % (1 << 64)).to_bytes(8, "big") * 4)).digest(8)
    assert digest([a, b], key) == int.from_bytes(expected, "big", signed=True)
    strided = a.t()  # not contiguous: hashed as its values in order
    assert digest([strided]) == digest([strided.contiguous()])


def _dispute(member: str, party: str, step: int) -> Evidence:
    return Evidence(member, 0, step, DISPUTED, "", party)


def test_disputes_are_settled_in_pairs_one_attacker_one_honest_member_at_most() -> None:
    """Owner 3 handed ranks 0 and 1 other aggregates than rank 2: two disputes in one
    step. Both members of the first pair go; the second names owner 3, already taken,
    so rank 1 stays (excused for its diverged replica, not struck)."""
    alike = {r: {o: 100 + o for o in range(4)} for r in range(4)}
    two = {**alike, 0: {**alike[0], 3: 8}, 1: {**alike[1], 3: 9}}
    reports = Reports(finite=[[1.0] * 4 for _ in range(4)],
                      distance=[[1.0] * 4 for _ in range(4)], owns=[1.0] * 4,
                      fingerprint=[6, 7, 5, 5], handed=[[two[r][o] for o in range(4)]
                                                        for r in range(4)])
    # (no majority digest of owner 3 among ranks 0, 1, 2: every one of them is excused)
    assert sorted((f.rank, f.kind) for f in judge(reports, [1] * 4, range(4), Rules())) == []
    found = [Finding(3, DISPUTED, "", 0), Finding(0, DISPUTED, "", 3),
             Finding(3, DISPUTED, "", 1), Finding(1, DISPUTED, "", 3),
             Finding(2, FAR, "")]
    settled = settle_disputes(found, ())
    assert sorted((f.rank, f.kind) for f in settled) == [
        (0, DISPUTED), (2, FAR), (3, DISPUTED)]
    assert settle_disputes(found, {3}) == [Finding(2, FAR, "")]  # 3 was out already
    strikes = Strikes(Rules())  # one dispute quarantines both of its members
    assert strikes.add(_dispute("A", "H", 1)) and strikes.add(_dispute("H", "A", 1))
    assert Rules().strikes[DISPUTED] == 1


def test_evidence_of_a_dispute_names_the_other_party_and_round_trips() -> None:
    strikes = Strikes(Rules())
    strikes.add(_dispute("H1", "A", 1))
    again = Strikes(Rules())
    again.load_state_dict(strikes.state_dict())
    assert again.evidence == strikes.evidence and again.evidence[0].party == "A"
    old = {"evidence": [{"member": "m", "rank": 0, "step": 1, "kind": DIVERGED,
                         "detail": ""}], "quarantined": {}}
    again.load_state_dict(old)  # a checkpoint from before disputes had parties
    assert again.evidence[0].party == ""


def _told(told: dict[int, dict[int, int]], handed: dict[int, dict[int, int]],
          keys: list[int]) -> list[tuple[int, str, int]]:
    reports = Reports(finite=[[1.0] * 4 for _ in range(4)],
                      distance=[[1.0] * 4 for _ in range(4)], owns=[1.0] * 4,
                      fingerprint=[5] * 4,
                      handed=[[handed[r][o] for o in range(4)] for r in range(4)],
                      told=[[told[r][o] for o in range(4)] for r in range(4)], key=keys)
    return sorted((f.rank, f.kind, f.party) for f in judge(reports, [1] * 4, range(4), Rules()))


def test_an_owner_that_told_one_rank_other_reports_is_disputed_with_it() -> None:
    """Owner 3 sent rank 0 other report words than the rest (the reports are what every
    rank hashes for the audit's pick and the digests' key). Rank 0 then drew another
    key, so its digests of the aggregates are not compared with the others' (they would
    all differ: before, that made rank 0 dispute some honest owner); the reports'
    BLAKE3 digests name owner 3."""
    alike = {r: {o: 100 + o for o in range(4)} for r in range(4)}
    told = {**alike, 0: {**alike[0], 3: 7}}
    other_key = {**alike, 0: {o: 50 + o for o in range(4)}}  # every digest differs
    assert _told(told, other_key, keys=[2, 1, 1, 1]) == [(0, DISPUTED, 3), (3, DISPUTED, 0)]
    # the same digests under one key: no dispute; and it is the key that spares rank 0
    # (with none reported, its aggregates' digests would count)
    assert _told(alike, alike, keys=[1, 1, 1, 1]) == []
    assert _told(alike, other_key, keys=[0, 0, 0, 0]) != []


def test_the_handed_digests_and_key_ride_in_a_report() -> None:
    from potluck.trust.verdict import Handed

    owners = senders = (0, 2, 3)
    handed = Handed(99, {0: 11, 2: 12, 3: 13}, {0: 21, 2: -22, 3: 23})
    rows = torch.stack([wire.encode_report(3, [True] * 3, [1.0] * 3, [1, 1, 1],
                                           handed=handed if o == 2 else None,
                                           senders=senders) for o in owners])
    reports = wire.decode_reports([(owners, senders, rows)], 4)
    assert reports.key == [0, 0, 99, 0]
    assert reports.handed[2] == [11, 0, 12, 13] and reports.told[2] == [21, 0, -22, 23]
    assert reports.handed[0] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="senders"):
        wire.encode_report(3, [True] * 3, [1.0] * 3, [1, 1, 1], handed=handed)


def test_ranks_told_reports_split_with_no_majority_are_excused_not_struck() -> None:
    """Owner 3 sent ranks 0, 1 and 2 three versions of its reports (and each drew
    another key) and handed rank 0 another aggregate: nothing can be compared, so
    nobody is disputed, but rank 0's diverged replica is not struck either."""
    alike = {r: {o: 100 + o for o in range(4)} for r in range(4)}
    told = {r: {**alike[r], 3: 7 + r} for r in range(4)}
    reports = Reports(finite=[[1.0] * 4 for _ in range(4)],
                      distance=[[1.0] * 4 for _ in range(4)], owns=[1.0] * 4,
                      fingerprint=[6, 5, 5, 5],
                      handed=[[alike[r][o] for o in range(4)] for r in range(4)],
                      told=[[told[r][o] for o in range(4)] for r in range(4)],
                      key=[11, 12, 13, 0])
    assert judge(reports, [1] * 4, range(4), Rules()) == []
    same_key = Reports(**{**reports.__dict__, "key": [11, 11, 11, 11],
                          "told": [[alike[r][o] for o in range(4)] for r in range(4)]})
    assert [(f.rank, f.kind) for f in judge(same_key, [1] * 4, range(4), Rules())] == [
        (0, DIVERGED)]  # (one key, one version of the reports: rank 0 is on its own)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_aggregate_one_rounding_apart_is_not_a_lie(dtype: torch.dtype) -> None:
    """The auditor's float32 aggregate may differ from the owner's in its last bits
    (another GPU model's reduction order); at a 16-bit value's rounding midpoint that
    flips one of its ulps, which is not a lie. Three ulps off is."""
    from potluck.trust.audit import TOLERANCE, beyond_rounding

    gen = torch.Generator().manual_seed(2)
    low = ((torch.rand(64, generator=gen) + 0.5) * 4).to(dtype)
    high = (low.view(torch.int16) + 1).view(dtype)  # the next 16-bit value up (positive)
    low, high = torch.cat([low, -high]), torch.cat([high, -low])  # negative ones too
    midpoint = (low.float() + high.float()) / 2  # exact in float32
    owners = midpoint - midpoint.abs() * 1e-7  # rounds to ``low`` ...
    auditors = midpoint + midpoint.abs() * 1e-7  # ... and the auditor's to ``high``
    given = owners.to(dtype)
    assert bool((given != auditors.to(dtype)).all())  # one ulp apart everywhere
    assert beyond_rounding(given, auditors) == 0.0
    ulp = high.float() - low.float()
    lie = (low.float() + 3 * ulp).to(dtype)  # three ulps off (two from the auditor's)
    assert beyond_rounding(lie, auditors) > TOLERANCE
    assert beyond_rounding(auditors.float(), auditors) == 0.0  # float32: exact
    assert beyond_rounding(auditors.float() + 1e-3, auditors) > TOLERANCE


def test_equal_infinities_and_the_largest_float16_against_infinity_are_alike() -> None:
    """A float16 aggregate that overflowed on both sides, or a float32 value just past
    float16's largest that rounds to it on one side and to infinity on the other, is
    rounding too; a finite value against infinity otherwise is not."""
    from potluck.trust.audit import TOLERANCE, beyond_rounding

    top = torch.finfo(torch.float16).max
    given = torch.tensor([math.inf, -math.inf, top, -top, 1.0], dtype=torch.float16)
    expected = torch.tensor([70000.0, -70000.0, 65521.0, -65521.0, 1.0])
    assert beyond_rounding(given, expected) == 0.0
    assert beyond_rounding(torch.tensor([1000.0], dtype=torch.float16),
                           torch.tensor([70000.0])) > TOLERANCE
    assert beyond_rounding(torch.tensor([-top], dtype=torch.float16),
                           torch.tensor([70000.0])) > TOLERANCE  # the other sign


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_an_aggregate_equal_to_the_auditors_is_agreed_whatever_its_special_values(
        dtype: torch.dtype) -> None:
    """Equal value for value (the one-pass case): zeros of either sign, infinities,
    ordinary values; a NaN on both sides is alike too, a NaN on one side is not."""
    from potluck.trust.audit import TOLERANCE, beyond_rounding

    expected = torch.tensor([0.0, -0.0, math.inf, -math.inf, 1.5, -3.25])
    assert beyond_rounding(expected.to(dtype), expected.clone()) == 0.0
    assert beyond_rounding(expected.neg().to(dtype)[:2], expected[:2].clone()) == 0.0  # -0/+0
    both = torch.tensor([math.nan, 1.0])
    assert beyond_rounding(both.to(dtype), both.clone()) == 0.0
    assert beyond_rounding(torch.tensor([math.nan, 1.0]).to(dtype),
                           torch.tensor([2.0, 1.0])) > TOLERANCE
    assert beyond_rounding(torch.tensor([2.0, 1.0]).to(dtype),
                           torch.tensor([math.nan, 1.0])) > TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_reports_digest_is_the_same_from_its_words_or_its_values(dtype: torch.dtype) -> None:
    """``TrustPart`` digests each owner's report from the words it decoded
    (``Kept.reports()``): the same bytes, so the same digest, as the values in the row
    (``Kept.report_of``), in every bucket dtype, with a bitmap riding after it."""
    word = wire.per_word(dtype)
    report, bits = wire.report_words(len(OWNERS)) * word, word
    gen = torch.Generator().manual_seed(3)
    rows = [torch.cat([torch.randn(PIECE, generator=gen).to(dtype),
                       wire.to_values(torch.randint(-2**62, 2**62, (report // word + 1,),
                                                    generator=gen), dtype)])
            for _ in OWNERS]
    k = Kept(mine=torch.zeros(len(OWNERS), PIECE, dtype=dtype), received=torch.cat(rows),
             piece=PIECE, report=report, owners=OWNERS, senders=OWNERS,
             weights=torch.ones(3), copies=torch.empty(0, PIECE), parameters=(), bits=bits)
    words = k.reports()
    for i, owner in enumerate(OWNERS):
        assert digest([words[i]]) == digest([k.report_of(owner)])
        assert digest([words[i]], key=5) == digest([k.report_of(owner)], key=5)
    assert len({digest([words[i]]) for i in range(len(OWNERS))}) == len(OWNERS)


def test_only_the_other_owners_audit() -> None:
    # The verdict counts the other owners' results (verdict.audited): the audited owner
    # and a rank owning no slice (a quarantined member of a fixed cohort) skip the work.
    assert voting(1, 0, (0, 1, 2)) and voting(1, 2, (0, 1, 2))
    assert not voting(1, 1, (0, 1, 2))
    assert not voting(1, 3, (0, 1, 2))
    wrong = AuditResult(1, 5, Outcome.WRONG, 1.0)
    for own in (None, AuditResult(1, 5, Outcome.AGREED)):  # its word would not count
        reports = Reports(finite=[[1.0] * 3] * 3, distance=[[0.0] * 3] * 3, owns=[1.0] * 3,
                          fingerprint=[1] * 3, audit=[wrong, own, wrong])
        found = audited(reports, [0, 1, 2], [0, 1, 2])
        assert [(f.kind, f.rank) for f in found] == [(WRONG_AGGREGATE, 1)]
