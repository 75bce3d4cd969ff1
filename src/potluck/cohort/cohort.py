"""``Cohort``: this worker's membership in the job, generation by
generation.

One class serves every mode. A fixed job (``potluck run``, torchrun, SLURM, one plain
process) is the one-generation case: its membership comes from the launcher. An elastic
job (``potluck run --elastic``) agrees on each generation through the store rendezvous.
Either way the cohort builds each generation's group itself (Gloo, or NCCL on a GPU),
under that generation's own store prefix, and points its one ``GroupHandle`` at it:
the model, the reducer, the hooks and the optimizer hold that handle for life.

Nothing touches torch's global default group, so a script may also call
``torch.distributed.init_process_group`` on its own. Every collective the cohort runs
is bounded by ``timeout``; a lost peer becomes ``PeerLostError`` on every survivor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch._C._distributed_c10d import Store

from potluck.cohort.current import clear_current
from potluck.cohort.groups import GroupSpec, make_group, peers_built
from potluck.cohort.membership import MembershipSource
from potluck.collectives import settle
from potluck.env import WorkerEnv
from potluck.errors import RendezvousError
from potluck.group import GroupHandle, ProcessGroupLike
from potluck.rendezvous import Membership

log = logging.getLogger(__name__)


class Cohort:
    """The current generation: rank, world size, and ``group`` (a stable handle)."""

    def __init__(self, source: MembershipSource, store: Store, spec: GroupSpec,
                 group_prefix: Callable[[int], str], *, device: torch.device | None = None,
                 env: WorkerEnv | None = None) -> None:
        self.env = env or WorkerEnv()
        self.backend, self.timeout = spec.backend, spec.timeout
        self.device = device or torch.device("cpu")
        self.events: list[dict[str, Any]] = []  # membership changes, as this worker saw them
        self._source, self._store, self._spec, self._prefix = source, store, spec, group_prefix
        self._committed = -1  # the last generation this worker committed a step in
        self.membership: Membership = source.join()
        # Admitted into a running cohort (not a founder): it must receive the live state.
        self.joined_late = self.membership.generation > 0 and \
            source.worker_id in self.membership.joined
        # Only an elastic cohort announces abandoned steps; a fixed one's waits block.
        self.group = GroupHandle(self._built(), self.membership.generation,
                                 abandoned=source.step_failed if source.elastic else None)

    # ------------------------------------------------------------------- who am I

    @property
    def rank(self) -> int:
        return self.membership.rank

    @property
    def world_size(self) -> int:
        return self.membership.world_size

    @property
    def generation(self) -> int:
        return self.membership.generation

    @property
    def elastic(self) -> bool:
        """Whether the cohort survives a lost worker (and admits joiners)."""
        return self._source.elastic

    @property
    def worker_id(self) -> str:
        return self._source.worker_id

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def local_world_size(self) -> int:
        return self.env.local_world_size

    # ---------------------------------------------------------------- collectives

    def barrier(self) -> None:
        """Return once every rank got here; a lost peer raises ``PeerLostError``."""
        token = torch.zeros(1, device=self.device)
        settle(lambda: self.group.allreduce([token]), self.group, "barrier")

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` across ranks in place (bounded by the timeout) and return it."""
        settle(lambda: self.group.allreduce([tensor]), self.group, "all-reduce")
        return tensor

    # ----------------------------------------------------------------- membership

    def pending_joiners(self) -> bool:
        """Whether workers wait that the cohort would admit now: it has room below its
        wanted size (rank 0 asks; no I/O for a fixed job)."""
        return self._source.pending_joiners()

    def spares(self) -> int:
        """Workers waiting to be admitted, room or not (rank 0 asks)."""
        return self._source.spares()

    @property
    def store(self) -> Store:
        """The job's store, as this worker reaches it (a link probe uses it)."""
        return self._store

    def boundary(self) -> bool:
        """At a step boundary (every member calls it): admit joiners, drop leavers.
        True if the membership changed (the handle then points at the new group)."""
        started, before = time.monotonic(), self.generation
        self.membership = self._source.boundary()
        if self.generation == before:
            return False
        self._move(started, "boundary")  # joiners admitted or leavers let go
        return True

    def recover(self, reason: str) -> Membership:
        """Form the next generation after a failed collective; every survivor calls it.

        The broken group is torn down now (not at interpreter exit); a fixed job cannot
        go on and raises ``PeerLostError``."""
        started = time.monotonic()
        self.group.release(reason, abort=True)
        self.membership = self._source.next_generation(reason)
        self._move(started, reason)
        return self.membership

    def rejoin(self, reason: str) -> Membership:
        """A joiner whose live state did not arrive (a member was lost meanwhile): it
        abandons this generation (the members still waiting give up at once), leaves
        it, and waits in the join queue again under a new id. It holds nothing yet, so
        nothing is lost; a later boundary admits it."""
        started = time.monotonic()
        self.mark_step_failed()
        self.group.release(reason, abort=True)
        self.membership = self._source.rejoin()
        self._move(started, reason)
        return self.membership

    def committed(self) -> None:
        """A step (or round) committed in this generation: every member of it trained
        together, so it is the one a split cohort's quorum counts from."""
        if self._committed != self.generation:
            self._committed = self.generation
            self._source.committed()

    def mark_step_failed(self) -> None:
        """Tell the other members this generation's step failed here, so a member still
        waiting in a collective for data from this one gives up at once."""
        self._source.mark_step_failed(self.generation)

    def expel(self, worker_id: str, why: str) -> None:
        """Remove a quarantined member at this boundary and ban its seat (elastic: every
        member calls it, then ``boundary()``); a fixed cohort keeps it (see the source)."""
        self._source.expel(worker_id, why)

    def leave(self) -> None:
        """Announce a graceful departure; the others form the next generation at once."""
        self._source.announce_leave()

    def _move(self, started: float, cause: str) -> None:
        self.group.reconfigure(self._built(), self.generation)
        event: dict[str, Any] = {"generation": self.generation, "cause": cause,
                                 "left": list(self.membership.left),
                                 "joined": list(self.membership.joined),
                                 "world_size": self.world_size,
                                 "recovery_s": time.monotonic() - started}
        self.events.append(event)
        log.warning("[rank %d] generation %d: %s (left %s, joined %s) in %.2f s",
                    self.rank, self.generation, cause, event["left"], event["joined"],
                    event["recovery_s"])

    def _built(self) -> ProcessGroupLike:
        """The current generation's group. A member lost while it is built (Gloo waits
        for every peer, then gives up) fails the generation in an elastic cohort: the
        members form the next one and build again, and a joiner, which holds nothing
        yet, goes back to the join queue (a later boundary admits it)."""
        while True:
            try:
                return self._build(self.membership)
            except RendezvousError as exc:
                if not self._source.elastic:
                    raise
                log.warning("[rank %d] generation %d: its group was not built (%s); a "
                            "member was lost meanwhile", self.rank, self.generation, exc)
                self._source.mark_step_failed(self.generation)  # (those waiting give up)
                joiner = self.generation > 0 and self.worker_id in self.membership.joined
                self.membership = (self._source.rejoin() if joiner else
                                   self._source.next_generation("a member was lost while "
                                                                "the group was built"))

    def _build(self, membership: Membership) -> ProcessGroupLike:
        return make_group(self._spec, self._store, self._prefix(membership.generation),
                          membership.rank, membership.world_size, membership.generation)

    # ------------------------------------------------------------------ lifetime

    def finish(self) -> None:
        """The run is complete: workers still waiting to join are told so; then close."""
        self._source.finish()
        self.close()

    def close(self) -> None:
        """Destroy the group (its threads are joined here) and release the store
        connection; safe to call twice. A Gloo group no collective went through is
        destroyed once every peer has built its own (up to the group's timeout:
        ``groups.peers_built``). Whoever holds ``group`` (``DataParallel`` too) can
        no longer communicate through it. A group left open is released at exit
        (``potluck.group``), before the interpreter finalizes."""
        clear_current(self)
        try:
            if self.group.usable and not self.group.communicated and \
                    self._spec.backend == "gloo":  # (NCCL connects lazily: no handshake)
                self._await_peers_built()
        finally:
            self.group.release("the cohort was closed")
            self._source.close()

    def _await_peers_built(self) -> None:
        """Before closing a group no collective went through: wait until every peer has
        built its own (``groups.peers_built``); it may take up to the group's timeout. A
        store that cannot answer ends the wait; closing never fails."""
        generation = self.generation
        try:
            done = peers_built(self._store, self._prefix(generation), self.world_size,
                               time.monotonic() + self._spec.timeout,
                               lambda: self._source.step_failed(generation))
        except RuntimeError as exc:  # (store errors, a lost store's too)
            log.info("[rank %d] closing generation %d's group without knowing that every "
                     "peer built it (the store: %s)", self.rank, generation, exc)
            return
        if not done:
            log.info("[rank %d] closing generation %d's group: not every peer built it "
                     "(a peer gave up on it, or %g s passed)", self.rank, generation,
                     self._spec.timeout)

    def __enter__(self) -> Cohort:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "elastic" if self.elastic else "fixed"
        return (f"Cohort(rank={self.rank}, world_size={self.world_size}, "
                f"backend={self.backend!r}, device={self.device}, "
                f"generation={self.generation}, {mode})")

