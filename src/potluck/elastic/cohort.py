"""``ElasticCohort``: the rendezvous' membership plus one process group per generation.

Generation 0 is formed by ``StoreRendezvous.join()``. After a failed step every
survivor calls ``recover()``: the rendezvous agrees on generation g+1 without the lost
workers, and a fresh Gloo group is built under that generation's own store prefix (the
broken one is dropped, not reused: a failed collective may have left it half-way).
Ranks and world size are the membership's, not the environment's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store

from potluck.collectives import retire_group
from potluck.elastic.failure_watch import FailureWatch
from potluck.elastic.minimum import MinimumSize
from potluck.errors import RendezvousError
from potluck.rendezvous import Membership, RendezvousConfig, StoreRendezvous

log = logging.getLogger(__name__)


class ElasticCohort:
    """This worker's place in the cohort, generation by generation."""

    def __init__(self, store: Store, worker_id: str, config: RendezvousConfig, *,
                 timeout: float = 60.0, host: str = "127.0.0.1",
                 prefix: str = "potluck/elastic",
                 minimum: MinimumSize | None = None) -> None:
        self._store, self._timeout, self._host, self._prefix = store, timeout, host, prefix
        # Below this size the cohort stops training and waits for joiners (the optimizer
        # enforces it; see ElasticOptimizer).
        self.minimum = minimum or MinimumSize()
        self.rendezvous = StoreRendezvous(store, worker_id, config)
        self.events: list[dict[str, Any]] = []
        self.membership = self.rendezvous.join()
        # Admitted into a running cohort (not a founder): it must receive the live state.
        self.joined_late = self.membership.generation > 0 and \
            worker_id in self.membership.joined
        self.group = self._build_group(self.membership)
        self._failures = FailureWatch(store, prefix, lambda: self.generation)

    @property
    def rank(self) -> int:
        return self.membership.rank

    @property
    def world_size(self) -> int:
        return self.membership.world_size

    @property
    def generation(self) -> int:
        return self.membership.generation

    def boundary(self) -> Membership:
        """At a step boundary (every member calls it): admit joiners, drop leavers."""
        started, before = time.monotonic(), self.membership.generation
        self.membership = self._cut_off_guard(self.rendezvous.admit)
        if self.membership.generation != before:
            self.group = self._build_group(self.membership)
            self._record("boundary", started)
        return self.membership

    def mark_step_failed(self) -> None:
        """Tell the other members that this generation's step failed here: a member
        still waiting in a collective for data from this one gives up at once."""
        self._failures.mark(self.generation)

    def step_failed_elsewhere(self) -> bool:
        """Whether a member gave up on this generation's step (no I/O: see FailureWatch)."""
        return self._failures.seen(self.generation)

    def leave(self) -> None:
        """Announce a graceful departure; the others form the next generation at once."""
        self.rendezvous.announce_leave()

    def recover(self, reason: str) -> Membership:
        """Form the next generation after a failed collective; every survivor calls it."""
        started = time.monotonic()
        retire_group(self.group)  # broken: tear it down now, not at interpreter exit
        self.membership = self._cut_off_guard(lambda: self.rendezvous.next_generation(reason))
        self.group = self._build_group(self.membership)
        self._record(reason, started)
        return self.membership

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
                    f"worker {self.rendezvous.worker_id!r} cannot reach the job's store: no "
                    f"heartbeat got through for {silent:.1f} s (heartbeat_timeout={limit:g} "
                    "s), so the cohort has gone on without it; check this host's network "
                    "link, then start it again to rejoin as a new member"
                )
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _record(self, cause: str, started: float) -> None:
        """Log one membership change as an event (generation, cause, who, how long)."""
        event: dict[str, Any] = {"generation": self.generation, "cause": cause,
                                 "left": list(self.membership.left),
                                 "joined": list(self.membership.joined),
                                 "world_size": self.world_size,
                                 "recovery_s": time.monotonic() - started}
        self.events.append(event)
        log.warning("[rank %d] generation %d: %s (left %s, joined %s) in %.2f s",
                    self.rank, self.generation, cause, event["left"], event["joined"],
                    event["recovery_s"])

    def finish(self) -> None:
        """The run is complete: workers still waiting to join are told so, and stop."""
        self.rendezvous.mark_finished()
        self.close()

    def close(self) -> None:
        self._failures.stop()
        self.rendezvous.close()

    def _build_group(self, membership: Membership) -> Any:
        prefixed = PrefixStore(f"{self._prefix}/g{membership.generation}", self._store)
        gloo: Any = dist.ProcessGroupGloo
        options = gloo._Options()
        options._timeout = timedelta(seconds=self._timeout)
        options._devices = [gloo.create_device(hostname=self._host)]
        try:
            return gloo(prefixed, membership.rank, membership.world_size, options)
        except RuntimeError as exc:
            raise RendezvousError(
                f"generation {membership.generation}: rank {membership.rank} of "
                f"{membership.world_size} could not build its group within "
                f"{self._timeout:g} s ({exc}); a member died during recovery: it will "
                "be left out of the next generation"
            ) from exc
