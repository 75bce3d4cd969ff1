"""``DiLoCoSync``'s round, one rank of two driven by hand over a fake group (no processes):
an unmeasured round's even start, the speed exchange, and what happens when the members
do not follow the protocol or the exchange fails."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from potluck import DiLoCo
from potluck.data.split import split_block
from potluck.errors import ConfigError, PeerLostError
from potluck.sync import DiLoCoSync, local_steps

GLOBAL_BATCH = 4
BLOCK = (0, 16)  # a round of 4 global batches; measure=0.25: one global batch even


class Done:
    """A finished collective."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        future.set_result([self.tensor])
        return future


class FakeGroup:
    """Rank 0 of 2. Each all-reduce (or all-gather) is handed to ``peer`` (what the other
    rank adds to the table), or fails when ``peer`` raises."""

    generation = 0

    def __init__(self, peer: Callable[[torch.Tensor], None]) -> None:
        self.peer, self.calls = peer, 0

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 2

    def allreduce(self, tensors: list[torch.Tensor]) -> Done:
        self.calls += 1
        self.peer(tensors[0])
        return Done(tensors[0])

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> Done:
        """As an all-reduce of a table whose row 0 is this rank's: ``peer`` writes row 1
        (one value a rank for the speeds, a row of seven at the sync)."""
        mine = inputs[0]
        table = torch.zeros(2, mine.numel(), dtype=mine.dtype) if mine.numel() > 1 \
            else torch.zeros(2, dtype=mine.dtype)
        table[0] = mine.reshape(table[0].shape)
        self.allreduce([table])
        for row, out in zip(table, outputs[0], strict=True):
            out.copy_(row.reshape(out.shape))
        return Done(table)


def _speeds_then_parts(parts: tuple[float, float, float, float]) -> Callable[[torch.Tensor],
                                                                              None]:
    """The other rank: speed 1 (samples/s) in the exchange; at the sync its speed, 12
    samples and ``parts``; pseudo-gradients: zero."""

    def peer(tensor: torch.Tensor) -> None:
        if tensor.dim() == 1 and tensor.numel() == 2:
            tensor[1] = 1.0
        elif tensor.dim() == 2:
            tensor[1] = torch.tensor([1.0, 12.0, *parts, 0.05], dtype=tensor.dtype)

    return peer


def _strategy(group: FakeGroup, on_lost: Callable[[], None] | None = None) -> DiLoCoSync:
    torch.manual_seed(0)
    config = DiLoCo(inner_steps=4, measure=0.25, min_gain=0.0)
    return DiLoCoSync(config, nn.Linear(2, 1), group, GLOBAL_BATCH,  # type: ignore[arg-type]
                      on_lost=on_lost)


def _even_start(strategy: DiLoCoSync) -> None:
    segments = strategy.segments(BLOCK)
    assert segments == ((0, 4), (4, 16))
    assert strategy.shares(2) == [4.0, 4.0]  # nobody measured: even
    assert strategy.inner_steps((0, 2), segments[0]) == 1


def test_the_rest_is_split_by_the_speeds_exchanged_after_the_even_start() -> None:
    group = FakeGroup(_speeds_then_parts((2, 4, 4, 10)))
    strategy = _strategy(group)
    _even_start(strategy)
    assert strategy.after_inner_step() is False  # not the round's end: the exchange
    assert group.calls == 1 and strategy.plan is not None
    assert strategy.speeds[1] == 1.0 and strategy.plan[0] > strategy.plan[1]
    # the loader splits the rest by the plan now: rank 0 takes the plan's share of it
    shares = strategy.shares(2)
    assert shares == [float(n) for n in strategy.plan]
    part = split_block(4, 16, shares)[0]
    assert part.stop - part.start > 6  # more than half of the rest's 12
    assert strategy.inner_steps((part.start, part.stop), (4, 16)) == local_steps(
        part.stop - part.start, GLOBAL_BATCH, 2)


def test_reading_ahead_into_the_rest_is_refused() -> None:
    strategy = _strategy(FakeGroup(_speeds_then_parts((2, 4, 4, 10))))
    _even_start(strategy)
    with pytest.raises(ConfigError, match="no reading ahead"):
        strategy.inner_steps((10, 16), (4, 16))


