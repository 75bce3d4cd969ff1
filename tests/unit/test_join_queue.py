"""The join queue as a member reads it (``rendezvous.join_queue``): each slot once, a
settled slot never again, a new store's queue anew."""

from __future__ import annotations

import pytest

from potluck import keys
from potluck.rendezvous.join_queue import JoinQueue
from tests.counting_store import CountingStore

pytestmark = pytest.mark.timeout(10)


def _queue(store: CountingStore, joiner: str) -> None:
    slot = store.add(keys.JOIN_COUNT, 1) - 1
    store.set(keys.join_slot(slot), joiner)


def test_a_member_asks_about_settled_joiners_once_whatever_the_run_queued() -> None:
    """Rank 0 asks at every step: 50 joiners of a churning run, settled long ago, cost
    one request (the count) per step, not three each."""
    store, moves = CountingStore(), [0]
    queue = JoinQueue(store, lambda: moves[0])
    for n in range(50):
        _queue(store, f"w{n}")
        if n % 2:
            store.set(keys.verdict(f"w{n}"), "admitted:1")
    members = {f"w{n}" for n in range(0, 50, 2)}  # (admitted, their verdict not read)
    assert queue.pending(members) == []
    store.asked.clear()
    assert queue.pending(members) == []
    assert store.calls == 1
    _queue(store, "late")
    store.add(keys.JOIN_COUNT, 1)  # a slot counted, its id not yet written
    _queue(store, "later")
    assert queue.pending(members) == ["late", "later"]
    store.asked.clear()
    assert queue.pending(members) == ["late", "later"]
    assert store.calls == 1 + 1 + 1 + 1  # the count, the empty slot, two verdicts
    store.set(keys.join_slot(51), "slow")
    store.set(keys.verdict("late"), "refused:no")
    assert queue.pending(members) == ["slow", "later"]
    moves[0] += 1  # the store moved: its queue starts anew
    store.inner.delete_key(keys.JOIN_COUNT)
    _queue(store, "again")
    assert queue.pending(members) == ["again"]
