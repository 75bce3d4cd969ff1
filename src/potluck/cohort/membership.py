"""Where a cohort's membership comes from: fixed by the launcher, or agreed on the store.

A ``Cohort`` asks its ``MembershipSource`` who is in, generation by generation, and
builds the group of each generation itself (``groups.make_group``). Two sources:

- ``FixedMembership``: the launcher's ranks (potluck run, torchrun, SLURM, one process).
  One generation; a lost peer cannot be recovered from, so ``next_generation`` raises
  ``PeerLostError`` (restart the job, or run it elastic).
- ``RendezvousMembership``: the store rendezvous (join with a token, admit at step
  boundaries, next generation after a loss, graceful leave). Every call runs under a
  cut-off guard, and a ``FailureWatch`` tells, without I/O, whether a member gave up on
  a generation's step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from torch._C._distributed_c10d import Store

from potluck import keys
from potluck.cohort.failure_watch import FailureWatch
from potluck.errors import PeerLostError, RendezvousError
from potluck.rendezvous import Membership, RendezvousConfig, StoreRendezvous


class MembershipSource(Protocol):
    """Who is in the cohort; every method is called by every member at the same point."""

    elastic: bool
    worker_id: str

    def join(self) -> Membership: ...

    def boundary(self) -> Membership: ...

    def next_generation(self, reason: str) -> Membership: ...

    def rejoin(self) -> Membership:
        """A joiner whose live state did not arrive leaves its generation and waits in
        the join queue again, under a new id."""
        ...

    def pending_joiners(self) -> bool:
        """Whether workers wait that the cohort would admit now (it has room)."""
        ...

    def spares(self) -> int:
        """Workers waiting to be admitted, room or not."""
        ...

    def announce_leave(self) -> None: ...

    def expel(self, worker_id: str, why: str) -> None: ...

    def mark_step_failed(self, generation: int) -> None: ...

    def step_failed(self, generation: int) -> bool: ...

    def committed(self) -> None:
        """A step committed in the current generation."""
        ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


class FixedMembership:
    """The launcher's ranks, as one generation that never changes."""

    elastic = False

    def __init__(self, rank: int, world_size: int) -> None:
        self.worker_id = f"rank{rank}"
        self._membership = Membership(0, tuple(f"rank{r}" for r in range(world_size)),
                                      rank, "rank0", "started by the launcher")

    def join(self) -> Membership:
        return self._membership

    def boundary(self) -> Membership:
        return self._membership

    def next_generation(self, reason: str) -> Membership:
        raise PeerLostError(
            f"{reason} on rank {self._membership.rank} of a fixed-size job, which cannot "
            "go on without the lost worker: restart it (potluck run --max-restarts K, "
            "resuming from a checkpoint) or run it elastic (potluck run --elastic)",
            rank=self._membership.rank, generation=0, cause=reason)

    def rejoin(self) -> Membership:
        raise PeerLostError(
            f"rank {self._membership.rank} of a fixed-size job cannot rejoin it: nobody "
            "joins a fixed job late (run it elastic: potluck run --elastic)",
            rank=self._membership.rank, generation=0, cause="rejoin")

    def pending_joiners(self) -> bool:
        return False

    def spares(self) -> int:
        return 0

    def announce_leave(self) -> None:
        """Nobody to tell: a fixed job ends for everyone together."""

    def expel(self, worker_id: str, why: str) -> None:
        """Nothing can leave a fixed job: a quarantined member stays in the group, and
        the trust part no longer counts it (``potluck.trust``)."""

    def mark_step_failed(self, generation: int) -> None:
        """A fixed job does not redo steps: the failure is raised, not announced."""

    def step_failed(self, generation: int) -> bool:
        return False

    def committed(self) -> None:
        """A fixed job's one generation needs no quorum."""

    def finish(self) -> None:
        """Nothing waits to join a fixed job."""

    def close(self) -> None:
        """Holds no connection of its own."""


