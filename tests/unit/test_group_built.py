"""A generation's group is built only when every rank has built its own: Gloo's mesh
handshake can finish on one side of a pair first, and a rank that closed its group at
once (a job ending right after a recovery) cut its peer's handshake (2 of 150 builds
under load failed so)."""

from __future__ import annotations

import threading
import time

import pytest
from torch._C._distributed_c10d import HashStore

from potluck.cohort.groups import GroupSpec, _all_built
from potluck.errors import RendezvousError

pytestmark = pytest.mark.timeout(30)


def test_a_rank_returns_only_once_its_peer_has_built() -> None:
    store = HashStore()
    spec = GroupSpec("gloo", 10.0, "127.0.0.1")
    returned: list[float] = []
    first = threading.Thread(target=lambda: (
        _all_built(spec, store, "g3", 0, 2, 3), returned.append(time.monotonic())))
    first.start()
    time.sleep(0.5)
    marked = time.monotonic()
    _all_built(spec, store, "g3", 1, 2, 3)
    first.join(5.0)
    assert returned and returned[0] >= marked


def test_a_peer_that_never_builds_fails_the_rank_within_the_timeout() -> None:
    spec = GroupSpec("gloo", 0.5, "127.0.0.1")
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"rank 0 of 2 built its gloo group of "
                       r"generation 4, but not every peer did within 0.5 s"):
        _all_built(spec, HashStore(), "g4", 0, 2, 4)
    assert time.monotonic() - started < 5.0


def test_marks_of_another_generation_do_not_count() -> None:
    store = HashStore()
    spec = GroupSpec("gloo", 0.3, "127.0.0.1")
    store.set("g5/built/1", b"1")  # the peer built generation 5, not 6
    with pytest.raises(RendezvousError, match="generation 6"):
        _all_built(spec, store, "g6", 0, 2, 6)
