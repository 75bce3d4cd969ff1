"""Membership generations as plain data, and the pure decisions that move between them.

A ``Generation`` is a number and an ordered tuple of stable worker ids; a worker's rank
is its index in that tuple. Every transition keeps the survivors in their old order and
appends newcomers, so ranks move as little as possible (rank 0 stays rank 0 unless it
left). ``decide`` is the leader's whole policy for forming the next generation: a
function of the clock, who registered, who still looks alive and the deadline, so join,
loss, leave and timeout are all tested without a store or a socket.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError


@dataclass(frozen=True)
class Generation:
    """One membership generation: ``members[rank]`` is the worker id of ``rank``."""

    number: int
    members: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.number < 0:
            raise ConfigError(f"generation number {self.number} must be >= 0")
        if len(set(self.members)) != len(self.members):
            raise ConfigError(
                f"generation {self.number} lists a worker twice ({list(self.members)}); "
                "worker ids must be unique: include host, pid and a nonce"
            )

    @property
    def world_size(self) -> int:
        return len(self.members)

    def rank_of(self, worker_id: str) -> int:
        """The rank of ``worker_id``; ``ConfigError`` if it is not a member."""
        try:
            return self.members.index(worker_id)
        except ValueError:
            raise ConfigError(
                f"worker {worker_id!r} is not a member of generation {self.number} "
                f"({list(self.members)}); it must join (and be admitted) first"
            ) from None


def survivors(gen: Generation, lost: Collection[str]) -> Generation:
    """The next generation without ``lost``; the others keep their relative order."""
    return Generation(gen.number + 1, tuple(m for m in gen.members if m not in lost))


def leave(gen: Generation, ids: Collection[str]) -> Generation:
    """The next generation without the workers that announced their departure."""
    return survivors(gen, ids)


def admit(gen: Generation, joiners: Sequence[str]) -> Generation:
    """The next generation with ``joiners`` appended after the current members."""
    fresh = [j for j in dict.fromkeys(joiners) if j not in gen.members]
    return Generation(gen.number + 1, gen.members + tuple(fresh))


NO_QUORUM = "not a majority"  # in a failed generation's error: NoQuorumError


Node = tuple[int, str]  # (0, node rank) for a member on a known node; (1, its id) else


def node_of(member: str, seat: str | None) -> Node:
    """The node a member runs on, from its seat ("host:node3:local0", what
    ``potluck run`` gives it): a member without one is a node of its own."""
    for part in (seat or "").split(":"):
        if part.startswith("node") and part[4:].isdigit():
            return (0, part[4:].zfill(6))
    return (1, member)


def coming(members: Iterable[str], beats: Collection[str], nodes: Mapping[str, Node],
           lost: Collection[int]) -> set[str]:
    """Members that have not beaten on a store that just moved (``beats``: those that
    have), but are on their way: each survivor moves by itself, a beat apart. Not one
    on a node whose store was lost (``lost``: the store's host went, and its workers
    with it), nor one whose node is unknown. Pure."""
    return {m for m in members if m not in beats and nodes.get(m, (1, m))[0] == 0
            and int(nodes[m][1]) not in lost}


def still_coming(since_move: float, heartbeat_timeout: float, settle_timeout: float) -> bool:
    """Whether members with no beat yet on a store that moved ``since_move`` seconds ago
    may still be on their way (``coming``). Each survivor finds the new store by itself:
    one on a slow, busy link, whose store requests queue behind a round's sync, gets
    there later than a beat's timeout. It has a settle's time more. Pure."""
    return since_move <= heartbeat_timeout + settle_timeout


def has_quorum(members: Sequence[str], ready: Collection[str],
               nodes: Mapping[str, Node] | None = None,
               present: Collection[Node] = ()) -> bool:
    """Whether ``ready`` can go on for ``members`` (the last generation), counted by
    node (``nodes``: each member's; None: each member a node): a partition splits
    hosts, not the workers on one. A node is on this side when one of its members is
    ready, or its agent still beats on this store (``present``: it is on no other side;
    a worker that died there is no split). More than half of the nodes, or exactly half
    holding the lowest one (of two halves of a split, only one holds it)."""
    node = (lambda m: nodes.get(m, (1, m))) if nodes is not None else (lambda m: (1, m))
    every = sorted({node(m) for m in members})
    here = {node(m) for m in members if m in ready} | (set(present) & set(every))
    return 2 * len(here) > len(every) or (2 * len(here) == len(every) and every[0] in here)


def pick_leader(members: Iterable[str], alive: Container[str]) -> str | None:
    """The lowest-ranked member still alive: it decides the next generation. ``alive``
    is asked about members in rank order, up to the leader only."""
    return next((m for m in members if m in alive), None)


class Action(enum.Enum):
    WAIT = "wait"
    """Someone who still looks alive has not registered yet, and time is left."""
    FORM = "form"
    """Publish ``Decision.members`` as the next generation."""
    FAIL = "fail"
    """Fewer than ``min_size`` workers by the deadline: give up with ``Decision.why``."""


@dataclass(frozen=True)
class Decision:
    action: Action
    members: tuple[str, ...] = ()
    waiting_for: tuple[str, ...] = ()
    why: str = ""


def decide(
    now: float,
    *,
    members: Sequence[str],
    registered: Collection[str],
    alive: Collection[str],
    deadline: float,
    min_size: int,
    quorum: bool = False,
    nodes: Mapping[str, Node] | None = None,
    present: Collection[Node] = (),
    base: Sequence[str] = (),
) -> Decision:
    """What the leader does now about the generation after ``members``.

    ``registered``: members that asked to be in the next generation (proof of life).
    ``alive``: members whose heartbeat is fresh and who did not announce leaving.
    The leader waits for every alive member to register, but never past ``deadline``;
    then it forms the generation of the registered members, in their old order, or
    fails if they are fewer than ``min_size``. With ``quorum`` (a cohort across nodes,
    whose store can move: ``potluck.succession``) they must also be a quorum of
    ``base`` (the last generation that trained; default ``members``) by node
    (``has_quorum``, with ``nodes`` and ``present``), or it fails at the deadline: two
    sides of a split cohort never both go on.
    """
    ready = tuple(m for m in members if m in registered)
    waiting = tuple(m for m in members if m in alive and m not in registered)
    if quorum and not has_quorum(base or members, ready, nodes, present):
        if now < deadline:
            return Decision(Action.WAIT, ready, waiting)
        return Decision(
            Action.FAIL, ready, waiting,
            why=f"only {len(ready)} of the generation's {len(members)} members "
                f"{list(ready)} registered by the deadline, and their nodes are "
                f"{NO_QUORUM} of the generation's (nor half with its lowest node): the "
                "others may go on as a cohort of their own, so this side stops (a split "
                "cohort never trains twice); if no side goes on, restart the job on the "
                "hosts that are up (its checkpoint resumes it)")
    enough = len(ready) >= min_size
    if not waiting and enough:
        return Decision(Action.FORM, ready)
    if now < deadline:
        return Decision(Action.WAIT, ready, waiting)
    if enough:
        return Decision(Action.FORM, ready, waiting,
                        why=f"settle deadline passed without {list(waiting)}")
    return Decision(
        Action.FAIL, ready, waiting,
        why=f"only {len(ready)} worker(s) {list(ready)} registered by the deadline, "
            f"fewer than min_size={min_size}",
    )
