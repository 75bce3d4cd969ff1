"""``StoreRendezvous``: forming generation after generation through the job's store.

Every operation is a short, bounded protocol on the store (keys in ``keys.py``):

``join()``            a worker enters the join queue. The first worker holding the token
                      claims ``founder``, admits the next ``expected - 1`` queued workers
                      by challenge-response and publishes generation 0. Later joiners
                      wait until the cohort admits them at a step boundary.
``admit()``           every member calls it at the same step boundary. The leader
                      (lowest-ranked member with a fresh heartbeat) admits the verified
                      joiners and drops the members that announced leaving, or answers
                      "same": then the generation does not change.
``next_generation()`` every survivor calls it after a collective failed. Each registers
                      for g+1; the leader (lowest-ranked member that is registered and
                      alive) waits until every live member of g registered (or
                      ``settle_timeout``) and publishes g+1. If the leader dies, its
                      heartbeat goes stale and the next registered member decides.
``announce_leave()``  a graceful exit: the next generation forms without waiting for
                      this worker's heartbeat to go stale.
``mark_finished()``   the run is complete: workers still waiting to be admitted give up
                      at once with ``JobFinishedError`` instead of at ``join_timeout``.

Decisions are published with ``compare_set``, so the first publication of a generation
wins and every worker returns the same membership, even if two believed they led.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Collection

from torch._C._distributed_c10d import PrefixStore, Store

from potluck import keys
from potluck.errors import ConfigError, JobFinishedError, NoQuorumError, RendezvousError
from potluck.relay import prefixed, succession_of
from potluck.rendezvous import admission
from potluck.rendezvous.heartbeat import Heartbeat, fresh, read_beats, write_beat
from potluck.rendezvous.join_queue import JoinQueue
from potluck.rendezvous.membership import Membership, Record, RendezvousConfig
from potluck.rendezvous.state import (
    NO_QUORUM,
    Action,
    Node,
    coming,
    decide,
    node_of,
    pick_leader,
    still_coming,
)

log = logging.getLogger(__name__)

SAME = "same"
NEXT = "next:"
# How often a member that does not lead looks again who leads (a boundary's answer, a
# generation's publication): a leader changes only when its beat ages (seconds). Every
# member looking at every poll made 3 requests a member, per member, per 20 ms: with 32
# members the store answered nothing else while a generation formed.
LOOK_S = 0.25
# How often a joiner waiting to be admitted looks for a challenge (seconds): one request
# a look. It asks for its verdict once it answered, else every LOOK_S. Sixteen founders
# waiting for generation 0 at 2 requests each per 20 ms kept node 0's store so busy on 2
# cores that a new connection got no answer for 30 s, nor a challenge's answer in 5 s.
JOIN_TICK_S = 0.1


class StoreRendezvous:
    """The membership of ``worker_id`` in the cohort that meets in ``store``."""

    def __init__(self, store: Store, worker_id: str, config: RendezvousConfig,
                 seat: str | None = None) -> None:
        """``seat``: where this worker runs (what a restart keeps; default its id): a
        quarantined member's seat is banned (``expel``), and joiners from it refused."""
        if not worker_id or "/" in worker_id:
            raise ConfigError(
                f"worker_id={worker_id!r} must be a non-empty string without '/', "
                "e.g. 'host:pid:nonce'"
            )
        self.worker_id = worker_id
        self.seat = seat or worker_id
        self.config = config
        self._store: Store = prefixed(store, config.prefix)
        self._heartbeat: Heartbeat | None = None
        self._boundary = 0  # step boundaries passed in the current generation
        self.membership: Membership | None = None
        self._record: Record | None = None  # the current generation's, as published
        self._bans: dict[str, str] = {}  # seats this member banned (expel), and why
        # the members of the last generation that committed a step: a split cohort's
        # quorum counts from it (a generation formed with a member that went to the other
        # side never trained; counting from it would let both sides go on)
        self._trained: tuple[str, ...] = ()
        self._registering: tuple[int, str] | None = None  # (n, id) while next_generation
        self._seats: dict[str, str] = {}  # members' seats, as learned
        self._left = False  # announced leaving: a moved store hears that, not a beat
        self._succession = succession_of(store)
        if self._succession is not None:  # the store may move: write back what it held
            self._succession.seeder(self._seed)
        self._queue = JoinQueue(self._store, self._moves)

    # ------------------------------------------------------------------ joining

    def join(self) -> Membership:
        """Enter the cohort: found generation 0, or wait to be admitted at a boundary."""
        if self.membership is not None:
            raise ConfigError(
                f"worker {self.worker_id!r} is already in generation "
                f"{self.membership.generation}; join() once per worker id"
            )
        self._start_heartbeat()
        started = time.monotonic()
        self._store.set(keys.seat(self.worker_id), self.seat)  # before it can be pending
        slot = int(self._store.add(keys.JOIN_COUNT, 1)) - 1
        self._store.set(keys.join_slot(slot), self.worker_id)
        try:
            if self._claim_founder():
                record = self._found_generation_zero(started)
            else:
                record = self._await_admission(started)
        except RendezvousError:
            self.close()
            raise
        return self._adopt(record, started)

    def _claim_founder(self) -> bool:
        if self.config.token is None:  # a worker without the token can admit nobody
            return False
        won = self._store.compare_set(keys.FOUNDER, "", self.worker_id)
        return won.decode() == self.worker_id and not self._store.check([keys.CURRENT])

    def _found_generation_zero(self, started: float) -> Record:
        cfg = self.config
        token = _require_token(cfg.token)
        members = [self.worker_id]
        deadline = started + cfg.join_timeout
        while len(members) < cfg.expected and time.monotonic() < deadline:
            # accepted joiners get their verdict only at publication: skip them here
            waiting = [j for j in self.pending_joiners() if j not in members]
            waiting = waiting[: cfg.expected - len(members)]
            if waiting:
                accepted, _ = admission.check_answers(
                    self._store, waiting, token, timeout=cfg.admission_timeout,
                    poll=cfg.poll_interval)
                members.extend(accepted)
            else:
                time.sleep(cfg.poll_interval)
        error = ""
        if len(members) < cfg.min_size:
            error = (
                f"generation 0 got {len(members)} of {cfg.expected} expected workers within "
                f"join_timeout={cfg.join_timeout:g} s, fewer than min_size={cfg.min_size}; "
                "start the missing workers with the job's token, or lower min_size"
            )
        elif len(members) < cfg.expected:
            log.warning("generation 0 formed with %d of %d workers after %g s",
                        len(members), cfg.expected, cfg.join_timeout)
        record = Record(0, tuple(members), self.worker_id, "formed",
                        joined=tuple(members), error=error)
        return self._publish(record)

    def _await_admission(self, started: float) -> Record:
        cfg = self.config
        answered = ""
        beats: dict[str, tuple[float | None, float]] = {}  # (see _check_orphaned)
        looked = 0.0  # when the members' heartbeats were last read (once an interval)
        asked = -float("inf")  # when the verdict was last read
        while True:
            if answered or time.monotonic() - asked >= LOOK_S:
                asked, admitted = time.monotonic(), admission.read_verdict(
                    self._store, self.worker_id)
                if admitted is not None:
                    return Record.decode(self._store.get(keys.generation(admitted)))
            if self._store.check([keys.challenge(self.worker_id)]):
                nonce = self._store.get(keys.challenge(self.worker_id)).decode()
                if nonce != answered:
                    admission.answer_challenge(self._store, self.worker_id, cfg.token)
                    answered = nonce
            if time.monotonic() - looked >= cfg.heartbeat_interval:  # (the slow news)
                looked = time.monotonic()
                if self._store.check([keys.FINISHED]):
                    raise JobFinishedError(
                        f"worker {self.worker_id!r} arrived after the run had finished: "
                        "there is nothing left to train; start a new run to train more"
                    )
                self._check_orphaned(beats)
            if time.monotonic() - started > cfg.join_timeout:
                raise RendezvousError(
                    f"worker {self.worker_id!r} waited join_timeout={cfg.join_timeout:g} s "
                    "to be admitted and nobody admitted it; the cohort admits joiners when "
                    "its members call admit() at a step boundary: check that the job is "
                    "running and calls it, or raise join_timeout"
                )
            time.sleep(max(cfg.poll_interval, JOIN_TICK_S))

    def _check_orphaned(self, seen: dict[str, tuple[float | None, float]]) -> None:
        """A joiner's wait: raise once no member of the newest generation (or the
        founder, before generation 0 is out) has heartbeated for ``2 heartbeat_timeout``
        by this worker's own clock (``seen``: each member's last beat value and when this
        worker saw it change; hosts' clocks need not agree): every member was lost or
        left, nobody will admit anyone, and waiting out ``join_timeout`` would say
        nothing for minutes."""
        if self._store.check([keys.CURRENT]):
            current = int(self._store.get(keys.CURRENT).decode())
            record = Record.decode(self._store.get(keys.generation(current)))
            members, what = record.members, f"generation {current}"
        elif self._store.check([keys.FOUNDER]):
            members, what = (self._store.get(keys.FOUNDER).decode(),), "the founder"
        else:
            return  # nobody has started the cohort yet: the founder is still to come
        now, window = time.monotonic(), 2 * self.config.heartbeat_timeout
        beats = read_beats(self._store, members)
        for member in members:
            last = seen.get(member)
            if last is None or last[0] != beats.get(member):
                seen[member] = (beats.get(member), now)
        if any(now - seen[member][1] <= window for member in members):
            return
        raise RendezvousError(
            f"worker {self.worker_id!r} cannot be admitted: no member of the cohort is "
            f"alive ({what}: {', '.join(members)}; none has heartbeated for over "
            f"{window:g} s), so every worker was lost or left at once (the node went down, "
            "all were killed). The cohort's state lived in its members: start the job "
            "again (with prepare(..., checkpoint_dir=..., resume=True) it resumes from the "
            "latest checkpoint written there)")

    def pending_joiners(self) -> list[str]:
        """Workers in the join queue that were neither admitted nor refused, in order."""
        current = set(self.membership.members) if self.membership else {self.worker_id}
        return self._queue.pending(current)

    def room(self) -> int:
        """How many joiners the cohort would admit now: its wanted size less its members
        (no I/O; without a wanted size, as many as come)."""
        members = len(self.membership.members) if self.membership else 1
        cap = self.config.max_size
        return sys.maxsize if cap is None else max(0, cap - members)

    # ---------------------------------------------------------------- boundaries

    def admit(self) -> Membership:
        """At a step boundary (every member calls it): admit joiners, drop leavers.

        Returns the current membership unchanged when nobody joined or left.
        """
        current = self._require_membership("admit")
        started = time.monotonic()
        key = keys.boundary(current.generation, self._boundary)
        self._boundary += 1
        bound = self.config.settle_timeout + self.config.heartbeat_timeout + \
            self.config.admission_timeout
        moved_on = keys.generation(current.generation + 1)
        leader, looked = self.worker_id, -float("inf")
        while not self._store.check([key]):
            if time.monotonic() - looked >= LOOK_S:  # (the slow news: who leads, and
                # whether the others healed while this member was frozen)
                if self._store.check([moved_on]):
                    return self._adopt(Record.decode(self._store.get(moved_on)), started)
                leader, looked = self._leader(current.members), time.monotonic()
            if leader == self.worker_id:
                self._store.compare_set(key, "", self._decide_boundary(current))
            elif time.monotonic() - started > bound:
                raise self._timeout(f"the leader's answer to boundary {key}", bound)
            else:
                time.sleep(self.config.poll_interval)
        answer = self._store.get(key).decode()
        if answer == SAME:
            return current
        generation = int(answer[len(NEXT):])
        return self._adopt(Record.decode(self._store.get(keys.generation(generation))),
                           started)

    def _decide_boundary(self, current: Membership) -> str:
        leavers = tuple(m for m in current.members if self._store.check([keys.leave(m)]))
        pending = self._refuse_banned(self.pending_joiners())
        kept = tuple(m for m in current.members if m not in leavers)
        if self.config.max_size is not None:  # the others wait on as spares
            pending = pending[:max(0, self.config.max_size - len(kept))]
        accepted: list[str] = []
        if pending:
            accepted, _ = admission.check_answers(
                self._store, pending, _require_token(self.config.token),
                timeout=self.config.admission_timeout, poll=self.config.poll_interval)
        if not accepted and not leavers:
            return SAME
        reason = "admit" if accepted else "leave"
        record = Record(current.generation + 1, kept + tuple(accepted), self.worker_id,
                        reason, joined=tuple(accepted), left=leavers)
        winner = self._publish(record)
        return f"{NEXT}{winner.generation}"

    def _refuse_banned(self, pending: list[str]) -> list[str]:
        """Refuse joiners whose seat was banned (a quarantined member restarted)."""
        allowed: list[str] = []
        for joiner in pending:
            seat = (self._store.get(keys.seat(joiner)).decode()
                    if self._store.check([keys.seat(joiner)]) else joiner)
            if self._store.check([keys.ban(seat)]):
                why = self._store.get(keys.ban(seat)).decode()
                log.warning("refused worker %s: its seat %s is quarantined", joiner, seat)
                self._store.set(keys.verdict(joiner),
                                f"{admission.REFUSED}{admission.QUARANTINED}{why}")
            else:
                allowed.append(joiner)
        return allowed

    def expel(self, worker_id: str, why: str) -> None:
        """Remove a member at this boundary (it was quarantined) and ban its seat; every
        member may call it (the keys are the same). The caller then runs ``admit()``."""
        seat = (self._store.get(keys.seat(worker_id)).decode()
                if self._store.check([keys.seat(worker_id)]) else worker_id)
        self._store.set(keys.ban(seat), why)
        self._bans[seat] = why
        self._store.set(keys.leave(worker_id), f"quarantined {time.time():.6f}")

    # ------------------------------------------------------------------ failures

    def next_generation(
        self, reason: str, suspected: Collection[str] = frozenset()
    ) -> Membership:
        """Form the next generation with every member that is still alive.

        Every survivor calls this (after a failed collective). ``suspected``: members
        this worker believes lost; the leader does not wait for them unless they
        register. Raises ``RendezvousError`` if this worker was left out.
        """
        current = self._require_membership("next_generation")
        started = time.monotonic()
        n = current.generation + 1
        self._registering = (n, self.worker_id)
        self._store.set(keys.registration(n, self.worker_id), reason)
        cfg = self.config
        # A follower's patience restarts whenever the leader changes: each leader
        # publishes within settle_timeout, and a dead one is replaced once its beat ages.
        bound = cfg.settle_timeout + cfg.heartbeat_timeout + 1.0
        leader, since, looked = self.worker_id, started, -float("inf")
        moves = self._moves()
        while not self._store.check([keys.generation(n)]):
            if self._moves() != moves:  # the store moved meanwhile: every member comes
                moves, started = self._moves(), time.monotonic()  # again, give it time
                since = started
            # The lowest-ranked member that is alive AND already here leads: a member
            # still stuck in a collective cannot hold the others up past settle_timeout.
            if leader == self.worker_id or time.monotonic() - looked >= LOOK_S:
                now_leader, looked = self._leader(current.members, n), time.monotonic()
                if now_leader != leader:
                    leader, since = now_leader, time.monotonic()
            if leader == self.worker_id:
                registered = {m for m in current.members
                              if self._store.check([keys.registration(n, m)])}
                alive = self._alive(current.members) | {self.worker_id}
                alive -= set(suspected) - registered
                self._lead(current, reason, registered & alive, alive, started)
            elif time.monotonic() - since > bound:
                raise self._timeout(f"generation {n} to be published by {leader}", bound)
            else:
                time.sleep(cfg.poll_interval)
        return self._adopt(Record.decode(self._store.get(keys.generation(n))), started)

    def _lead(self, current: Membership, reason: str, registered: set[str],
              alive: set[str], started: float) -> None:
        cfg = self.config
        # (the quorum counts from the last generation that trained, which holds the
        # current one's members and maybe more)
        base = tuple(dict.fromkeys(self._trained + current.members))
        nodes = self._nodes(base) if cfg.quorum else None
        decision = decide(time.monotonic(), members=current.members, registered=registered,
                          alive=alive, deadline=started + cfg.settle_timeout,
                          min_size=cfg.min_size, quorum=cfg.quorum, nodes=nodes,
                          present=self._present(nodes) if nodes else (), base=base)
        if decision.action is Action.WAIT:
            time.sleep(cfg.poll_interval)
            return
        left = tuple(m for m in current.members if m not in decision.members)
        error = "" if decision.action is Action.FORM else (
            f"generation {current.generation + 1} could not form: {decision.why}" + (
                "" if NO_QUORUM in decision.why else
                "; restart the lost workers (potluck run --max-restarts K) or lower "
                "min_size"))
        self._publish(Record(current.generation + 1, decision.members, self.worker_id,
                             reason, left=left, error=error))

    def announce_leave(self) -> None:
        """Leave gracefully: the next generation forms without this worker at once."""
        self._store.set(keys.leave(self.worker_id), f"{time.time():.6f}")
        self._left = True
        self.close()
        self.membership = None

    def mark_finished(self) -> None:
        """The run is complete: tell the workers still waiting to be admitted."""
        self._store.set(keys.FINISHED, self.worker_id)

    def store_silent_since(self, since: float) -> float:
        """Seconds since ``since`` (monotonic) or this worker's last beat that reached
        the store, whichever is later: over ``heartbeat_timeout``, the others count it
        gone, and the store is not answering it (a cut link, a frozen store). While the
        store moves (``potluck.succession``) nobody is judged: 0."""
        if self._heartbeat is None:  # not beating (closed): nothing to judge by
            return 0.0
        moved = self._succession
        if moved is not None and moved.moving:  # nobody has a store to judge by now
            return 0.0
        # A move writes this worker's beat on the new store (``_seed``): the others
        # judge it from there.
        last = max(self._heartbeat.last_ok, since,
                   moved.moved_at if moved is not None else since)
        return time.monotonic() - last

    def close(self) -> None:
        """Stop this worker's heartbeat (its store keys stay); safe to call twice."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None

    # ------------------------------------------------------------------- helpers

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self._store, self.worker_id,
                                        self.config.heartbeat_interval).start()

    def _alive(self, members: Collection[str]) -> set[str]:
        """Members with a fresh heartbeat that did not announce leaving."""
        beats = read_beats(self._store, members)
        live = fresh(time.time(), beats, self.config.heartbeat_timeout)
        moved = self._succession
        # A store that moved a moment ago has no beat yet of a member still on its way
        # there: it is not gone (each survivor moves by itself).
        if moved is not None and still_coming(time.monotonic() - moved.moved_at,
                                              self.config.heartbeat_timeout,
                                              self.config.settle_timeout):
            live |= coming(members, beats, self._nodes(members), moved.lost)
        return {m for m in live if not self._store.check([keys.leave(m)])}

    def _leader(self, members: tuple[str, ...], registered_for: int | None = None) -> str:
        """The lowest-ranked member that is alive and, with ``registered_for``,
        registered for that generation; this worker is such a member. Asked member by
        member in rank order: usually a few requests, not three a member."""
        def ready(member: str) -> bool:
            return member == self.worker_id or (
                (registered_for is None or self._store.check(
                    [keys.registration(registered_for, member)]))
                and bool(self._alive([member])))

        return pick_leader(members, _Asked(ready)) or self.worker_id

    def _publish(self, record: Record) -> Record:
        raw = self._store.compare_set(keys.generation(record.generation), "", record.encode())
        winner = Record.decode(raw)
        if winner == record and not record.error:
            self._store.set(keys.CURRENT, str(record.generation))
            for gone in record.left:  # their agents end any that still run (frozen ones)
                self._store.set(keys.left_out(gone), str(record.generation))
            for joiner in record.joined:  # the founder too: it then never looks pending
                self._store.set(keys.verdict(joiner), f"{admission.ADMITTED}{record.generation}")
            log.info("published generation %d: %s", record.generation, record.encode())
        return winner

    def _adopt(self, record: Record, started: float) -> Membership:
        if record.error:
            raise (NoQuorumError if NO_QUORUM in record.error else RendezvousError)(
                record.error)
        if self.worker_id not in record.members:
            raise RendezvousError(
                f"worker {self.worker_id!r} was left out of generation {record.generation} "
                f"(members {list(record.members)}, decided by {record.leader}): its "
                "heartbeat was stale or it registered after the leader's settle deadline; "
                "join() again as a new worker (with a new id) to be admitted"
            )
        membership = record.membership(self.worker_id, time.monotonic() - started)
        self.membership, self._boundary, self._record = membership, 0, record
        self._registering = None
        if self.config.quorum or self._succession is not None:
            self._learn_seats(record.members)  # (the quorum and a move place them)
        if self._succession is not None:
            self._succession.learn()  # (agents of nodes that came since)
        log.info("rendezvous %s", membership.event.as_json() if membership.event else "")
        return membership

    def _moves(self) -> int:
        return self._succession.moves if self._succession is not None else 0

    def committed(self) -> None:
        """A step committed in the current generation: every member of it trained."""
        if self.membership is not None:
            self._trained = self.membership.members

    def _nodes(self, members: Collection[str]) -> dict[str, Node]:
        """Each member's node, from its seat (the quorum counts nodes)."""
        self._learn_seats(members)
        return {m: node_of(m, self._seats.get(m)) for m in members}

    def _learn_seats(self, members: Collection[str]) -> None:
        """Keep the members' seats (read while the store holds them: one that moved
        without a member holds no seat of it, and the quorum must still place it)."""
        for m in members:
            if m not in self._seats and self._store.check([keys.seat(m)]):
                self._seats[m] = self._store.get(keys.seat(m)).decode()

    def _present(self, nodes: dict[str, Node]) -> set[Node]:
        """Nodes whose launcher's agent beats on this store (``agent_beat``): such a
        node is on no other side of a split, whatever became of its workers."""
        names = {f"node{int(n[1])}": n for n in set(nodes.values()) if n[0] == 0}
        beats = read_beats(self._store, names)
        return {names[name] for name in fresh(time.time(), beats,
                                              self.config.heartbeat_timeout)}

    def _seed(self, root: Store) -> None:
        """The store moved to a successor (``potluck.succession``): write back what this
        member holds of the rendezvous, the same on every member (the first write of a
        record wins; the others are equal), its own heartbeat and seat, and the seats it
        banned."""
        store = PrefixStore(self.config.prefix, root)
        if self._left:  # (a joiner that rejoined under another id: this one is gone)
            store.set(keys.leave(self.worker_id), "left before the store moved")
            return
        record = self._record
        if record is not None and self.membership is not None:
            store.compare_set(keys.generation(record.generation), "", record.encode())
            have = "" if not store.check([keys.CURRENT]) else store.get(keys.CURRENT).decode()
            while not have or int(have) < record.generation:  # (only ever up)
                have = store.compare_set(keys.CURRENT, have, str(record.generation)).decode()
            store.compare_set(keys.FOUNDER, "", record.leader)
        if self._registering is not None:  # (a next generation under way: still in it)
            store.set(keys.registration(*self._registering), "the store moved")
        write_beat(store, self.worker_id, time.time())
        store.set(keys.seat(self.worker_id), self.seat)
        for seat, why in self._bans.items():  # a quarantined member's restart stays out
            store.set(keys.ban(seat), why)

    def _require_membership(self, operation: str) -> Membership:
        if self.membership is None:
            raise ConfigError(
                f"{operation}() needs a membership, but worker {self.worker_id!r} has none: "
                "call join() first (after announce_leave(), start a new worker)"
            )
        return self.membership

    def _timeout(self, what: str, waited: float) -> RendezvousError:
        return RendezvousError(
            f"worker {self.worker_id!r} waited {waited:g} s for {what} and it did not come; "
            "the store may be unreachable or every worker able to lead is gone: check the "
            "launcher's store and the other workers' logs, or raise settle_timeout"
        )


class _Asked:
    """A set whose members are found out one ``in`` at a time (``ask``)."""

    def __init__(self, ask: Callable[[str], bool]) -> None:
        self._ask = ask

    def __contains__(self, member: object) -> bool:
        return isinstance(member, str) and self._ask(member)


def _require_token(token: str | None) -> str:
    if not token:
        raise ConfigError(
            "this worker must admit others but has no token; pass the job's shared token "
            "(RendezvousConfig(token=...)) to every worker"
        )
    return token
