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
from collections.abc import Collection, Iterable, Sequence
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


def has_quorum(members: Sequence[str], ready: Collection[str]) -> bool:
    """Whether ``ready`` can go on for ``members``: more than half of them, or exactly
    half holding the first member (of two halves of a split, only one holds it)."""
    count = sum(m in ready for m in members)
    return 2 * count > len(members) or (2 * count == len(members) and members[0] in ready)


def pick_leader(members: Iterable[str], alive: Collection[str]) -> str | None:
    """The lowest-ranked member still alive: it decides the next generation."""
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
) -> Decision:
    """What the leader does now about the generation after ``members``.

    ``registered``: members that asked to be in the next generation (proof of life).
    ``alive``: members whose heartbeat is fresh and who did not announce leaving.
    The leader waits for every alive member to register, but never past ``deadline``;
    then it forms the generation of the registered members, in their old order, or
    fails if they are fewer than ``min_size``. With ``quorum`` (a cohort across nodes,
    whose store can move: ``potluck.succession``) they must also be a quorum of
    ``members`` (``has_quorum``), or it fails at the deadline: two sides of a split
    cohort never both go on.
    """
    ready = tuple(m for m in members if m in registered)
    waiting = tuple(m for m in members if m in alive and m not in registered)
    if quorum and not has_quorum(members, ready):
        if now < deadline:
            return Decision(Action.WAIT, ready, waiting)
        return Decision(
            Action.FAIL, ready, waiting,
            why=f"only {len(ready)} of the generation's {len(members)} members "
                f"{list(ready)} registered by the deadline, {NO_QUORUM} (nor half with "
                f"its first member, {members[0]}): the others may go on as a cohort of "
                "their own, so this side stops (a split cohort never trains twice)")
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
