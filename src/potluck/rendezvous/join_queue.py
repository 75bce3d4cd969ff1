"""The join queue as one worker reads it: each slot once, each settled slot never again.

A joiner takes a slot (``add`` on ``keys.JOIN_COUNT``) and writes its id there; the
member that admits or refuses it writes its verdict. Neither changes once written. So
``JoinQueue`` keeps the ids it read and a cursor below which every slot is settled (a
verdict, or a member of the cohort): a call asks the count, then only about the slots
from the cursor on. Rank 0 asks at every step, and a long run with churn queues
hundreds of joiners: reading every slot each time made each step slower than the last.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from torch._C._distributed_c10d import Store

from potluck import keys


class JoinQueue:
    """``pending(members)``: the workers still waiting, in order. ``moves()`` counts the
    store's moves (``potluck.succession``): a new store's queue is read anew."""

    def __init__(self, store: Store, moves: Callable[[], int] = lambda: 0) -> None:
        self._store, self._moves = store, moves
        self._ids: dict[int, str] = {}  # slot -> joiner, as read
        self._settled = 0  # every slot below is settled
        self._read_on = moves()

    def pending(self, members: Collection[str]) -> list[str]:
        """Workers in the queue that are not ``members`` and have no verdict, in order."""
        if self._moves() != self._read_on:
            self._ids, self._settled, self._read_on = {}, 0, self._moves()
        count = int(self._store.add(keys.JOIN_COUNT, 0))
        waiting: list[str] = []
        for slot in range(self._settled, count):
            joiner = self._joiner(slot)
            settled = joiner is not None and (
                joiner in members or self._store.check([keys.verdict(joiner)]))
            if settled and slot == self._settled:
                self._settled += 1  # (a settled run from the cursor on: skip it next time)
                self._ids.pop(slot, None)
            elif joiner is not None and not settled:
                waiting.append(joiner)
        return waiting

    def _joiner(self, slot: int) -> str | None:
        """The id in ``slot``; None while it is counted but not yet written."""
        if slot not in self._ids:
            if not self._store.check([keys.join_slot(slot)]):
                return None
            self._ids[slot] = self._store.get(keys.join_slot(slot)).decode()
        return self._ids[slot]
