"""A rank closes a group no collective went through only once every peer has built
its own. Gloo's mesh handshake can finish on one side of a pair first, and a rank that
closed its group at once (a job ending right after a recovery) cut its peer's
handshake: 2 of 150 back-to-back builds under load failed so, and the peer recovered
alone into another generation (``test_elastic_abandon`` flaked that way)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from torch._C._distributed_c10d import HashStore

from potluck.cohort import cohort as cohort_module
from potluck.cohort.cohort import Cohort
from potluck.cohort.groups import GroupSpec, make_group, peers_built
from potluck.errors import RendezvousError
from potluck.rendezvous.membership import Membership

pytestmark = pytest.mark.timeout(30)

SPEC = GroupSpec("gloo", 10.0, "127.0.0.1")


def _never() -> bool:
    return False


def _on_two_ranks(rank: Callable[[int], None]) -> None:
    """``rank(0)`` and ``rank(1)`` on threads of their own, both joined."""
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(25.0)


def test_the_wait_ends_when_the_last_peer_marks_its_group_built() -> None:
    store = HashStore()
    store.set("g3/built/0", "1")

    def peer() -> None:
        time.sleep(0.4)
        store.set("g3/built/1", "1")

    thread = threading.Thread(target=peer)
    started = time.monotonic()
    thread.start()
    assert peers_built(store, "g3", 2, started + 10.0, _never)
    thread.join()
    assert 0.4 <= time.monotonic() - started < 5.0


def test_a_peer_that_gave_up_on_the_generation_ends_the_wait_at_once() -> None:
    started = time.monotonic()
    given_up = started + 0.3  # the peer's step-failed mark appears
    assert not peers_built(HashStore(), "g5", 2, started + 10.0,
                           lambda: time.monotonic() >= given_up)
    assert time.monotonic() - started < 2.0  # not the 10 s deadline


def test_a_peer_that_never_builds_ends_the_wait_at_the_deadline() -> None:
    started = time.monotonic()
    assert not peers_built(HashStore(), "g4", 2, started + 0.5, _never)
    assert 0.5 <= time.monotonic() - started < 5.0


def test_marks_of_another_generation_do_not_count() -> None:
    store = HashStore()
    store.set("g5/built/0", "1")
    store.set("g5/built/1", "1")  # generation 5's, not 6's
    assert peers_built(store, "g5", 2, time.monotonic() + 0.3, _never)
    assert not peers_built(store, "g6", 2, time.monotonic() + 0.3, _never)


def test_groups_closed_as_soon_as_every_peer_built_never_cut_a_build() -> None:
    """Two ranks on threads, 20 generations: each closes its group the moment every
    peer has built (what ``Cohort.close`` does); both must build every one, and each
    mark lands under its generation's prefix. (A guard, not a reproduction: the race
    needs processes under load, 9 failed builds of 600 without the wait, none of 2,000
    with it, measured with 2 processes building back to back beside 4 busy loops.)"""
    store = HashStore()
    failures: list[str] = []

    def rank(r: int) -> None:
        for generation in range(20):
            try:
                group = make_group(SPEC, store, f"g{generation}", r, 2, generation)
            except RendezvousError as exc:
                failures.append(f"rank {r}, generation {generation}: {exc}")
                return
            if group.size() != 2 or not peers_built(store, f"g{generation}", 2,
                                                     time.monotonic() + 10.0, _never):
                failures.append(f"rank {r}, generation {generation}: not every peer built")
            del group

    _on_two_ranks(rank)
    assert failures == []
    assert all(store.check([f"g{g}/built/{r}" for r in (0, 1)]) for g in range(20))


class _Source:
    """An elastic membership source of one generation of two members."""

    elastic = True
    worker_id = "w0"

    def __init__(self) -> None:
        self.failed = False

    def join(self) -> Membership:
        return Membership(2, ("w0", "w1"), 0, "w0", "test")

    def step_failed(self, generation: int) -> bool:
        return self.failed

    def close(self) -> None:
        pass


class _Group:
    def allreduce(self, *args: Any) -> None:
        pass


def _cohort(monkeypatch: pytest.MonkeyPatch, store: HashStore, source: _Source,
            timeout: float = 10.0, backend: str = "gloo") -> Cohort:
    def built(spec: GroupSpec, store: Any, prefix: str, rank: int, world_size: int,
              generation: int) -> _Group:
        store.set(f"{prefix}/built/{rank}", "1")
        return _Group()

    monkeypatch.setattr(cohort_module, "make_group", built)
    return Cohort(source, store, GroupSpec(backend, timeout, "127.0.0.1"),  # type: ignore[arg-type]
                  lambda generation: f"g{generation}")


def _close_in(cohort: Cohort) -> float:
    started = time.monotonic()
    cohort.close()
    return time.monotonic() - started


def test_closing_an_unused_group_waits_for_the_peer_to_build(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = HashStore()
    cohort = _cohort(monkeypatch, store, _Source())
    threading.Timer(0.5, lambda: store.set("g2/built/1", "1")).start()
    assert 0.5 <= _close_in(cohort) < 5.0
    assert not cohort.group.usable


def test_closing_a_group_a_collective_went_through_does_not_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cohort = _cohort(monkeypatch, HashStore(), _Source())  # the peer's mark never comes
    cohort.group.allreduce([])
    assert _close_in(cohort) < 0.5


def test_closing_waits_no_longer_once_a_peer_gave_up(monkeypatch: pytest.MonkeyPatch) -> None:
    source = _Source()
    cohort = _cohort(monkeypatch, HashStore(), source)
    threading.Timer(0.3, lambda: setattr(source, "failed", True)).start()
    assert _close_in(cohort) < 3.0


def test_closing_an_nccl_group_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL connects lazily, at the first collective: there is no handshake to cut."""
    cohort = _cohort(monkeypatch, HashStore(), _Source(), backend="nccl")
    assert _close_in(cohort) < 0.5


def test_closing_waits_at_most_the_group_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    cohort = _cohort(monkeypatch, HashStore(), _Source(), timeout=0.5)
    assert 0.5 <= _close_in(cohort) < 3.0


def test_a_relays_mark_lands_where_a_closing_rank_looks() -> None:
    """The mark goes through ``relay.prefixed`` and the group through ``for_c10d``: with
    a relay over the store (what ``potluck run --elastic`` hands a cohort), both ranks'
    marks are found under the generation's prefix, through the relay and under it."""
    from potluck.relay import RelayStore

    inner = HashStore()
    relay = RelayStore(inner, "here")
    failures: list[str] = []

    def rank(r: int) -> None:
        try:
            make_group(SPEC, relay, "g7", r, 2, 7)
        except RendezvousError as exc:
            failures.append(str(exc))

    _on_two_ranks(rank)
    assert failures == []
    assert peers_built(relay, "g7", 2, time.monotonic() + 1.0, _never)
    assert inner.check(["g7/built/0", "g7/built/1"])


def test_a_mark_the_store_refuses_does_not_fail_a_built_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mark is for a peer that closes at once; a store error while setting it is
    logged, and the built group is returned all the same."""
    from potluck.cohort import groups

    class Refusing:
        def set(self, key: str, value: str) -> None:
            raise RuntimeError("store unreachable")

    monkeypatch.setattr(groups, "_build", lambda *args: "the group")
    monkeypatch.setattr(groups, "prefixed", lambda store, prefix: Refusing())
    assert groups.make_group(SPEC, HashStore(), "g8", 0, 2, 8) == "the group"
