"""A generation's group is built only when every rank has built its own: Gloo's mesh
handshake can finish on one side of a pair first, and a rank that closed its group at
once (a job ending right after a recovery) cut its peer's handshake (2 of 150 builds
under load failed so). A peer that gave up on the generation ends the wait at once."""

from __future__ import annotations

import threading
import time

import pytest
from torch._C._distributed_c10d import HashStore

from potluck.cohort.groups import GroupSpec, _all_built, make_group
from potluck.errors import RendezvousError

pytestmark = pytest.mark.timeout(30)

SPEC = GroupSpec("gloo", 10.0, "127.0.0.1")


def _never() -> bool:
    return False


def test_a_rank_returns_only_once_its_peer_has_built() -> None:
    store = HashStore()
    returned: list[float] = []

    def first() -> None:
        _all_built(SPEC, store, "g3", 0, 2, 3, time.monotonic() + 10.0, _never)
        returned.append(time.monotonic())

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.5)
    marked = time.monotonic()
    _all_built(SPEC, store, "g3", 1, 2, 3, time.monotonic() + 10.0, _never)
    thread.join(5.0)
    assert returned and returned[0] >= marked


def test_a_peer_that_never_builds_fails_the_rank_at_the_deadline() -> None:
    spec = GroupSpec("gloo", 0.5, "127.0.0.1")
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=r"rank 0 of 2 built its gloo group of "
                       r"generation 4, but not every peer did within 0.5 s"):
        _all_built(spec, HashStore(), "g4", 0, 2, 4, started + 0.5, _never)
    assert 0.5 <= time.monotonic() - started < 5.0


def test_a_peer_that_gave_up_on_the_generation_releases_the_rank_at_once() -> None:
    started = time.monotonic()
    given_up = started + 0.3  # the peer's step-failed mark appears
    with pytest.raises(RendezvousError, match="a peer gave up on it"):
        _all_built(SPEC, HashStore(), "g5", 0, 2, 5, started + 10.0,
                   lambda: time.monotonic() >= given_up)
    assert time.monotonic() - started < 2.0  # not the 10 s deadline


def test_marks_of_another_generation_do_not_count() -> None:
    store = HashStore()
    store.set("g5/built/1", "1")  # the peer built generation 5, not 6
    with pytest.raises(RendezvousError, match="generation 6"):
        _all_built(SPEC, store, "g6", 0, 2, 6, time.monotonic() + 0.3, _never)


def test_groups_closed_as_soon_as_built_never_cut_a_peers_build() -> None:
    """Two ranks on threads, 20 generations: each drops its group the moment
    ``make_group`` returns; both must build every one."""
    store = HashStore()
    failures: list[str] = []

    def rank(r: int) -> None:
        for generation in range(20):
            try:
                group = make_group(SPEC, store, f"g{generation}", r, 2, generation)
            except RendezvousError as exc:
                failures.append(f"rank {r}, generation {generation}: {exc}")
                return
            assert group.size() == 2
            del group  # at once: rank 0's may go while rank 1's handshake is under way

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(25.0)
    assert failures == []
