"""What a member that does not lead asks the store while a generation forms: with 32
members every member asking about every member at every poll kept the store from
answering anything else (``LOOK_S`` in ``rendezvous.store_rendezvous``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from torch._C._distributed_c10d import PrefixStore

from potluck import keys
from potluck.rendezvous import RendezvousConfig, StoreRendezvous
from potluck.rendezvous.membership import Record
from tests.counting_store import CountingStore

pytestmark = pytest.mark.timeout(20)

MEMBERS = tuple(f"m{i}" for i in range(32))
CONFIG = RendezvousConfig(token="t", heartbeat_interval=0.2, heartbeat_timeout=5.0,
                          settle_timeout=10.0, expected=len(MEMBERS))


def _follower(store: CountingStore) -> tuple[StoreRendezvous, PrefixStore]:
    """Member m5 of generation 0, every member's beat fresh; the rendezvous' keys."""
    follower = StoreRendezvous(store, "m5", CONFIG)
    follower.membership = Record(0, MEMBERS, "m0", "formed").membership("m5", 0.0)
    root = PrefixStore(CONFIG.prefix, store)
    for member in MEMBERS:
        root.set(keys.heartbeat(member), f"{time.time():.6f}")
    return follower, root


def _later(seconds: float, act: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        act()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_follower_waiting_for_the_next_generation_asks_little() -> None:
    store = CountingStore()
    follower, root = _follower(store)
    root.set(keys.registration(1, "m0"), "lost")  # the leader is here, deciding
    formed = Record(1, MEMBERS[:-1], "m0", "lost", left=MEMBERS[-1:])
    leader = _later(1.0, lambda: root.set(keys.generation(1), formed.encode()))
    store.asked.clear()
    try:
        membership = follower.next_generation("a collective failed")
    finally:
        leader.join()
    assert membership.generation == 1 and membership.rank == 5
    # a poll of the record every 20 ms, who leads every 0.25 s: about 70 a second
    # (it was 1 + 4 a member per poll: 6,000 a second)
    assert store.calls < 300, store.asked.most_common(5)


def test_a_follower_waiting_at_a_boundary_asks_little() -> None:
    store = CountingStore()
    follower, root = _follower(store)
    answer = keys.boundary(0, 0)
    leader = _later(1.0, lambda: root.set(answer, "same"))
    store.asked.clear()
    try:
        assert follower.admit().generation == 0
    finally:
        leader.join()
    assert store.calls < 400, store.asked.most_common(5)


def test_a_joiner_waiting_to_be_admitted_asks_little() -> None:
    """Sixteen founders waiting for generation 0 at 2 requests each per 20 ms kept node
    0's store from answering a new connection for 30 s (on 2 cores)."""
    store = CountingStore()
    root = PrefixStore(CONFIG.prefix, store)
    root.set(keys.FOUNDER, "m0")  # the founder is there: this worker waits
    root.set(keys.heartbeat("m0"), f"{time.time():.6f}")
    joiner = StoreRendezvous(store, "j", CONFIG)
    formed = Record(1, ("m0", "j"), "m0", "admit", joined=("j",))

    def admit() -> None:
        root.set(keys.generation(1), formed.encode())
        root.set(keys.verdict("j"), f"{keys.ADMITTED}1")

    leader = _later(1.0, admit)
    try:
        membership = joiner.join()
    finally:
        leader.join()
        joiner.close()
    assert membership.generation == 1 and membership.rank == 1
    asked = store.asked[f"{CONFIG.prefix}/{keys.verdict('j')}"] + \
        store.asked[f"{CONFIG.prefix}/{keys.challenge('j')}"]
    # a look for a challenge every 0.1 s, for the verdict every 0.25 s: about 14 in the
    # second (it was 2 every 20 ms: 100)
    assert asked < 30, store.asked.most_common(5)
