"""``RoundTrustPart``: trust's step part when replicas are reconciled once a round.

``prepare(sync=DiLoCo(...), trust=Trust())`` registers its ``RobustRoundSum`` as the
sync strategy's round sum (``DiLoCoSync.register_round_sum``), so the members'
pseudo-gradients are aggregated robustly inside the round's sync. After each committed
round, on every member alike:

1. **verdict**: the round's reports become evidence (``round_rules.judge_round``), and
   evidence becomes strikes and quarantine (``verdict.Strikes``, counted in rounds).
   With ``Trust(round_check=RoundCheck(loss))``, the work check (``round_check.py``,
   ``round_work.py``) adds its own, and settles each pair flagged as copies: only the
   member that did not do the work is struck (a pair not checked this round is noted
   without a strike and checked the next);
2. **agreement**: every ``Trust.fingerprint_every`` rounds the members compare a
   fingerprint of their global parameters (one small all-gather, or none on a round
   the work check measures: the fingerprints ride with its gains). A member whose
   fingerprint differs from the majority's is struck for it and repaired from the
   majority (a broadcast of the global parameters, the replica and its buffers);
3. **quarantine**: as every-step trust's (``part.py``): an elastic cohort removes the
   member at this boundary and bans its seat; a fixed cohort keeps it in the group, but
   it owns no slice and its copy gets weight 0. It sits out: the loader hands it two
   samples of each part of a round (``SIT_OUT``) and the others the rest, so the
   round's samples are still trained (two lost a part).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from potluck.cohort import Cohort
from potluck.collectives import broadcast_coalesced, settle
from potluck.compress import Traffic
from potluck.errors import ConfigError, PeerLostError
from potluck.events import note
from potluck.sync.config import DiLoCo
from potluck.sync.diloco import InnerWatch
from potluck.sync.round_sum import Piece, RoundSum
from potluck.trust.config import Trust
from potluck.trust.fingerprint import Fingerprints
from potluck.trust.part import TrustPart, record
from potluck.trust.round_check import ReadRange, WorkCheck
from potluck.trust.round_exchange import Keeper, RobustRoundSum, RoundReports
from potluck.trust.round_rules import gross, judge_round
from potluck.trust.round_spot import SpotRerun
from potluck.trust.round_work import SAYS, judge_work, settle_copies, work_scores
from potluck.trust.verdict import COPIED, DIVERGED, FAR, Evidence, Finding, Strikes, diverged

log = logging.getLogger(__name__)


class Rounds(Protocol):
    """What trust needs of the sync strategy (``potluck.sync.DiLoCoSync``)."""

    traffic: Traffic
    config: DiLoCo
    global_batch: int

    @property
    def fragments(self) -> int: ...

    def watch_inner_steps(self, watch: InnerWatch) -> None: ...

    @property
    def global_parameters(self) -> list[torch.Tensor]: ...

    @property
    def outer_state(self) -> list[torch.Tensor]: ...

    def register_round_sum(self, round_sum: RoundSum) -> None: ...


class RoundTrustPart:
    """Build with ``prepare(sync=DiLoCo(...), trust=Trust(...))``."""

    name = "trust"

    def __init__(self, config: Trust, cohort: Cohort, module: torch.nn.Module,
                 strategy: Rounds, *, codec: Any = None, error_feedback: bool = True,
                 assigned: Callable[[], Sequence[float] | None] | None = None,
                 read_range: ReadRange | None = None,
                 optimizer: torch.optim.Optimizer | None = None,
                 clip_grad_norm: float | None = None) -> None:
        """``read_range(runs)``: the batches of runs of a round's positions, as the loader
        reads them (the work check's and the spot re-run's; required with
        ``Trust(round_check=...)`` or ``Trust(spot_check=...)``); ``optimizer``,
        ``clip_grad_norm``: the inner optimizer and the guard's clip, which the spot
        re-run repeats (required with ``spot_check=``)."""
        if cohort.world_size < 3:
            log.warning("[rank %d] trust=Trust(...) with %d worker(s): robust aggregation "
                        "needs at least 3 (an honest majority) to tell a bad pseudo-gradient "
                        "from a good one; with fewer it protects nothing", cohort.rank,
                        cohort.world_size)
        self.config, self._cohort, self._module, self._strategy = config, cohort, module, strategy
        self.strikes = Strikes(config.rules, gross=True)
        self.events: list[dict[str, Any]] = []
        self._removals: list[tuple[str, str]] = []
        self._prints = Fingerprints()
        self.work = self._work_check(config, module, strategy, read_range)
        self.rerun = self._spot_rerun(config, module, strategy, read_range, optimizer,
                                      clip_grad_norm)
        keepers: list[Keeper] = [k.keep for k in (self.work, self.rerun) if k is not None]
        self.exchange = RobustRoundSum(config.aggregator, self.trusted, self._member,
                                       codec, error_feedback, assigned, strategy.traffic,
                                       _each(keepers) if keepers else None,
                                       self._wanted if self.work is not None else None)
        strategy.register_round_sum(self.exchange)
        if self.rerun is not None:
            strategy.watch_inner_steps(self.rerun)

    @staticmethod
    def _work_check(config: Trust, module: torch.nn.Module, strategy: Rounds,
                    read_range: ReadRange | None) -> WorkCheck | None:
        check = config.round_check
        if check is None:
            return None
        if strategy.fragments > 1:
            raise ConfigError(
                f"trust=Trust(round_check=...) with StreamingDiLoCo(fragments="
                f"{strategy.fragments}): the work check needs a round's start parameters, "
                "but fragments applied mid-round move them; use DiLoCo(...) (one fragment) "
                "or drop round_check=")
        if read_range is None:
            raise ConfigError("RoundTrustPart(round_check=...) needs read_range=, the "
                              "loader's reader of a round's positions (prepare passes it)")
        return WorkCheck(check, module, lambda: strategy.global_parameters, read_range)

    def _spot_rerun(self, config: Trust, module: torch.nn.Module, strategy: Rounds,
                    read_range: ReadRange | None, optimizer: torch.optim.Optimizer | None,
                    clip_grad_norm: float | None) -> SpotRerun | None:
        if config.spot_check is None:
            return None
        if read_range is None or optimizer is None:
            raise ConfigError("RoundTrustPart(spot_check=...) needs read_range= and "
                              "optimizer= (the loader's reader and the inner optimizer; "
                              "prepare passes them)")
        sync = strategy.config
        return SpotRerun(config.spot_check, module, optimizer, read_range,
                         global_batch=strategy.global_batch, fragments=sync.fragments,
                         own_start=sync.fragments > 1 and sync.mixing > 0,
                         counted=lambda: len(self.trusted(self._cohort.world_size)),
                         clip_grad_norm=clip_grad_norm)

    def trusted(self, world_size: int) -> list[int]:
        """Ranks whose copies count (not quarantined)."""
        members = self._cohort.membership.members
        return [r for r in range(world_size)
                if r >= len(members) or members[r] not in self.strikes.quarantined]

    @property
    def quarantined(self) -> dict[str, list[Evidence]]:
        return self.strikes.quarantined

    def removals(self) -> list[tuple[str, str]]:
        """Members quarantined after the last round, with why. Taken once."""
        taken, self._removals = self._removals, []
        return taken

    def _member(self, rank: int) -> str:
        members = self._cohort.membership.members
        return members[rank] if rank < len(members) else f"rank{rank}"

    # ----------------------------------------------------------- the step part

    def on_commit(self, steps: int) -> None:
        """A round committed (``steps``: rounds so far): judge it, compare replicas."""
        cohort = self._cohort
        n = cohort.group.size()
        taken = self.exchange.take()
        self.exchange.committed()  # (each sender's error feedback of the round stands)
        if n == 1:
            return
        found: list[Finding] = []
        if taken is not None:
            found = judge_round(taken.reports, taken.shares, taken.senders, self.config.rules)
            members = cohort.membership.members
            self.strikes.observe_far(steps, [members[i] for i in taken.senders],
                                     {members[f.rank] for f in found if f.kind == FAR},
                                     {members[r] for r in gross(found, self.config.rules)})
        every = self.config.fingerprint_every
        due = bool(every) and steps % every == 0
        try:
            prints = None
            if taken is not None and self.work is not None:
                found, prints = self._check_work(found, taken, steps,
                                                 self._print() if due else None)
            if taken is not None and self.rerun is not None:
                found += self.rerun.check(taken.round, taken.reports.numpy().tobytes(),
                                          taken.senders, cohort.group, cohort.device)
            if due:
                found += self._agree(steps, prints)
        except PeerLostError:
            if not cohort.elastic:
                raise
            cohort.mark_step_failed()  # the next round recovers; no verdict this one
            return
        record(self.strikes, found, steps, cohort.membership.members, self.events,
               self._removals, cohort.rank)

    def _targets(self, round_: int, senders: Sequence[int]) -> list[int]:
        """The work check's targets of a round: every sender each ``every`` rounds, and
        the members of pairs left unsettled last round. None where fewer than ``SAYS``
        send: the check can say nothing of them, and its forwards and copies would
        cost the round for nothing."""
        work, members = self.work, self._cohort.membership.members
        assert work is not None and work.config is not None
        if len(senders) < SAYS:
            return []
        every = round_ % work.config.every == 0
        return [r for r in senders
                if every or (r < len(members) and members[r] in work.forced)]

    def _wanted(self, piece: Piece, owners: tuple[int, ...]) -> tuple[int, ...]:
        """Whose whole pseudo-gradients the round sum hands the work check this round."""
        assert self.work is not None
        return tuple(self._targets(piece.round, owners)) if self.work.due(piece.round) else ()

    def _check_work(self, found: list[Finding], taken: RoundReports, steps: int,
                    fingerprint: int | None) -> tuple[list[Finding], list[int] | None]:
        """The work check of the round's targets (every member each ``every`` rounds,
        and the pairs left unsettled last round), in the senders' index space of the
        pure rule; pairs flagged as copies are settled by it. ``fingerprint``: this
        member's, sent with its gains; every member's comes back where they went."""
        work, cohort = self.work, self._cohort
        assert work is not None and work.config is not None
        senders = list(taken.senders)
        members, targets = cohort.membership.members, self._targets(taken.round, senders)
        work.forced = set()
        gains, prints = None, None
        pairs = sorted({(min(f.rank, f.party), max(f.rank, f.party)) for f in found
                        if f.kind == COPIED})
        paired: dict[tuple[int, int], list[float]] = {}
        if targets:
            digest = taken.reports.numpy().tobytes()
            measured = work.measure(taken.round, targets, digest, cohort.group, cohort.device,
                                    carry=fingerprint, pairs=pairs)
            if measured is not None:
                gains = [[row[r] for r in senders] for row in measured.gains]
                prints = measured.carried
                paired = _paired(work, pairs, measured.paired, members)
        else:
            work.forget()
        index = {r: i for i, r in enumerate(senders)}
        local = [f._replace(rank=index[f.rank], party=index.get(f.party, -1)) for f in found
                 if f.kind == COPIED]
        checked = [index[r] for r in targets] if gains is not None else []
        recent: dict[int, list[float]] = {}
        if gains is not None:
            scores = work_scores(gains, checked, taken.shares)
            kept = work.remember({members[senders[i]]: s for i, s in zip(checked, scores,
                                                                          strict=True)})
            recent = {i: kept[members[senders[i]]] for i in checked}
            local += judge_work(recent, work.config.tolerance)
        settled, unchecked = settle_copies(local, recent, work.config.tolerance,
                                           _by_index(paired, index))
        for a, b in unchecked:
            pair = [members[senders[a]], members[senders[b]]]
            work.forced |= set(pair)
            self.events.append({"event": "suspect", "step": steps, "members": pair,
                                "kind": COPIED})
            note("strike", f"{pair[0]} and {pair[1]} sent (nearly) the same pseudo-gradient; "
                           "no strike until the work check says which copied",
                 step=steps, member=pair[0])
        back = [f._replace(rank=senders[f.rank], party=senders[f.party] if f.party >= 0 else -1)
                for f in settled]
        return [f for f in found if f.kind != COPIED] + back, prints

    def _print(self) -> int:
        """The fingerprint of this member's global parameters."""
        return self._prints(self._strategy.global_parameters)

    def _agree(self, steps: int, values: list[int] | None = None) -> list[Finding]:
        """Every member's fingerprint of its global parameters (``values``: gathered
        already, with the work check's gains); a diverged one is repaired from the
        majority (and struck)."""
        group, n = self._cohort.group, self._cohort.group.size()
        device = self._cohort.device  # (NCCL talks in device tensors)
        if values is None:
            mine = torch.tensor([self._print()], dtype=torch.int64, device=device)
            prints = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
            settle(lambda: group.allgather([prints], [mine]), group,
                   "the replicas' fingerprints")
            values = [int(p.item()) for p in prints]
        trusted = self.trusted(n)
        bad = diverged(values, trusted)
        if not bad:
            return []
        source = next(i for i in trusted if i not in bad)
        module = self._module
        # (the outer optimizer's momentum too: without it a repaired replica steps
        # apart again in the next round)
        broadcast_coalesced([*self._strategy.global_parameters, *self._strategy.outer_state,
                             *(p.data for p in module.parameters()), *module.buffers()],
                            group, src=source)
        members = self._cohort.membership.members
        self.events.append({"event": "repair", "step": steps,
                            "members": [members[i] for i in bad], "from": members[source]})
        for i in bad:
            note("repair", f"rank {i} ({members[i]}): its global parameters diverged from "
                           f"the majority's; repaired from rank {source}", step=steps,
                 member=members[i])
        return [Finding(i, DIVERGED, f"global parameters' fingerprint {values[i]:#x} differs "
                                     "from the majority's") for i in bad]

    def on_membership(self, rank: int, world_size: int) -> None:
        """A new generation: ranks were renumbered; strikes are kept by member id."""
        self.exchange.forget()
        if self.work is not None:
            self.work.forget()
        if self.rerun is not None:
            self.rerun.forget()  # (the round under way stays: its sync may be retried)

    def state_dict(self) -> dict[str, Any]:
        return {"strikes": self.strikes.state_dict(), "events": self.events[-100:]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.strikes.load_state_dict(state.get("strikes", {}))
        self.events = list(state.get("events", []))
        if not self._cohort.elastic:  # a fixed job resumed (a restart): they stay out
            for member, evidence in self.strikes.quarantined.items():
                note("quarantine", f"{member}: still quarantined (resumed with the round "
                                   f"{evidence[-1].step} verdict: {evidence[-1].kind})",
                     member=member)


# Trust's step part, whatever the sync: ``opt.part(TrustPart)`` finds this one too (its
# ``events``, ``quarantined``, ``trusted`` and ``removals`` are the same).
TrustPart.register(RoundTrustPart)



def _paired(work: WorkCheck, pairs: Sequence[tuple[int, int]], scores: Sequence[float],
            members: Sequence[str]) -> dict[tuple[int, int], list[float]]:
    """Each copied pair's z-scores of its flagged rounds (``round_copy``), by ranks in
    the order of ``pairs``. The work check keeps them by member ids in sorted order (a
    new generation may renumber the ranks), the sign turned to match."""
    keyed: dict[tuple[str, str], float] = {}
    flips: dict[tuple[int, int], bool] = {}
    for (a, b), z in zip(pairs, scores, strict=True):
        flips[(a, b)] = members[a] > members[b]
        ids = (members[b], members[a]) if flips[(a, b)] else (members[a], members[b])
        keyed[ids] = -z if flips[(a, b)] else z
    kept = work.remember_pairs(keyed)
    out = {}
    for a, b in pairs:
        flip = flips[(a, b)]
        ids = (members[b], members[a]) if flip else (members[a], members[b])
        out[(a, b)] = [-z for z in kept[ids]] if flip else kept[ids]
    return out


def _each(keepers: Sequence[Keeper]) -> Keeper:
    """One keeper that calls each of ``keepers`` in turn."""
    if len(keepers) == 1:
        return keepers[0]

    def keep(piece: Piece, owners: tuple[int, ...], wanted: tuple[int, ...],
             copies: Sequence[torch.Tensor]) -> None:
        for each in keepers:
            each(piece, owners, wanted, copies)

    return keep


def _by_index(paired: Mapping[tuple[int, int], Sequence[float]],
              index: Mapping[int, int]) -> dict[tuple[int, int], list[float]]:
    """Each pair's z-scores (by ranks) keyed by the ranks' indexes among the senders,
    the lower first, as
    ``settle_copies`` reads them (a z-score's sign says which part ``d`` fits: it flips
    with the order)."""
    out: dict[tuple[int, int], list[float]] = {}
    for (a, b), scores in paired.items():
        i, j = index[a], index[b]
        out[(i, j) if i < j else (j, i)] = list(scores) if i < j else [-z for z in scores]
    return out
