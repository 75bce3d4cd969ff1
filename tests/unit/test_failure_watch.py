"""``FailureWatch`` on an in-memory store: a peer whose heartbeat is stale, or missing
(a store that moved without it), is marked while this member waits in a collective
past the heartbeat timeout; a missing beat alone, while nobody waits, marks nothing."""

from __future__ import annotations

import time

import pytest
from torch._C._distributed_c10d import HashStore

from potluck import keys
from potluck.cohort.failure_watch import FailureWatch


def _watch(store: HashStore, timeout: float) -> FailureWatch:
    return FailureWatch(store, lambda g: f"failed/{g}", lambda: 0, interval=0.01,
                        peer=lambda: "peer", heartbeat_timeout=timeout)


def _wait_in_a_collective(watch: FailureWatch, seconds: float) -> bool:
    """Ask ``seen`` every few ms for ``seconds``, as a member waiting in a collective."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if watch.seen(0):
            return True
        time.sleep(0.005)
    return False


@pytest.mark.timeout(30)
def test_a_peer_missing_from_a_moved_store_is_marked_once_the_wait_outlasts_the_timeout(
        ) -> None:
    store = HashStore()  # (no beat of "peer" at all: the store moved without it)
    watch = _watch(store, timeout=0.3)
    try:
        assert not _wait_in_a_collective(watch, 0.25)  # within the timeout: not yet
        assert _wait_in_a_collective(watch, 3.0)
        assert store.check(["failed/0"])
    finally:
        watch.stop()


@pytest.mark.timeout(30)
def test_a_fresh_beat_and_no_wait_mark_nothing() -> None:
    store = HashStore()
    watch = _watch(store, timeout=0.3)
    try:
        time.sleep(1.0)  # nobody waits: a missing beat says nothing
        assert not store.check(["failed/0"])
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # the peer beats while this member waits
            store.set(keys.heartbeat("peer"), f"{time.time():.6f}")
            assert not watch.seen(0)
            time.sleep(0.02)
        assert not store.check(["failed/0"])
    finally:
        watch.stop()
