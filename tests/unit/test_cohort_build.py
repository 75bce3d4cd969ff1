"""A member lost while a generation's group is built (Gloo waits for every peer, then
gives up): in an elastic cohort the members form the next generation and build again,
and a joiner goes back to the join queue. With 32 members under churn a kill during a
build stopped every survivor with ``RendezvousError``."""

from __future__ import annotations

from typing import Any

import pytest
from torch._C._distributed_c10d import HashStore

from potluck.cohort import cohort as cohort_module
from potluck.cohort.cohort import Cohort
from potluck.cohort.groups import GroupSpec
from potluck.errors import RendezvousError
from potluck.rendezvous.membership import Membership

pytestmark = pytest.mark.timeout(30)


class _Source:
    """An elastic membership source that records what the cohort asked of it."""

    elastic = True

    def __init__(self, first: Membership) -> None:
        self.worker_id = "w1"
        self._membership = first
        self.asked: list[str] = []

    def join(self) -> Membership:
        return self._membership

    def next_generation(self, reason: str) -> Membership:
        self.asked.append("next")
        return self._after(self._membership.generation + 1, joined=())

    def rejoin(self) -> Membership:
        self.asked.append("rejoin")
        self.worker_id = "w1.1"
        return self._after(self._membership.generation + 2, joined=("w1.1",))

    def mark_step_failed(self, generation: int) -> None:
        self.asked.append(f"failed {generation}")

    def step_failed(self, generation: int) -> bool:
        return False

    def _after(self, generation: int, joined: tuple[str, ...]) -> Membership:
        self._membership = Membership(generation, ("w0", self.worker_id), 1, "w0", "test",
                                      joined=joined)
        return self._membership


def _failing_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``make_group`` fails the first build (a peer never came), then builds; the
    generations it was asked for."""
    asked: list[int] = []

    def make_group(spec: GroupSpec, store: Any, prefix: str, rank: int, world_size: int,
                   generation: int) -> Any:
        asked.append(generation)
        if len(asked) == 1:
            raise RendezvousError(f"rank {rank} could not build generation {generation}")
        return object()

    monkeypatch.setattr(cohort_module, "make_group", make_group)
    return asked


def _cohort(source: _Source) -> Cohort:
    return Cohort(source, HashStore(), GroupSpec("gloo", 5.0, "127.0.0.1"),
                  lambda generation: f"g{generation}")


def test_a_member_forms_the_next_generation_when_a_build_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built = _failing_once(monkeypatch)
    source = _Source(Membership(3, ("w0", "w1", "w2"), 1, "w0", "boundary"))
    cohort = _cohort(source)
    assert built == [3, 4] and cohort.generation == 4
    assert source.asked == ["failed 3", "next"]


def test_a_joiner_goes_back_to_the_queue_when_its_build_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built = _failing_once(monkeypatch)
    source = _Source(Membership(3, ("w0", "w1"), 1, "w0", "boundary", joined=("w1",)))
    cohort = _cohort(source)
    assert built == [3, 5] and cohort.generation == 5
    assert source.asked == ["failed 3", "rejoin"]
    assert cohort.joined_late  # it still takes the live state


def test_a_fixed_cohort_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_once(monkeypatch)
    source = _Source(Membership(0, ("w0", "w1"), 1, "w0", "started"))
    source.elastic = False  # type: ignore[misc]
    with pytest.raises(RendezvousError):
        _cohort(source)
