"""Notes: events of a run worth a line on the status page and in the plots.

A part of potluck that did something a person watching the run wants to see (a
checkpoint written, shares rebalanced, a member struck or quarantined by the trust
checks) calls ``note(what, text, step=..., member=...)``. Whoever ``listen``\\ s gets it:
the step observer of the process (``metrics.observer``) passes it to its sinks, so it
reaches the ``rank_step`` journal as an ``event`` record, the status page's events and
``potluck plot``'s events chart. With nobody listening a note costs a function call.

Membership changes are not notes: every member sees those (``Cohort.events``) and the
board files them by generation.

The notes are per process (like ``logging``): a listener hears the notes of its own
process, from any thread (a background checkpoint write notes from its thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

WHATS = ("checkpoint", "rebalance", "memory", "strike", "quarantine", "repair", "swap")


@dataclass(frozen=True)
class Note:
    """``what`` (one of ``WHATS``) happened: ``text`` in words, after ``step`` committed
    steps when known; ``member`` is the worker it is about (trust notes)."""

    what: str
    text: str
    step: int | None = None
    member: str | None = None

    def record(self) -> dict[str, Any]:
        """The fields of its ``event`` journal record and of a pulse (None left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


Listener = Callable[[Note], None]

_lock = threading.Lock()
_listeners: list[Listener] = []


def note(what: str, text: str, *, step: int | None = None, member: str | None = None) -> None:
    """Tell every listener of this process; a listener that fails is logged and dropped
    (seeing the run must never stop it)."""
    if what not in WHATS:
        raise ValueError(f"note what={what!r} is not one of {', '.join(WHATS)}; add it to "
                         "potluck.events.WHATS (and docs/status.md)")
    with _lock:
        listeners = list(_listeners)
    if not listeners:
        return
    event = Note(what, text, step, member)
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            log.warning("a note listener failed; it hears no more notes", exc_info=True)
            unlisten(listener)


def listen(listener: Listener) -> Callable[[], None]:
    """Hear every note of this process from now on; returns the call that stops it."""
    with _lock:
        _listeners.append(listener)
    return lambda: unlisten(listener)


def unlisten(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)
