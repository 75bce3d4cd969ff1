"""The process's current cohort: the one ``potluck.init()`` returned, until it is closed.

Defaults that mean "this process's place in the job" (who writes a checkpoint, which
ranks ``DistributedRng`` gathers, the group of a ``DataParallel`` given none) read it
here, because a potluck cohort registers no torch default group. ``init`` sets it and
``Cohort.close`` clears it; a cohort built directly (``Cohort(...)``, ``join_elastic``)
is not registered, so explicit arguments always win. Callers read ``current()`` at the
moment they act: an elastic cohort renumbers its ranks between generations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from potluck.cohort.cohort import Cohort

_current: Cohort | None = None


def current() -> Cohort | None:
    """The cohort ``potluck.init()`` returned in this process, or None (none, or closed)."""
    return _current


def set_current(cohort: Cohort) -> None:
    """Make ``cohort`` the process's current cohort (the newest ``init`` wins)."""
    global _current
    _current = cohort


def clear_current(cohort: Cohort) -> None:
    """``cohort`` was closed: it is no longer current (a newer current one stays)."""
    global _current
    if _current is cohort:
        _current = None
