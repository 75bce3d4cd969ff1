"""``TrustPart``: the step transaction's trust part (``docs/trust.md``).

After each committed step every rank all-gathers one small report (its parameters'
fingerprint; as a slice owner, each sender's distance to the aggregates and whether
its copies were finite), then:

1. **audit**: one owner, picked from a hash of the reports (so after the fact), has
   its slices recomputed by every rank from an all-gather of every rank's copy; an
   aggregate that differs is evidence against the owner;
2. **verdict**: the pure rules of ``verdict.py`` turn the reports into evidence, and
   evidence into strikes and quarantine (the same on every honest rank);
3. **repair**: a replica whose fingerprint differs from the majority's gets the
   majority's parameters and buffers (a broadcast from the lowest such rank);
4. **quarantine**: a member with enough strikes is out. On an elastic cohort the
   transaction removes it at this step's boundary (``removals()``) and its seat is
   banned on the store, so the restarted worker is refused; on a fixed cohort it stays
   in the group (nothing can leave one) but owns no slice and its copies never count.

Every quarantine and repair is logged with its evidence and kept in ``events``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from potluck.cohort import Cohort
from potluck.collectives import allgather_tensor, broadcast_coalesced
from potluck.errors import PeerLostError
from potluck.trust.config import Trust
from potluck.trust.exchange import Ledger, RobustExchange, recompute
from potluck.trust.fingerprint import fingerprint
from potluck.trust.verdict import (
    DIVERGED,
    WRONG_AGGREGATE,
    Evidence,
    Reports,
    Strikes,
    judge,
    majority_fingerprint,
)

log = logging.getLogger(__name__)

_AUDIT_TOLERANCE = 1e-5  # relative: the same code on the same inputs, maybe other threads


class TrustPart:
    """Build with ``prepare(trust=Trust(...))``; ``exchange`` is the reducer's hook."""

    name = "trust"

    def __init__(self, config: Trust, cohort: Cohort, module: torch.nn.Module,
                 samples: Callable[[], Sequence[int] | None]) -> None:
        self.config = config
        self._cohort, self._module, self._samples = cohort, module, samples
        self.ledger = Ledger()
        self.strikes = Strikes(config.rules)
        self.events: list[dict[str, Any]] = []  # quarantines and repairs, with evidence
        self.exchange = RobustExchange(config.aggregator, self.ledger, samples, self.trusted)
        self._removals: list[tuple[str, str]] = []  # (member, why) for this boundary

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

    def on_commit(self, steps: int) -> None:
        cohort = self._cohort
        group = cohort.group
        n = group.size()
        if n == 1:
            return
        trusted = self.trusted(n)
        every = self.config.fingerprint_every
        fp = fingerprint(self._tensors()) if every and steps % every == 0 else 0
        fresh = self.ledger.world_size == n and bool(self.ledger.buckets)
        row = [float(fp >> 32), float(fp & 0xFFFFFFFF), float(self.ledger.owned if fresh else 0)]
        row += self.ledger.finite if fresh else [1.0] * n
        row += self.ledger.distance if fresh else [0.0] * n
        try:
            rows = allgather_tensor(torch.tensor(row, dtype=torch.float64,
                                                 device=cohort.device), group)
            table = [r.tolist() for r in rows]
            reports = Reports(finite=[t[3:3 + n] for t in table],
                              distance=[t[3 + n:3 + 2 * n] for t in table],
                              owns=[t[2] for t in table],
                              fingerprint=[(int(t[0]) << 32) | int(t[1]) for t in table])
            found = judge(reports, self._split(n), trusted, self.config.rules)
            if self.config.audit and fresh:
                found += self._audit(table, trusted, steps)
            self._repair(reports, trusted, found, steps)
        except PeerLostError:
            if not cohort.elastic:
                raise
            cohort.mark_step_failed()  # the next step recovers; this step's verdict is void
            return
        finally:
            self.ledger.reset(0)  # a step with no synced backward reports nothing stale
        self._record(found, steps)

    def on_membership(self, rank: int, world_size: int) -> None:
        """A new generation: ranks were renumbered; strikes are kept by member id."""
        self.ledger.reset(0)

    def state_dict(self) -> dict[str, Any]:
        return {"strikes": self.strikes.state_dict(), "events": self.events[-100:]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.strikes.load_state_dict(state.get("strikes", {}))
        self.events = list(state.get("events", []))

    # ----------------------------------------------------------------- the work

    def _audit(self, table: list[list[float]], trusted: list[int],
               steps: int) -> list[tuple[int, str, str]]:
        kept = [self.ledger.buckets[b] for b in sorted(self.ledger.buckets)]
        owners = kept[0].owners
        digest = hashlib.sha256(json.dumps([steps, table]).encode()).digest()
        owner = owners[int.from_bytes(digest[:8], "big") % len(owners)]
        pieces = [k.mine[k.owners.index(owner) * k.piece:(k.owners.index(owner) + 1) * k.piece]
                  for k in kept]
        gathered = allgather_tensor(torch.cat(pieces), self._cohort.group)
        per_bucket: list[list[torch.Tensor]] = []
        start = 0
        for k in kept:
            per_bucket.append([gathered[i][start:start + k.piece] for i in k.senders])
            start += k.piece
        worst = recompute(kept, owner, per_bucket, self.config.aggregator)
        if worst <= _AUDIT_TOLERANCE:
            return []
        return [(owner, WRONG_AGGREGATE, f"the aggregate of the slices it owns differs from "
                                         f"every rank's recomputation by {worst:.3g} "
                                         "(relative)")]

    def _repair(self, reports: Reports, trusted: list[int],
                found: list[tuple[int, str, str]], steps: int) -> None:
        bad = [i for i, kind, _ in found if kind == DIVERGED]
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

    def _record(self, found: list[tuple[int, str, str]], steps: int) -> None:
        members = self._cohort.membership.members
        for rank, kind, detail in found:
            evidence = Evidence(members[rank], rank, steps, kind, detail)
            if not self.strikes.add(evidence):
                continue
            why = "; ".join(f"step {e.step}: {e.kind} ({e.detail})"
                            for e in self.strikes.quarantined[evidence.member])
            event = {"event": "quarantine", "step": steps, "member": evidence.member,
                     "rank": rank, "evidence": [e.as_dict() for e in
                                                self.strikes.quarantined[evidence.member]]}
            self.events.append(event)
            self._removals.append((evidence.member, why))
            log.warning("[rank %d] trust: quarantined %s (rank %d) after step %d: %s",
                        self._cohort.rank, evidence.member, rank, steps, why)

    def _split(self, n: int) -> list[int]:
        split = self._samples()
        return [int(split[r]) if split is not None and r < len(split) else 1 for r in range(n)]

    def _tensors(self) -> list[torch.Tensor]:
        module = self._module
        return [p.data for p in module.parameters()] + [b for b in module.buffers()]
