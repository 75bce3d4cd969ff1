"""``TrustPart``: the step transaction's trust part (``docs/trust.md``).

The exchange (``exchange.py``) brings every rank, inside the step's own all-to-alls,
each owner's report on the copies it aggregated and every sender's fingerprint. After
each committed step every rank then, with no collective on a clean step:

1. **verdict**: the pure rules of ``verdict.py`` turn the reports into evidence, and
   evidence into strikes and quarantine (the same on every honest rank);
2. **audit**: if the previous step planned one, check the copies this step carried
   against the digests the audited owner reported and recompute its aggregate from
   them (``audit.py``); the result rides in the next step's reports, and the verdict
   goes by the other owners' majority. Then a hash of this step's reports decides
   whether the next step carries an audit, and of whom (so no owner knows in advance);
3. **repair**: a replica whose fingerprint differs from the majority's gets the
   majority's parameters and buffers (a broadcast from the lowest such rank);
4. **quarantine**: a member with enough strikes is out. On an elastic cohort the
   transaction removes it at this step's boundary (``removals()``) and its seat is
   banned on the store, so the restarted worker is refused; on a fixed cohort it stays
   in the group (nothing can leave one) but owns no slice and its copies never count.

Every quarantine and repair is logged with its evidence and kept in ``events``.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from potluck.cohort import Cohort
from potluck.collectives import broadcast_coalesced
from potluck.compress import Bounded
from potluck.errors import ConfigError, PeerLostError
from potluck.events import note
from potluck.trust import wire
from potluck.trust.audit import AuditPlan, digest, outcome, voting
from potluck.trust.config import Trust
from potluck.trust.exchange import Kept, Ledger, RobustExchange, assigned
from potluck.trust.fingerprint import Fingerprints, keyed_digest
from potluck.trust.lanes import Coded, lanes_for
from potluck.trust.spot import (
    buffer_copy,
    in_slices,
    recompute_gradient,
    relative,
    slice_error,
    snapshot,
)
from potluck.trust.spot_coded import SentBefore
from potluck.trust.verdict import (
    FAR,
    AuditResult,
    Evidence,
    Finding,
    Handed,
    Outcome,
    Reports,
    SpotResult,
    Strikes,
    diverged,
    handed_out,
    judge,
    majority_fingerprint,
    unreproducible,
)
from potluck.trust.wire import decode_reports

if TYPE_CHECKING:
    from potluck.compress import Codec

log = logging.getLogger(__name__)


class TrustPart(metaclass=abc.ABCMeta):  # noqa: B024 (no abstract method: a virtual base)
    """Build with ``prepare(trust=Trust(...))``; ``exchange`` is the reducer's hook.
    (An ABC only so that trust's part under rounds, ``round_part.RoundTrustPart``, is
    found by ``opt.part(TrustPart)`` too.)"""

    name = "trust"

    def __init__(self, config: Trust, cohort: Cohort, module: torch.nn.Module,
                 samples: Callable[[], Sequence[float] | None],
                 part_of: Callable[[int], Any] | None = None,
                 synced: Callable[[], object] | None = None, *,
                 codec: Codec | None = None, error_feedback: bool = True) -> None:
        """``samples()``: the step's split; ``part_of(rank)``: that rank's batch of the
        step (the loader's, for spot checks); ``synced()``: the reducer's last synced
        pass (a new object each pass), to tell a step whose hook was not trust's;
        ``codec``: the copies travel encoded, each sender's error feedback its own
        (``lanes.py``; ``prepare(comm_hook=CompressedSum(codec))``)."""
        _check_dtypes(module)
        if config.spot_check is not None:
            _refuse_dropout(module)
        lanes = lanes_for(codec, error_feedback)
        # through a codec a spot check allows each copy its rounding (``spot_coded.py``)
        self._sent: SentBefore | None = None
        if isinstance(lanes, Coded) and config.spot_check is not None:
            if not isinstance(lanes.codec, Bounded):
                raise ConfigError(SPOT_WITH_CODEC.format(codec=lanes.codec.name))
            self._sent = SentBefore(lanes)
        if cohort.world_size < 3:
            log.warning("[rank %d] trust=Trust(...) with %d worker(s): robust aggregation "
                        "needs at least 3 (an honest majority) to tell a bad gradient from "
                        "a good one; with fewer it protects nothing", cohort.rank,
                        cohort.world_size)
        self.config = config
        self._cohort, self._module, self._samples = cohort, module, samples
        self._part_of, self._synced = part_of, synced
        self._last_pass: object = None  # the synced pass the last commit judged
        self._names = {id(p): name for name, p in module.named_parameters()}
        # the step's parameters, copied before the update on a step this rank spot-checks
        # (``before_update``) and dropped once the check is done
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._buffers: dict[str, torch.Tensor] = {}  # at the step's first bucket
        self._picked: tuple[object, int, list[torch.Tensor], tuple[int, int, int]] | None = None
        self._prints = Fingerprints()
        self.ledger = Ledger()
        self.strikes = Strikes(config.rules)
        self.events: list[dict[str, Any]] = []  # quarantines and repairs, with evidence
        self.exchange = RobustExchange(config.aggregator, self.ledger, samples, self.trusted,
                                       self._fingerprint, lanes)
        self._removals: list[tuple[str, str]] = []  # (member, why) for this boundary
        self._steps = 0  # committed steps: the exchange's step is the next one
        # members handed other aggregates since the fingerprints were last compared
        # (by member id: a new generation renumbers the ranks, and a replica that
        # diverged before it still differs after it)
        self._excused: set[str] = set()

    # --------------------------------------------------------------- who counts

    def trusted(self, world_size: int) -> list[int]:
        """Ranks whose copies and reports count (not quarantined)."""
        members = self._cohort.membership.members
        return [r for r in range(world_size)
                if r >= len(members) or members[r] not in self.strikes.quarantined]

    @property
    def quarantined(self) -> dict[str, list[Evidence]]:
        return self.strikes.quarantined

    def removals(self) -> list[tuple[str, str]]:
        """Members quarantined in the last step, with why: the transaction removes them
        at this boundary (elastic cohorts). Taken once."""
        taken, self._removals = self._removals, []
        return taken

    # ----------------------------------------------------------- the step part

    def before_update(self, steps: int) -> None:
        """After the step's synchronized backward, before the optimizer applies it: if
        the step's reports pick a spot check this rank takes part in, copy the
        parameters the gradients were computed on (the check runs in ``on_commit``,
        after the update). On every other step nothing is copied, and no copy is kept
        between steps. Without spot checks this does nothing."""
        self._snapshot, self._picked = None, None
        if self.config.spot_check is None or self._part_of is None:
            return
        kept = self._this_step(self._cohort.group.size())
        if kept is None:
            return  # (no synchronized backward of trust's this step: on_commit says why)
        words, pick = self._words_and_pick(kept, steps)
        self._picked = (self._synced() if self._synced is not None else None, steps, words,
                        pick)
        if self._spot_target(kept, pick) is not None:
            self._snapshot = snapshot(self._module, self._buffers)

    def on_commit(self, steps: int) -> None:
        self._steps = steps
        self.exchange.committed()
        cohort, ledger = self._cohort, self.ledger
        n = cohort.group.size()
        passed = self._synced() if self._synced is not None else None
        fresh, self._last_pass = passed is not self._last_pass, passed
        kept = self._this_step(n)
        if kept is None:
            if n > 1 and fresh and passed is not None:
                raise ConfigError(
                    f"trust's exchange did not see step {steps}'s gradients, though its "
                    "backward was synchronized: the model's communication hook was replaced "
                    "after prepare(trust=...) (register_comm_hook), so the step was averaged "
                    "without trust; drop that register_comm_hook call (trust aggregates "
                    "with its own hook, which is why prepare refuses comm_hook= with trust)")
            self.exchange.forget()  # no synced backward: nothing to judge or carry
            ledger.reset(0)
            return
        trusted = self.trusted(n)
        found: list[Finding] = []
        picked, self._picked = self._picked, None
        try:
            if picked is not None and picked[0] is passed and picked[1] == steps:
                words, pick = picked[2], picked[3]  # (before_update's, of these buckets)
            else:
                words, pick = self._words_and_pick(kept, steps)
                target = self._spot_target(kept, pick)
                if target is not None:  # (prepare's transaction always calls it)
                    log.warning("[rank %d] trust: step %d picked a spot check of rank %d, "
                                "but before_update() did not run for this step, so the "
                                "parameters it was computed on were not kept: not checked",
                                cohort.rank, steps, target)
            reports = decode_reports([(k.owners, k.senders, w)
                                      for k, w in zip(kept, words, strict=True)], n)
            self._refuse_spot_loss(reports, kept[0].owners, steps)
            members = cohort.membership.members
            handed = handed_out(reports, trusted, [r for r in trusted if reports.owns[r] > 0])
            excused = {members.index(m) for m in self._excused if m in members} | handed[1]
            found = judge(reports, assigned(self._samples(), range(n)), trusted,
                          self.config.rules, excused, handed)
            every = self.config.fingerprint_every  # (this rank's schedule, not the reports')
            compared = bool(every) and steps % every == 0
            self._excused = set() if compared else {members[i] for i in excused}
            self.exchange.report_audit(self._audit(ledger.audit, reports.received, reports.key))
            # (what this rank handed itself is compared with nothing: verdict.handed_out)
            others = [o for o in kept[0].owners if o != cohort.rank]
            self.exchange.report_handed(Handed(  # keyed after the fact: no owner knew it
                pick[2] or 1,
                {owner: keyed_digest([k.row_of(owner) for k in kept], pick[2])
                 for owner in others},
                {owner: digest([w[k.owners.index(owner)]  # (the bytes of report_of)
                                for k, w in zip(kept, words, strict=True)])
                 for owner in others}))
            self.exchange.plan_audit(self._next_audit(kept, steps, pick))
            self.exchange.report_spot(self._spot_check(kept, pick))
            if self._sent is not None:
                self._sent.keep(kept)  # (after the check: it reads the step before)
            self._repair(reports, trusted, steps)
        except PeerLostError:
            if not cohort.elastic:
                raise
            cohort.mark_step_failed()  # the next step recovers; this step's verdict is void
            return
        finally:
            ledger.reset(0)  # a step with no synced backward reports nothing stale
            self._snapshot = None  # (the check is done: no copy of the model is kept)
        members = cohort.membership.members  # (a voided step above records nothing)
        self.strikes.observe_far(steps, [members[i] for i in trusted],
                                 {members[f.rank] for f in found if f.kind == FAR})
        self._record(found, steps)

    def on_membership(self, rank: int, world_size: int) -> None:
        """A new generation: ranks were renumbered; strikes are kept by member id."""
        self.ledger.reset(0)
        self.exchange.forget()
        self._snapshot, self._picked, self._buffers = None, None, {}
        if self._sent is not None:
            self._sent.forget()

    def state_dict(self) -> dict[str, Any]:
        return {"strikes": self.strikes.state_dict(), "events": self.events[-100:],
                "steps": self._steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.strikes.load_state_dict(state.get("strikes", {}))
        self.events = list(state.get("events", []))
        self._steps = int(state.get("steps", 0))  # a joiner fingerprints when the others do
        if not self._cohort.elastic:  # a fixed job resumed (a restart): they stay out
            for member, evidence in self.strikes.quarantined.items():
                note("quarantine", f"{member}: still quarantined (resumed with the step "
                                   f"{evidence[-1].step} verdict: {evidence[-1].kind})",
                     step=self._steps, member=member)

    # ----------------------------------------------------------------- the work

    def _this_step(self, n: int) -> list[Kept] | None:
        """This step's buckets as the exchange kept them, in order; None when trust's
        hook saw no synchronized backward this step (or the cohort is one rank)."""
        ledger = self.ledger
        if n == 1 or not (ledger.world_size == n and ledger.buckets):
            return None
        return [ledger.buckets[b] for b in sorted(ledger.buckets)]

    def _words_and_pick(self, kept: list[Kept], steps: int
                        ) -> tuple[list[torch.Tensor], tuple[int, int, int]]:
        """Each bucket's report words on the host (each owner's report, per bucket) and
        the step's pick from them (``_pick``)."""
        words = [k.reports().cpu() for k in kept]
        return words, self._pick(words, steps)

    def _audit(self, plan: AuditPlan | None, received: Sequence[Sequence[int]],
               keys: Sequence[int]) -> AuditResult | None:
        """This rank's audit of the copies this step carried (``audit.py``), reported
        in the next step: the verdict goes by the other owners' majority, so the audited
        owner and a rank that owns no slice (``verdict.audited`` counts neither) skip
        the recomputation."""
        if plan is None or not voting(plan.owner, self._cohort.rank, plan.owners):
            return None
        result = outcome(plan, self.ledger.buckets, received[plan.owner],
                         self.config.aggregator, keys[plan.owner] if plan.owner < len(keys)
                         else 0)
        if result is not None and result.outcome is Outcome.VOID:
            log.warning("[rank %d] trust: the audit of step %d is void: the owners carried "
                        "copies for different audits, so the reports of that step differed "
                        "between ranks (an owner told ranks different things)",
                        self._cohort.rank, plan.step)
        return result

    @staticmethod
    def _pick(words: list[torch.Tensor], steps: int) -> tuple[int, int, int]:
        """Three numbers from a hash of this step's reports (``words``: each bucket's
        ``Kept.reports()`` on the host), which every honest rank holds alike and no rank
        knew when it sent its copies or aggregates: what to audit and spot-check, and
        the key of the handed-out aggregates' digests (and of the audit's digests of the
        copies)."""
        digest = hashlib.sha256(str(steps).encode())
        for block in words:
            digest.update(block.numpy().tobytes())
        raw = digest.digest()
        return (int.from_bytes(raw[:8], "big"), int.from_bytes(raw[8:16], "big"),
                int.from_bytes(raw[16:24], "big", signed=True))  # (rides as a word)

    def _next_audit(self, kept: list[Kept], steps: int,
                    picks: tuple[int, int, int]) -> AuditPlan | None:
        """Whether the next step carries an audit, and of whom."""
        every, pick = self.config.audit_every, picks[0]
        if not every or pick % every:
            return None
        owners = kept[0].owners
        return AuditPlan.of(owners[(pick // every) % len(owners)], steps,
                            dict(self.ledger.buckets), self._cohort.rank,
                            key=picks[2] or 1)  # (the key its Handed reports)

    def _spot_target(self, kept: list[Kept], picks: tuple[int, int, int]) -> int | None:
        """The rank whose gradient this rank recomputes after this step, if the hash
        picked a spot check and this rank is one of its checkers (every owner but the
        target)."""
        spot, pick = self.config.spot_check, picks[1]
        if spot is None or pick % spot.every:
            return None
        owners, me = kept[0].owners, self._cohort.rank
        target = owners[(pick // spot.every) % len(owners)]
        return None if me not in owners or me == target else target

    def _spot_check(self, kept: list[Kept], picks: tuple[int, int, int]) -> SpotResult | None:
        """If the hash picked a target, recompute its gradient from the parameters
        ``before_update`` copied and compare this owner's slices of its copy (every
        other owner does the same)."""
        spot, target = self.config.spot_check, self._spot_target(kept, picks)
        if spot is None or target is None or self._snapshot is None or self._part_of is None:
            return None
        me = self._cohort.rank
        batch = self._part_of(target)
        grads = recompute_gradient(self._module, self._snapshot, spot.loss, batch,
                                   wanted=self._in_slices(kept, me))
        difference = self._difference(kept, grads, target, me)
        if math.isnan(difference):
            log.debug("[rank %d] trust: no spot check of rank %d: through the codec its "
                      "copy's allowance needs the last step's copies, which this "
                      "generation has not seen", me, target)
            return None
        off = not difference <= spot.tolerance
        if off:  # the whole gradient before an accusation (a mismatch's cost only)
            grads = recompute_gradient(self._module, self._snapshot, spot.loss, batch)
            difference = self._difference(kept, grads, target, me)
            off = not difference <= spot.tolerance
        log.debug("[rank %d] trust: spot check of rank %d: %.3g", me, target, difference)
        if off and not self._reproduces_own(kept) <= spot.tolerance:
            log.warning("[rank %d] trust: the spot check of rank %d found its copy off by "
                        "%.3g, but the loss does not recompute this rank's own gradient "
                        "either: no accusation", me, target, difference)
            return SpotResult(target, difference, False, unreproducible=True)
        return SpotResult(target, difference, off)

    def _difference(self, kept: list[Kept], grads: dict[str, torch.Tensor], target: int,
                    me: int) -> float:
        """The relative difference between ``grads`` and ``target``'s copy on this
        owner's slices (NaN: through a codec, the last step's copies are unknown)."""
        parts = []
        for index, k in enumerate(kept):
            if target not in k.senders or me not in k.owners:
                continue
            start = k.owners.index(me) * k.piece
            if self._sent is None:
                flat = self._flat(grads, k).to(k.copies.dtype)
                parts.append(slice_error(flat, k.copies[k.senders.index(target)], start))
                continue
            coded = self._sent.copy_of(index, k, target)
            if coded is None:
                return math.nan
            parts.append(slice_error(self._flat(grads, k), *coded[:1], start, coded[1]))
        return relative(parts)

    def _reproduces_own(self, kept: list[Kept]) -> float:
        """This owner found a target's copy off: can it recompute its own gradient, the
        copy it sent? The relative difference (over the tolerance: the loss, a dropout
        mask drawn again, another reduction, or this machine is at fault, not the
        target, and every honest rank would be accused in turn)."""
        spot, me = self.config.spot_check, self._cohort.rank
        assert spot is not None and self._snapshot is not None and self._part_of is not None
        grads = recompute_gradient(self._module, self._snapshot, spot.loss, self._part_of(me))
        parts = []
        for index, k in enumerate(kept):
            if me not in k.senders:
                continue
            if self._sent is None:
                flat = self._flat(grads, k).to(k.mine.dtype)
                parts.append(slice_error(flat, k.mine.reshape(-1)[:flat.numel()], 0))
                continue
            coded = self._sent.mine(index, k)
            if coded is None:
                return math.nan
            flat = self._flat(grads, k)
            parts.append(slice_error(flat, coded[0][:flat.numel()], 0, coded[1]))
        return relative(parts)

    def _in_slices(self, kept: list[Kept], me: int) -> set[str]:
        """The names of the parameters with a value in one of ``me``'s slices (a spot
        check compares only those)."""
        return {self._names[id(p)] for p in in_slices(
            [(k.owners, k.piece, k.parameters) for k in kept], me)}

    def _flat(self, grads: dict[str, torch.Tensor], kept: Kept) -> torch.Tensor:
        """A recomputed gradient (by parameter name) laid out as bucket ``kept`` is."""
        return torch.cat([grads[self._names[id(p)]].reshape(-1) for p in kept.parameters])

    def _refuse_spot_loss(self, reports: Reports, owners: Sequence[int], steps: int) -> None:
        """Most owners that spot-checked could not recompute their own gradients: the
        same reports on every rank, so every rank raises here, in the same step."""
        said = unreproducible(reports, owners)
        if not said:
            return
        spot = self.config.spot_check
        loss = _name(spot.loss) if spot is not None else "?"
        raise ConfigError(
            f"SpotCheck(loss={loss}) does not recompute the owners' own gradients: "
            f"{len(said)} owner(s) (ranks {said}) found a target's copy of step {steps - 1} "
            "off and then their own too, so spot checks would accuse honest ranks. The "
            "loss must be the one the loop calls backward() on (same reduction, the mean "
            "over the rank's batch) and deterministic given the parameters and the batch: "
            "no dropout (or a fixed seed inside the loss), no other randomness; or drop "
            "spot_check=")

    def _fingerprint(self) -> int:
        """At the step's first bucket (before the update): the replica's fingerprint
        (0: not compared this step). With spot checks, also a copy of the buffers as this
        rank's forward left them (the pass's end broadcasts rank 0's over them; a spot
        check's snapshot takes them from here, its parameters before the update)."""
        if self.config.spot_check is not None:
            self._buffers = buffer_copy(self._module)
        every = self.config.fingerprint_every
        if not every or (self._steps + 1) % every:
            return 0
        # Parameters only: in backward each rank's buffers (BatchNorm statistics) still
        # hold its own forward's values; rank 0's are broadcast after the pass.
        return self._prints(list(self._module.parameters()))  # (no .data: a tensor each)

    def _repair(self, reports: Reports, trusted: list[int], steps: int) -> None:
        """Every diverged replica, also one that is not struck for it (an owner handed
        it other aggregates: ``verdict.handed_out``)."""
        bad = diverged(reports.fingerprint, trusted)
        if not bad:
            return
        majority = majority_fingerprint(reports.fingerprint, trusted)
        source = next(i for i in trusted if reports.fingerprint[i] == majority)
        broadcast_coalesced(self._tensors(), self._cohort.group, src=source)
        members = self._cohort.membership.members
        event = {"event": "repair", "step": steps, "members": [members[i] for i in bad],
                 "from": members[source], "majority": f"{majority:#x}"}
        self.events.append(event)
        log.warning("[rank %d] trust: after step %d the replica of %s diverged from the "
                    "majority; repaired from %s", self._cohort.rank, steps, event["members"],
                    event["from"])
        for i in bad:
            note("repair", f"rank {i} ({members[i]}): its replica diverged from the "
                           f"majority; repaired from rank {source}", step=steps,
                 member=members[i])

    def _record(self, found: list[Finding], steps: int) -> None:
        record(self.strikes, found, steps, self._cohort.membership.members, self.events,
               self._removals, self._cohort.rank)

    def _tensors(self) -> list[torch.Tensor]:
        module = self._module
        return [p.data for p in module.parameters()] + [b for b in module.buffers()]


def record(strikes: Strikes, found: Sequence[Finding], steps: int, members: Sequence[str],
           events: list[dict[str, Any]], removals: list[tuple[str, str]], me: int) -> None:
    """Each finding recorded as a strike; a member it quarantines goes to ``events``
    (with its evidence) and ``removals``, and both are noted and logged."""
    for rank, kind, detail, party, _ in found:
        evidence = Evidence(members[rank], rank, steps, kind, detail,
                            members[party] if party >= 0 else "")
        if not strikes.add(evidence):
            if evidence.member not in strikes.quarantined:
                note("strike", f"rank {rank} ({evidence.member}): {kind} ({detail})",
                     step=steps, member=evidence.member)
            continue
        why = "; ".join(f"step {e.step}: {e.kind} ({e.detail})"
                        for e in strikes.quarantined[evidence.member])
        event = {"event": "quarantine", "step": steps, "member": evidence.member,
                 "rank": rank, "evidence": [e.as_dict() for e in
                                            strikes.quarantined[evidence.member]]}
        events.append(event)
        note("quarantine", f"rank {rank} ({evidence.member}): {why}", step=steps,
             member=evidence.member)
        removals.append((evidence.member, why))
        log.warning("[rank %d] trust: quarantined %s (rank %d) after step %d: %s",
                    me, evidence.member, rank, steps, why)


DROPOUTS = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
            torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)


def _refuse_dropout(module: torch.nn.Module) -> None:
    """Every step, a spot check recomputes a rank's gradient elsewhere, under a random
    state of the checker's own: a dropout layer would draw other masks, and the check
    would refuse the loss at its first pick (``_refuse_spot_loss``). Said here, before
    the first step, with the layer's name."""
    for name, layer in module.named_modules():
        if isinstance(layer, DROPOUTS) and layer.p > 0 and layer.training:
            raise ConfigError(
                f"trust=Trust(spot_check=...) every step with dropout in the model: layer "
                f"'{name or 'the model'}' is {type(layer).__name__}(p={layer.p}). A spot "
                "check recomputes a rank's gradient on another rank, which cannot draw the "
                "same masks, so every check would find honest ranks off. Set the dropout "
                "to 0 (or the layer to eval mode) for spot checks, or drop spot_check= "
                "(robust aggregation, audits and the other checks stay). Under rounds "
                "(sync=DiLoCo(...)) the spot re-run carries the member's random states and "
                "takes dropout.")


SPOT_WITH_CODEC = (
    "trust=Trust(spot_check=...) with comm_hook=CompressedSum({codec}): a spot check "
    "allows a copy the codec's rounding, but {codec} bounds no value's rounding (a value "
    "it drops may be any size), so an honest copy could not be told from a wrong one; "
    "use a codec that rounds each value (Int8Blockwise, Int4Blockwise, Fp16, Bf16), or "
    "drop spot_check= (robust aggregation, audits and the other checks stay)")


def _name(loss: Callable[..., Any]) -> str:
    return getattr(loss, "__qualname__", type(loss).__name__)


def _check_dtypes(module: torch.nn.Module) -> None:
    """Refuse, at ``prepare``, a gradient dtype trust cannot handle: a complex one (the
    aggregation is over real values) or one whose values do not divide trust's 64-bit
    words (``wire.per_word``)."""
    for name, param in module.named_parameters():
        if param.requires_grad and (not param.is_floating_point()
                                    or wire.WORD % param.element_size()):
            raise ConfigError(
                f"trust=Trust(...): parameter {name!r} is {param.dtype} "
                f"({param.element_size()} bytes a value), but trust aggregates real "
                f"gradients and its reports ride on the buckets as {wire.WORD}-byte words, "
                "which the values must divide; train that parameter in float32, float16, "
                "bfloat16 or float64, or drop trust=")