class RendezvousMembership:
    """The store rendezvous, guarded against a link that went down."""

    elastic = True

    def __init__(self, store: Store, worker_id: str, config: RendezvousConfig,
                 root: str, seat: str | None = None,
                 named: Callable[[str], None] = lambda worker_id: None) -> None:
        """``named(id)`` hears each new id this worker takes (``rejoin``): the launcher's
        agent reports a dead worker under its current id."""
        self.worker_id = worker_id
        self.rendezvous = StoreRendezvous(store, worker_id, config, seat)
        self._store, self._root, self._seat, self._named = store, root, seat, named
        self._first_id, self._rejoins = worker_id, 0
        self._failures: FailureWatch | None = None

    def join(self) -> Membership:
        membership = self.rendezvous.join()
        self._failures = FailureWatch(
            self._store, lambda g: keys.step_failed(self._root, g), self._generation,
            peer=self._next_member,
            heartbeat_timeout=self.rendezvous.config.heartbeat_timeout,
            beats_prefix=self.rendezvous.config.prefix)
        return membership

    def _generation(self) -> int:
        current = self.rendezvous.membership
        return -1 if current is None else current.generation

    def _next_member(self) -> str | None:
        """The member after this one in the current generation (None when alone)."""
        current = self.rendezvous.membership
        if current is None or current.world_size < 2:
            return None
        return current.members[(current.rank + 1) % current.world_size]

    def boundary(self) -> Membership:
        return self._cut_off_guard(self.rendezvous.admit)

    def next_generation(self, reason: str) -> Membership:
        return self._cut_off_guard(lambda: self.rendezvous.next_generation(reason))

    def rejoin(self) -> Membership:
        """Leave the current generation and join again as a new worker (an id is joined
        once: its verdict and leave key stay on the store). The seat stays. The failure
        watch goes on: it reads the generation from the new rendezvous."""
        config = self.rendezvous.config
        self.rendezvous.announce_leave()  # the members' next generation leaves it out
        self._rejoins += 1
        self.worker_id = f"{self._first_id}.{self._rejoins}"
        self._named(self.worker_id)
        self.rendezvous = StoreRendezvous(self._store, self.worker_id, config,
                                          self._seat or self._first_id)
        return self.rendezvous.join()

    def pending_joiners(self) -> bool:
        return self.rendezvous.room() > 0 and bool(self.rendezvous.pending_joiners())

    def spares(self) -> int:
        return len(self.rendezvous.pending_joiners())

    def announce_leave(self) -> None:
        self.rendezvous.announce_leave()

    def expel(self, worker_id: str, why: str) -> None:
        self.rendezvous.expel(worker_id, why)

    def mark_step_failed(self, generation: int) -> None:
        if self._failures is not None:
            self._failures.mark(generation)

    def step_failed(self, generation: int) -> bool:
        return self._failures is not None and self._failures.seen(generation)

    def committed(self) -> None:
        self.rendezvous.committed()

    def finish(self) -> None:
        self.rendezvous.mark_finished()

    def close(self) -> None:
        if self._failures is not None:
            self._failures.stop()
        self.rendezvous.close()

    def _cut_off_guard(self, call: Callable[[], Membership]) -> Membership:
        """Run a rendezvous call, but give up once the store stops answering this worker.

        A store request over a link that went down blocks until TCP gives up (minutes),
        whatever the store's timeout. The call runs on a daemon thread; if no heartbeat
        got through for ``heartbeat_timeout`` meanwhile, the others have already counted
        this worker out, so it raises instead of hanging.
        """
        outcome: list[Membership | BaseException] = []

        def run() -> None:
            try:
                outcome.append(call())
            except BaseException as exc:  # handed to the caller's thread below
                outcome.append(exc)

        started = time.monotonic()
        thread = threading.Thread(target=run, name="potluck-rendezvous", daemon=True)
        thread.start()
        limit = self.rendezvous.config.heartbeat_timeout
        while thread.is_alive():
            thread.join(timeout=0.05)
            silent = self.rendezvous.store_silent_since(started)
            if thread.is_alive() and silent > limit:
                raise RendezvousError(
                    f"worker {self.worker_id!r} cannot reach the job's store: no "
                    f"heartbeat got through for {silent:.1f} s (heartbeat_timeout={limit:g} "
                    "s), so the cohort has gone on without it; check this host's network "
                    "link, then start it again to rejoin as a new member"
                )
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result
