"""An elastic job's roll of agents: each agent checks in, beats while it runs and
checks out (``Presence``); the agent hosting the store waits at the end for those
still beating (``wait_for_roll``), and counts one that stopped beating as lost."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from potluck import keys
from potluck.errors import RendezvousError
from potluck.launch.config import LaunchConfig
from potluck.launch.meeting import bump, count, raise_count
from potluck.launch.policy import roll_call

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

AGENT_BEAT = 1.0  # seconds between an elastic agent's heartbeats


AGENT_LOST = 5.0  # an agent whose last beat is older is gone (killed, or cut off)
# Node 0 waits for the roll from its own workers' end, which in a run that lost them
# early is most of the run: ask about the agents still on it 4 times a second.
_ROLL_POLL = 0.25


class Presence:
    """This agent on the roll of an elastic job's agents, from its check-in to its
    check-out, with a heartbeat on a thread of its own in between (every ``AGENT_BEAT``
    s). Node 0 (or the agent the store moved to) keeps the store up for the agents on
    the roll (``wait_for_roll``); on a store that moved, each agent writes its place on
    the roll back."""

    def __init__(self, store: Store, config: LaunchConfig) -> None:
        from potluck.relay import prefixed, succession_of
        from potluck.rendezvous.heartbeat import Heartbeat

        self._store, self._run_id, self._done = store, config.run_id, False
        self.index = bump(store, keys.agents(config.run_id, "started"), 1) - 1
        self._who = f"node {config.node_rank} (host {socket.gethostname()})"
        store.set(_roll(config.run_id, f"who/{self.index}"), self._who)
        self._beat = Heartbeat(agent_beats(store, config.run_id), f"agent{self.index}",
                               AGENT_BEAT).start()
        # and where the cohort's quorum reads it: this node is on this store's side
        self._node_beat = Heartbeat(prefixed(store, keys.rendezvous_root(config.run_id)),
                                    f"node{config.node_rank}", AGENT_BEAT).start()
        succession = succession_of(store)
        if succession is not None:
            succession.seeder(self._seed)

    def _seed(self, root: Store) -> None:
        """The store moved: this agent's place on the roll, written back (the count of
        agents raised to cover it; an agent lost with the old host has no beat there,
        and the roll counts it lost)."""
        raise_count(root, keys.agents(self._run_id, "started"), self.index + 1)
        root.set(_roll(self._run_id, f"who/{self.index}"), self._who)
        if self._done:  # (checked out before the move: not to be waited for, nor lost)
            root.set(_roll(self._run_id, f"done/{self.index}"), "1")

    def check_out(self) -> None:
        """Done with the store: stop beating, then say so (node 0 may be gone already:
        this node's outcome stands)."""
        self._beat.stop()
        self._node_beat.stop()
        self._done = True
        with contextlib.suppress(RuntimeError):
            self._store.set(_roll(self._run_id, f"done/{self.index}"), "1")


def wait_for_roll(store: Store, run_id: str, timeout: float, stopping: Callable[[], bool],
                  lost: Callable[[str, float], None]) -> None:
    """Node 0 of an elastic job: wait until every agent on the roll checked out, or
    stopped beating (its node was killed or cut off: it will never check out, and the
    cohort went on without its workers). ``lost(who, silent_s)`` is told of each such
    node once. Raises ``RendezvousError`` at ``timeout`` naming how many are left."""
    from potluck.rendezvous.heartbeat import read_beats

    deadline = time.monotonic() + timeout
    told: set[int] = set()
    done: set[int] = set()  # (an agent checks out once: never asked again)
    beats_store = agent_beats(store, run_id)
    # (beat value, when it changed on this node's clock): beats are other hosts' wall
    # clocks, so only their change is compared, never their value (no clock skew)
    changed: dict[int, tuple[float | None, float]] = {}
    read: dict[str, float] = {}
    looked = -float("inf")  # when the beats were last read
    while True:
        agents = range(count(store, keys.agents(run_id, "started")))
        done |= {a for a in agents
                 if a not in done and store.check([_roll(run_id, f"done/{a}")])}
        pending = [a for a in agents if a not in done]
        now = time.monotonic()
        if now - looked >= AGENT_BEAT / 2:  # (a beat changes once every AGENT_BEAT)
            read, looked = read_beats(beats_store, [f"agent{a}" for a in pending]), now
        for agent in pending:
            # (no beat at all: on a store that moved, an agent lost with the old host;
            # a live one beats within AGENT_BEAT of its check-in)
            beat = read.get(f"agent{agent}")
            if agent not in changed or changed[agent][0] != beat:
                changed[agent] = (beat, now)
        beats = {a: when for a, (_, when) in changed.items()}
        call = roll_call(pending, beats, now=now, timeout=AGENT_LOST)
        for agent in call.lost:
            if agent not in told:
                told.add(agent)
                who = _roll(run_id, f"who/{agent}")
                lost(store.get(who).decode() if store.check([who]) else f"agent {agent}",
                     now - beats[agent])
        if not call.waiting or stopping():
            return
        if time.monotonic() > deadline:
            raise RendezvousError(
                f"{len(call.waiting)} of {len(agents)} node agents did not check out within "
                f"{timeout:g} s, and they still beat: a node's workers are still running or "
                "its agent hangs: see that node's output")
        time.sleep(_ROLL_POLL)


def _roll(run_id: str, name: str) -> str:
    return keys.agents(run_id, f"roll/{name}")


def agent_beats(store: Store, run_id: str) -> Store:
    """The agents' heartbeats (``hb/agent<i>``) live under the roll."""
    from potluck.relay import prefixed

    return prefixed(store, _roll(run_id, "beats"))
