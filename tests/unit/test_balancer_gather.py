"""The balancer's speed gather runs while the next step computes (one rank, fake group).

After step t the balancer issues its all-gather of ``[speed, cap, uncertainty]`` and
does not wait; after step t + 1 it takes that gather's rows and plans from them (so the
plan follows the speeds of the step before last; a move is taken when two gathers in a
row call for it), then issues the next. A gather of an old
generation is dropped unread; a failed one is the step's failure.
"""

from __future__ import annotations

import pytest
import torch

from potluck.balance.balancer import BalanceConfig, Balancer
from potluck.errors import PeerLostError
from potluck.reducer.contribution import Contribution


class _Work:
    def __init__(self, outputs: list[torch.Tensor], peer: float, fail: bool) -> None:
        self.outputs, self.peer, self.fail, self.waited = outputs, peer, fail, False

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        self.waited = True
        if self.fail:
            raise RuntimeError("Connection closed by peer")
        self.outputs[1].copy_(torch.tensor([self.peer, 0.0, 0.05], dtype=torch.float64))
        return True


class _Group:
    """Rank 0 of 2; the peer's speed is ``peer`` samples/s."""

    def __init__(self, peer: float) -> None:
        self.peer, self.generation, self.fail, self.refuse = peer, 0, False, False
        self.works: list[_Work] = []

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0

    def step_abandoned(self) -> bool:
        return False

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> _Work:
        if self.refuse:  # a backend that knows a peer is gone fails at issue
            raise RuntimeError("Connection reset by peer")
        outputs[0][0].copy_(inputs[0])
        work = _Work(outputs[0], self.peer, self.fail)
        self.works.append(work)
        return work


class _Clock:
    def take(self) -> float:
        return 0.1  # 24 samples in 0.1 s: 240 samples/s


class _Cohort:
    def __init__(self, group: _Group, elastic: bool = False) -> None:
        self.group, self.elastic = group, elastic
        self.rank, self.world_size, self.joined_late = 0, 2, False
        self.device = torch.device("cpu")
        self.failed = 0

    def mark_step_failed(self) -> None:
        self.failed += 1


def _balancer(peer: float = 80.0, elastic: bool = False) -> tuple[Balancer, _Group, _Cohort]:
    group = _Group(peer)
    cohort = _Cohort(group, elastic)
    contribution = Contribution()
    contribution.set(24, 24.0, 48.0)
    balancer = Balancer(cohort, 48, contribution, _Clock(),  # type: ignore[arg-type]
                        BalanceConfig(smoothing=0.0))
    return balancer, group, cohort


def test_a_step_plans_from_the_gather_issued_after_the_step_before() -> None:
    balancer, group, _ = _balancer()
    balancer.on_commit(1)
    assert len(group.works) == 1 and not group.works[0].waited  # issued, not waited
    assert balancer.plan is None and balancer.shares(2) == (1.0, 1.0)  # equal still
    balancer.on_commit(2)
    assert group.works[0].waited and not group.works[1].waited
    assert balancer.speeds == (None, 80.0)  # step 1's: this rank's first is not counted
    balancer.on_commit(3)
    assert group.works[1].waited and not group.works[2].waited
    assert balancer.speeds == (240.0, 80.0)  # this rank's and the peer's, from step 2
    assert balancer.plan is None  # one gather called for a move: not yet taken
    balancer.on_commit(4)
    assert balancer.plan is not None and balancer.plan.counts == (36, 12)  # 3 : 1


def _planned(balancer: Balancer) -> None:
    for step in (1, 2, 3, 4):
        balancer.on_commit(step)
    assert balancer.plan is not None and balancer.plan.counts == (36, 12)


def test_a_gather_of_an_old_generation_is_dropped_unread() -> None:
    balancer, group, _ = _balancer()
    _planned(balancer)
    balancer.on_membership(0, 2)  # a loss and a new generation: the group is another
    assert balancer.plan is None and balancer.speeds == ()  # they named the old ranks
    balancer.on_commit(5)
    assert not group.works[3].waited  # step 4's gather was never read
    assert balancer.plan is None  # nothing to plan from yet: equal shares
    group.generation += 1  # the group moved on without a membership call reaching us
    balancer.on_commit(6)
    assert not group.works[4].waited and balancer.plan is None
    balancer.on_commit(7)
    balancer.on_commit(8)
    assert group.works[5].waited and balancer.plan is not None
    assert balancer.plan.counts == (36, 12)


@pytest.mark.parametrize("elastic", [False, True])
def test_a_failed_gather_fails_the_step_but_every_commit_issues_one(elastic: bool) -> None:
    balancer, group, cohort = _balancer(elastic=elastic)
    _planned(balancer)
    planned = balancer.plan
    group.fail = True
    balancer.on_commit(5)  # issues a gather that will fail
    group.fail = False
    if not elastic:
        with pytest.raises(PeerLostError, match="speeds' all-gather"):
            balancer.on_commit(6)
        assert len(group.works) == 6  # step 6's gather was issued before the read failed
        return
    balancer.on_commit(6)
    assert len(group.works) == 6  # issued whatever the read gave: peers issue it too
    assert cohort.failed == 1  # the next step recovers (a new generation)
    assert balancer.plan == planned  # and keeps the plan until then


@pytest.mark.parametrize("elastic", [False, True])
def test_a_gather_that_cannot_be_issued_fails_the_step(elastic: bool) -> None:
    balancer, group, cohort = _balancer(elastic=elastic)
    _planned(balancer)
    group.refuse = True
    if not elastic:
        with pytest.raises(PeerLostError, match="speeds' all-gather"):
            balancer.on_commit(5)
        return
    balancer.on_commit(5)
    assert cohort.failed == 1 and balancer.plan is not None


def test_a_short_step_is_not_measured() -> None:
    """An epoch's last, short step pays the step's fixed costs over fewer samples: its
    seconds per sample would pass for a slower worker and move the plan each epoch."""
    group = _Group(80.0)
    contribution = Contribution()
    contribution.set(24, 24.0, 48.0)
    step_samples = [48]
    balancer = Balancer(_Cohort(group), 48, contribution, _Clock(),  # type: ignore[arg-type]
                        BalanceConfig(smoothing=0.0), step_samples=lambda: step_samples[0])
    balancer.on_commit(1)  # the first step is skipped by the meter anyway
    balancer.on_commit(2)
    assert balancer.meter.speed == 240.0
    step_samples[0] = 10  # a short step, slower per sample
    contribution.set(5, 5.0, 10.0)
    balancer.on_commit(3)
    assert balancer.meter.speed == 240.0  # not counted
    step_samples[0] = 48
    contribution.set(12, 12.0, 48.0)  # 12 samples in 0.1 s: a slower worker indeed
    balancer.on_commit(4)
    assert balancer.meter.speed == 120.0
