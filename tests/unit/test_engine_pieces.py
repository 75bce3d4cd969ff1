"""The one engine's pure pieces: the group handle, the boundary's decisions, the parts."""

from __future__ import annotations

from typing import Any

import pytest

from potluck.errors import ConfigError, PeerLostError
from potluck.group import GroupHandle, as_handle
from potluck.step.boundary import Action, boundary_action, poll_action
from potluck.step.parts import EqualShares, SharePolicy, StepPart


class FakeGroup:
    """Records the calls a holder makes; stands in for a backend object."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size
        self.calls: list[str] = []

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append("allreduce")
        return f"work on {id(self)}"

    broadcast = allgather = barrier = allreduce


def test_every_holder_follows_the_handle_to_the_next_generation() -> None:
    first, second = FakeGroup(1, 3), FakeGroup(0, 2)
    handle = GroupHandle(first, generation=0)
    held_by_model = held_by_optimizer = handle  # one object, held for life
    assert (held_by_model.rank(), held_by_model.size()) == (1, 3)
    handle.reconfigure(second, generation=1)
    assert (held_by_optimizer.rank(), held_by_optimizer.size(), handle.generation) == (0, 2, 1)
    held_by_model.allreduce([])
    assert second.calls == ["allreduce"] and first.calls == []


def test_a_released_handle_says_why_it_cannot_be_used() -> None:
    handle = GroupHandle(FakeGroup(0, 2), generation=4)
    assert handle.release("a peer was lost", abort=True) and not handle.usable
    with pytest.raises(ConfigError, match=r"generation 4.*a peer was lost"):
        handle.size()
    assert not handle.release("again")  # nothing left to release


def test_abandoned_steps_are_asked_for_the_current_generation_only() -> None:
    failed = {1}
    handle = GroupHandle(FakeGroup(0, 2), generation=1, abandoned=failed.__contains__)
    ask = handle.step_abandoned
    assert ask is not None and ask()
    handle.reconfigure(FakeGroup(0, 1), generation=2)
    assert not ask()  # the same question, now about generation 2
    assert GroupHandle(FakeGroup(0, 2)).step_abandoned is None  # a fixed job never asks


def test_as_handle_wraps_a_group_keeps_a_handle_and_refuses_anything_else() -> None:
    handle = GroupHandle(FakeGroup(0, 2))
    assert as_handle(handle) is handle and as_handle(None) is None
    wrapped = as_handle(FakeGroup(1, 2))
    assert isinstance(wrapped, GroupHandle) and wrapped.rank() == 1
    with pytest.raises(ConfigError, match="is not a process group"):
        as_handle("gloo")


@pytest.mark.parametrize(("flags", "action"), [
    ([0.0, 0.0], Action.GO_ON), ([1.0, 0.0], Action.ADMIT), ([0.0, 1.0], Action.ADMIT),
])
def test_the_boundary_vote(flags: list[float], action: Action) -> None:
    assert boundary_action(flags) is action


@pytest.mark.parametrize(("flags", "action"), [
    ([0.0, 0.0], Action.GO_ON), ([1.0, 0.0], Action.ADMIT), ([0.0, 1.0], Action.STOP),
    ([1.0, 1.0], Action.ADMIT),  # a joiner at the deadline is admitted, not turned away
])
def test_the_poll_below_the_minimum(flags: list[float], action: Action) -> None:
    assert poll_action(flags) is action


def test_equal_shares_is_a_share_policy_and_refuses_another_policys_state() -> None:
    policy = EqualShares()
    assert isinstance(policy, SharePolicy) and isinstance(policy, StepPart)
    assert list(policy.shares(3)) == [1.0, 1.0, 1.0]
    policy.load_state_dict(policy.state_dict())
    with pytest.raises(ConfigError, match=r"same potluck\.prepare"):
        policy.load_state_dict({"policy": "by-speed"})


def test_a_lost_peer_error_names_rank_generation_and_the_fix() -> None:
    error = PeerLostError.from_failure("the boundary vote", RuntimeError("Connection closed"),
                                       rank=2, generation=5)
    assert (error.rank, error.generation) == (2, 5)
    assert "the boundary vote failed on rank 2 in generation 5" in str(error)
    assert "potluck run --elastic" in str(error)
    timed_out = PeerLostError.from_failure("a barrier", "Timed out waiting", rank=0,
                                           generation=0)
    assert "timed out" in str(timed_out)
