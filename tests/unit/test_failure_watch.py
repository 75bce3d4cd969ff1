"""``FailureWatch`` judges the watched peer by its heartbeat while this member waits in
a collective. A peer whose beat is missing (the store moved, and it never beat on the
new one: a peer cut off with the old host) counts as silent since the watch first
missed it; a peer that beats is never judged so."""

from __future__ import annotations

import time

import pytest
from torch._C._distributed_c10d import HashStore

from potluck import keys
from potluck.cohort.failure_watch import FailureWatch


def _waits_until_marked(beating: bool, limit: float) -> bool:
    """Whether the watch abandons generation 0's step within ``limit`` seconds while
    this member waits (asks ``seen`` every 10 ms) and the peer beats or not."""
    store = HashStore()
    watch = FailureWatch(store, lambda g: f"failed/{g}", lambda: 0, interval=0.02,
                         peer=lambda: "peer", heartbeat_timeout=0.3)
    try:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if beating:
                store.set(keys.heartbeat("peer"), f"{time.time():.6f}")
            if watch.seen(0):
                return True
            time.sleep(0.01)
        return False
    finally:
        watch.stop()


@pytest.mark.timeout(30)
def test_a_peer_missing_from_a_moved_store_is_given_up_on_after_the_timeout() -> None:
    assert _waits_until_marked(beating=False, limit=3.0)


@pytest.mark.timeout(30)
def test_a_peer_that_beats_is_not_given_up_on() -> None:
    assert not _waits_until_marked(beating=True, limit=1.5)


@pytest.mark.timeout(30)
def test_the_watch_asks_the_store_only_while_this_member_waits() -> None:
    """32 members polling every 50 ms were 640 requests a second on the job's store,
    mostly from members that waited for nothing. A wait wakes the watch at once."""
    from tests.counting_store import CountingStore

    store = CountingStore()
    watch = FailureWatch(store, lambda g: f"failed/{g}", lambda: 0, interval=0.02)
    try:
        time.sleep(1.5)
        idle = store.calls
        store.set("failed/0", "1")  # another member gave up on the step
        started = time.monotonic()
        while not watch.seen(0):  # this member now waits in a collective
            assert time.monotonic() - started < 0.5
            time.sleep(0.005)
    finally:
        watch.stop()
    assert idle <= 2, store.asked
