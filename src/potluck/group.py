"""``GroupHandle``: one stable handle to "the cohort's current group", held for life.

The model's reducer, its communication hooks, the guarded optimizer and the step
transaction all hold the same handle from construction on. When the membership moves
to a new generation, the cohort (the handle's only owner) calls ``reconfigure`` and
every holder talks on the new group at its next collective: nothing is pushed down
through the objects, and no object writes attributes onto another.

A handle looks like a process group to its holders (``rank()``, ``size()``,
``allreduce``, ``broadcast``, ``allgather``, ``barrier``), so a drop-in user's own
``ProcessGroup`` is wrapped in a fixed handle and code that takes a group takes either.
``step_abandoned`` answers, without I/O, whether a peer gave up on this generation's
step, so a wait can stop at once instead of at the collective timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from potluck.errors import ConfigError


@runtime_checkable
class ProcessGroupLike(Protocol):
    """What potluck calls on a group: a c10d ``ProcessGroup`` or backend object, or a
    ``GroupHandle``."""

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def allreduce(self, *args: Any, **kwargs: Any) -> Any: ...

    def broadcast(self, *args: Any, **kwargs: Any) -> Any: ...

    def allgather(self, *args: Any, **kwargs: Any) -> Any: ...

    def barrier(self, *args: Any, **kwargs: Any) -> Any: ...


class GroupHandle:
    """The current generation's group; ``reconfigure`` is for the owning cohort only."""

    def __init__(self, group: Any, generation: int = 0,
                 abandoned: Callable[[int], bool] | None = None) -> None:
        self._group: Any = group
        self._generation = generation
        self._abandoned = abandoned  # generation -> did a peer give up on its step?
        self._retired: str | None = None

    # ------------------------------------------------------------------ the group now

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def current(self) -> Any:
        """The backend object of this generation; raises once it was retired or closed."""
        if self._group is None:
            raise ConfigError(
                f"generation {self._generation}'s group is no longer usable "
                f"({self._retired or 'the cohort was closed'}); an elastic cohort moves "
                "to the next generation by itself (potluck.prepare, potluck run "
                "--elastic); a static job must be restarted"
            )
        return self._group

    @property
    def usable(self) -> bool:
        return self._group is not None

    @property
    def step_abandoned(self) -> Callable[[], bool] | None:
        """``() -> bool``: a peer gave up on this generation's step (None: never told)."""
        watch = self._abandoned
        if watch is None:
            return None
        return lambda: watch(self._generation)

    def rank(self) -> int:
        return int(self.current.rank())

    def size(self) -> int:
        return int(self.current.size())

    def allreduce(self, *args: Any, **kwargs: Any) -> Any:
        return self.current.allreduce(*args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        return self.current.broadcast(*args, **kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        return self.current.allgather(*args, **kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        return self.current.barrier(*args, **kwargs)

    # ------------------------------------------------------------------- the owner's

    def reconfigure(self, group: Any, generation: int) -> None:
        """Point every holder at ``group`` of ``generation`` (called by the cohort)."""
        self._group, self._generation, self._retired = group, generation, None

    def release(self, why: str) -> Any:
        """Detach the group (retired after a loss, or closed) and hand it to the caller."""
        group, self._group, self._retired = self._group, None, why
        return group

    def __repr__(self) -> str:
        state = "usable" if self._group is not None else f"retired: {self._retired}"
        return f"GroupHandle(generation={self._generation}, {state})"


def as_handle(group: Any) -> GroupHandle | None:
    """``group`` as a handle: a handle as it is, a plain group in a fixed handle."""
    if group is None or isinstance(group, GroupHandle):
        return group
    if not isinstance(group, ProcessGroupLike):
        raise ConfigError(
            f"group={group!r} is not a process group: pass cohort.group (potluck.init()), "
            "a torch.distributed ProcessGroup, or None for the default group"
        )
    return GroupHandle(group)