def test_a_round_handed_out_again_between_its_segments_is_refused() -> None:
    strategy = _strategy(FakeGroup(_speeds_then_parts((2, 4, 4, 10))))
    _even_start(strategy)
    strategy.after_inner_step()
    with pytest.raises(ConfigError, match="handed out a round again after 1 optimizer step"):
        strategy.segments(BLOCK)


def test_parts_that_overlap_abandon_the_round_and_every_member_takes_the_tables_plan() -> None:
    """The other rank split the rest differently (it never got the speeds): a sample
    was trained twice. The round is abandoned (None), the replica is the global
    parameters again, and the plan is the one the shared table gives."""
    strategy = _strategy(FakeGroup(_speeds_then_parts((2, 4, 8, 16))))  # overlaps ours
    module = strategy.module
    before = [p.detach().clone() for p in module.parameters()]
    _even_start(strategy)
    strategy.after_inner_step()
    steps = strategy.inner_steps((4, 10), (4, 16))
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)  # the local steps moved the replica
    for _ in range(steps):
        done = strategy.after_inner_step()
    assert done
    assert strategy.synchronize() is None
    assert all(torch.equal(p, b) for p, b in zip(module.parameters(), before, strict=True))
    speeds = strategy.speeds
    assert speeds[1] == 1.0 and strategy.plan is not None and strategy.rounds == 0
    assert strategy.segments(BLOCK) == (BLOCK,)  # planned now: the round again, whole


def test_a_failed_exchange_on_an_elastic_cohort_is_raised_at_the_sync_before_any_collective(
        ) -> None:
    failing = {"exchange": True}

    def peer(tensor: torch.Tensor) -> None:
        if failing["exchange"]:
            failing["exchange"] = False
            raise RuntimeError("Connection closed by peer")
        _speeds_then_parts((2, 4, 10, 16))(tensor)  # it, too, split the rest evenly

    told: list[bool] = []
    group = FakeGroup(peer)
    strategy = _strategy(group, on_lost=lambda: told.append(True))
    _even_start(strategy)
    assert strategy.after_inner_step() is False
    assert told == [True] and strategy.plan is None  # the rest stays even
    assert strategy.shares(2) == [4.0, 4.0]
    steps = strategy.inner_steps((4, 10), (4, 16))
    for _ in range(steps):
        strategy.after_inner_step()
    calls = group.calls
    with pytest.raises(PeerLostError, match="the round's first speeds"):
        strategy.synchronize()
    assert group.calls == calls  # raised before any collective on the broken group
    assert strategy.synchronize() == ()  # the next generation's sync: the round commits
    assert strategy.rounds == 1
    # the round's speed went into the meter once, not once per try (one measurement
    # leaves the prior's spread as its noise)
    assert strategy.meter.uncertainty == pytest.approx(0.1)


def test_a_failed_exchange_on_a_fixed_cohort_is_raised_where_it_happens() -> None:
    def peer(tensor: torch.Tensor) -> None:
        raise RuntimeError("Connection closed by peer")

    strategy = _strategy(FakeGroup(peer))
    _even_start(strategy)
    with pytest.raises(PeerLostError, match="the round's first speeds"):
        strategy.after_inner_step()


def test_a_members_speed_and_noise_that_no_plan_can_use_are_read_as_not_measured() -> None:
    """A member sends NaN for its speed and its noise (a bug, or an attacker under
    trust): the round commits and every member plans on, that member unmeasured."""
    def peer(tensor: torch.Tensor) -> None:
        if tensor.dim() == 1 and tensor.numel() == 2:
            tensor[1] = 1.0
        elif tensor.dim() == 2:
            nan = float("nan")
            tensor[1] = torch.tensor([nan, 12.0, 2, 4, 10, 16, nan], dtype=tensor.dtype)

    strategy = _strategy(FakeGroup(peer))
    _even_start(strategy)
    strategy.after_inner_step()
    for _ in range(strategy.inner_steps((4, 10), (4, 16))):
        strategy.after_inner_step()
    assert strategy.synchronize() == ()
    assert strategy.rounds == 1 and strategy.speeds[1] is None
    assert strategy.plan is not None and sum(strategy.plan) == 8
