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

The handle is the only long-lived holder of the backend object, and ``release`` destroys
it there and then. That is the one way to stop Gloo's threads (``shutdown()`` and
``abort()`` leave them running in torch 2.13), and a Gloo thread alive at interpreter exit
can abort the process: it may drop the last reference to a finished collective's work
after ``wait()`` returned, the work's destructor frees Python objects (its tensors, the
caller's saved thread-local state) and takes the GIL, and once the interpreter is
finalizing Python ends that thread with ``pthread_exit`` inside the work's ``noexcept``
destructor: "terminate called without an active exception". Destroying the backend while
the interpreter is alive joins those threads first; handles still open at exit are
released by an ``atexit`` hook, which runs before finalization, so a script that forgets
``cohort.close()`` ends cleanly too.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from potluck.errors import ConfigError

log = logging.getLogger(__name__)


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
    """The current generation's group; ``reconfigure`` is for the owning cohort only.

    ``owned``: potluck built the group (a cohort's), so the handle shuts it down on
    ``release`` and at interpreter exit. A user's own group (a drop-in ``DataParallel``
    on torch's default group) is wrapped unowned: never shut down, never released at exit.
    """

    def __init__(self, group: ProcessGroupLike | None, generation: int = 0,
                 abandoned: Callable[[int], bool] | None = None, *,
                 owned: bool = True) -> None:
        self._group: ProcessGroupLike | None = group
        self._generation = generation
        self._abandoned = abandoned  # generation -> did a peer give up on its step?
        self._retired: str | None = None
        self._owned = owned
        self._fault: str | None = None  # the next collective fails (fail_next_collective)
        self._issued = 0  # collectives issued through this generation's group
        if group is not None and owned:
            _open_handles.add(self)

    # ------------------------------------------------------------------ the group now

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def current(self) -> ProcessGroupLike:
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
    def communicated(self) -> bool:
        """Whether a collective was issued through this generation's group."""
        return self._issued > 0

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
        return self._issuing().allreduce(*args, **kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        return self._issuing().broadcast(*args, **kwargs)

    def allgather(self, *args: Any, **kwargs: Any) -> Any:
        return self._issuing().allgather(*args, **kwargs)

    def barrier(self, *args: Any, **kwargs: Any) -> Any:
        return self._issuing().barrier(*args, **kwargs)

    def alltoall_base(self, *args: Any, **kwargs: Any) -> Any:
        """An all-to-all (a backend group's; a compressed sum's scatter uses it)."""
        return self._issuing().alltoall_base(*args, **kwargs)  # type: ignore[attr-defined]

    def fail_next_collective(self, why: str) -> None:
        """Make the next collective issued on this generation's group raise, once.

        It raises at issue, as a collective on a reset connection does, and sends
        nothing, so the peers wait for this rank as for a lost one. This is how
        ``potluck.testing`` injects a failed collective. The next generation's group is
        not affected.
        """
        self._fault = why

    def _issuing(self) -> ProcessGroupLike:
        """The group to issue a collective on; a fault set by ``fail_next_collective``
        raises here instead."""
        group = self.current
        self._issued += 1
        if self._fault is not None:
            why, self._fault = self._fault, None
            raise RuntimeError(f"Connection reset by peer (a failed collective: {why})")
        return group

    # ------------------------------------------------------------------- the owner's

    def reconfigure(self, group: ProcessGroupLike, generation: int) -> None:
        """Point every holder at ``group`` of ``generation`` (called by the cohort; the
        old group, if any, is released first)."""
        if self._group is not None:
            self.release(f"replaced by generation {generation}")
        self._group, self._generation, self._retired = group, generation, None
        self._fault, self._issued = None, 0
        if self._owned:
            _open_handles.add(self)

    def release(self, why: str, *, abort: bool = False) -> bool:
        """Destroy the group, joining its threads; later use raises ``why``.

        ``abort``: the group is broken (a peer was lost): abort it rather than shut it
        down, and destroy it on a thread of its own. A frozen peer's sockets stay open,
        so the backend's threads wait in their receives until the collective timeout,
        and the survivors must not wait with them (the destructor releases the GIL).
        That thread is not a daemon: the interpreter joins it before ``atexit`` hooks
        and finalization. False if there was nothing to release.
        """
        group, self._group, self._retired = self._group, None, why
        _open_handles.discard(self)
        if group is None or not self._owned:  # a user's group is the user's to destroy
            return group is not None
        for name in (("abort", "shutdown") if abort else ("shutdown",)):
            if _call(group, name):
                break
        held = [group]
        del group  # from here on ``held`` has the last reference
        if abort:
            threading.Thread(target=_destroy, args=(held, self._generation),
                             name=f"potluck-retire-g{self._generation}").start()
        else:
            _destroy(held, self._generation)
        return True

    def __repr__(self) -> str:
        state = "usable" if self._group is not None else f"retired: {self._retired}"
        return f"GroupHandle(generation={self._generation}, {state})"


def _destroy(held: list[Any], generation: int) -> None:
    """Drop the last reference to the backend in ``held``: its destructor joins its
    threads."""
    alive = _weak(held[0])
    held.clear()
    if alive is not None and alive() is not None:
        log.warning("generation %d's process group is still referenced outside its "
                    "handle, so its threads keep running and the process may abort at "
                    "exit; pass cohort.group around, not the object behind it", generation)


def _call(group: object, name: str) -> bool:
    """``group.<name>()`` if it has one (frees what the backend frees there: NCCL's
    communicators); no reference to ``group`` outlives the call."""
    method = getattr(group, name, None)
    if method is None:
        return False
    try:
        method()
    except RuntimeError as exc:  # a peer already gone: nothing left to say goodbye to
        log.debug("group %s: %s", name, exc)
    return True


def _weak(obj: Any) -> weakref.ref[Any] | None:
    try:
        return weakref.ref(obj)
    except TypeError:  # an object without weak references: nothing to check
        return None


_open_handles: weakref.WeakSet[GroupHandle] = weakref.WeakSet()


@atexit.register
def release_open_handles() -> None:
    """Release every handle still open: at interpreter exit, before finalization."""
    for handle in list(_open_handles):
        handle.release("the interpreter is exiting")


def as_handle(group: Any) -> GroupHandle | None:
    """``group`` as a handle: a handle as it is, a plain group in a fixed handle."""
    if group is None or isinstance(group, GroupHandle):
        return group
    if not isinstance(group, ProcessGroupLike):
        raise ConfigError(
            f"group={group!r} is not a process group: pass cohort.group (potluck.init()), "
            "a torch.distributed ProcessGroup, or None for the default group"
        )
    return GroupHandle(group, owned=False)
