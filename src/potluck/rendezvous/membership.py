"""What a rendezvous returns (``Membership``), how it is configured, and its wire record.

The leader publishes each generation as one JSON record under ``g/<n>`` with a single
``compare_set``: the first publication wins, so every worker reads the same record even
if two workers believed they were the leader. ``Membership`` is that record seen from
one worker (its rank), plus a ``RendezvousEvent`` for the log.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from potluck.errors import ConfigError
from potluck.rendezvous.state import Generation


@dataclass(frozen=True)
class RendezvousConfig:
    """Settings of a ``StoreRendezvous``; every wait is bounded by one of these (seconds)."""

    token: str | None
    """The job's shared secret; None means this worker has none (it will be refused)."""
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    """A worker whose last beat is older than this counts as gone."""
    settle_timeout: float = 10.0
    """How long the leader waits for a live member to register for the next generation."""
    join_timeout: float = 300.0
    """How long a joiner waits to be admitted (the cohort admits at step boundaries)."""
    admission_timeout: float = 5.0
    """How long the admitter waits for a joiner's answer to its challenge."""
    expected: int = 1
    """Generation 0 is formed once this many workers were admitted (or at join_timeout)."""
    min_size: int = 1
    """Fewer workers than this by a deadline is a ``RendezvousError``, not a generation."""
    max_size: int | None = None
    """The cohort's wanted size: joiners beyond it wait in the queue as spares, admitted
    when a member leaves or is lost (None: admit every joiner)."""
    prefix: str = "potluck/rdzv"
    poll_interval: float = 0.02
    quorum: bool = False
    """A generation after a loss needs a majority of the last one (``state.has_quorum``):
    on for cohorts across nodes, whose store can move to another node (two sides of a
    split could each host one)."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval", "heartbeat_timeout", "settle_timeout",
                     "join_timeout", "admission_timeout", "poll_interval"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ConfigError(
                f"heartbeat_timeout={self.heartbeat_timeout} must exceed heartbeat_interval="
                f"{self.heartbeat_interval}, e.g. 5x, or live workers look dead"
            )
        if self.max_size is not None and self.max_size < max(self.expected, self.min_size):
            raise ConfigError(
                f"max_size={self.max_size} must be >= expected={self.expected} and "
                f"min_size={self.min_size}: the cohort's wanted size holds its founders")
        if not 1 <= self.min_size <= self.expected:
            raise ConfigError(
                f"min_size={self.min_size} must be >= 1 and <= expected={self.expected}"
            )


@dataclass(frozen=True)
class RendezvousEvent:
    """One membership change, as a worker saw it (``as_json()`` for the log)."""

    generation: int
    cause: str
    joined: tuple[str, ...]
    left: tuple[str, ...]
    leader: str
    worker: str
    waited_s: float

    def as_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Membership:
    """This worker's place in a generation; equal on every member except ``rank``/``event``."""

    generation: int
    members: tuple[str, ...]
    rank: int
    leader: str
    reason: str
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    event: RendezvousEvent | None = field(default=None, compare=False)

    @property
    def world_size(self) -> int:
        return len(self.members)

    @property
    def as_generation(self) -> Generation:
        return Generation(self.generation, self.members)


@dataclass(frozen=True)
class Record:
    """A published generation (or a published failure to form one)."""

    generation: int
    members: tuple[str, ...]
    leader: str
    reason: str
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    error: str = ""

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def decode(raw: bytes) -> Record:
        data: dict[str, Any] = json.loads(raw.decode())
        for name in ("members", "joined", "left"):
            data[name] = tuple(data[name])
        return Record(**data)

    def membership(self, worker_id: str, waited_s: float) -> Membership:
        rank = self.members.index(worker_id)
        event = RendezvousEvent(self.generation, self.reason, self.joined, self.left,
                                self.leader, worker_id, round(waited_s, 4))
        return Membership(self.generation, self.members, rank, self.leader, self.reason,
                          self.joined, self.left, event)
