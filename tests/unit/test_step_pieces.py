"""The step loader's redo semantics and the guards added for empty shares."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from potluck.data import DataCursor
from potluck.data.step_loader import StepLoader
from potluck.errors import ConfigError, CursorError
from potluck.step import GuardedOptimizer, accumulate


def test_a_failed_step_is_handed_out_again_split_for_the_new_membership() -> None:
    data = TensorDataset(torch.arange(12).float())
    cursor = DataCursor(12, 4, seed=1)
    world = [2]
    seen = []
    for step, (batch,) in enumerate(StepLoader(data, cursor, lambda: (0, world[0]))):
        seen.append([int(i) for i in batch.tolist()])
        if step == 1:
            world[0] = 1  # the step failed and the cohort shrank: no commit
            continue
        cursor.commit()
    block = cursor.permutation(0)[4:8].tolist()
    assert seen[1] == block[:2]  # rank 0 of 2
    assert seen[2] == block  # the same step again, now all of it on rank 0 of 1
    # rank 0's half of step 0, half of step 1 (failed), all of step 1, all of step 2
    assert [len(s) for s in seen] == [2, 2, 4, 4] and cursor.epoch == 1


def test_a_rank_without_a_sample_is_a_clear_error() -> None:
    data = TensorDataset(torch.arange(10).float())
    cursor = DataCursor(10, 2, seed=0)
    with pytest.raises(CursorError, match="at least one sample"):
        next(iter(StepLoader(data, cursor, lambda: (2, 3))))


def test_a_share_policy_with_the_wrong_number_of_shares_is_a_clear_error() -> None:
    data = TensorDataset(torch.arange(12).float())
    loader = StepLoader(data, DataCursor(12, 4), lambda: (0, 1), shares=lambda n: [1.0, 3.0])
    with pytest.raises(ConfigError, match=r"2 shares \(\[1.0, 3.0\]\) for a cohort of 1"):
        next(iter(loader))


def test_a_step_handed_out_forever_without_commit_is_a_clear_error() -> None:
    data = TensorDataset(torch.arange(8).float())
    loader = StepLoader(data, DataCursor(8, 4), lambda: (0, 1), max_repeats=3)
    with pytest.raises(CursorError, match="without a commit"):
        for _ in loader:
            pass


def test_a_step_handed_out_again_without_a_commit_or_a_redo_is_refused_at_once() -> None:
    """Under a step transaction (``redone``) the same step handed out again needs a redo
    in between: else the loop trains on one batch twice (a torch-style accumulation loop
    over several batches), which used to go on silently for 100 hand-outs."""
    data = TensorDataset(torch.arange(8).float())
    cursor, redone = DataCursor(8, 2), [0]
    seen = []
    batches = iter(StepLoader(data, cursor, lambda: (0, 1), redone=lambda: redone[0]))
    seen.append(next(batches)[0].tolist())
    redone[0] += 1  # the step failed and is redone: the same batch again
    seen.append(next(batches)[0].tolist())
    assert seen[0] == seen[1]
    cursor.commit()
    seen.append(next(batches)[0].tolist())  # committed: the next step
    assert seen[2] != seen[1]
    with pytest.raises(CursorError, match=r"neither committed nor failed.*potluck\.accumulate"):
        next(batches)  # no commit, no redo: a loop bug


def test_accumulate_refuses_an_empty_batch() -> None:
    with pytest.raises(ConfigError, match="empty batch"):
        list(accumulate(None, torch.zeros(0, 3), 2))


def test_guarded_optimizer_state_carries_the_grad_scaler() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    guard = GuardedOptimizer(torch.optim.SGD(params, lr=0.1), scaler=scaler)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss on
    scaler.update(64.0)
    state = guard.state_dict()
    other_scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    other_scaler.scale(torch.ones(()))
    other = GuardedOptimizer(torch.optim.SGD(params, lr=0.1), scaler=other_scaler)
    other.load_state_dict(state)
    assert other_scaler.get_scale() == 64.0


def _scaled_step(recipe: str) -> torch.Tensor:
    """One scaled step of a GuardedOptimizer with a GradScaler, the loop as ``recipe``."""
    param = torch.nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    guard = GuardedOptimizer(torch.optim.SGD([param], lr=0.1), scaler=scaler)
    scaler.scale((param * torch.tensor([1.0, 2.0])).sum()).backward()
    if recipe == "unscaled by hand":  # torch's recipe before clipping by hand
        scaler.unscale_(guard.optimizer)
    elif recipe == "unscaled another":  # scaler.unscale_(opt) on prepare's optimizer
        scaler.unscale_(guard)  # type: ignore[arg-type]
    assert guard.step().committed
    return param.detach().clone()


def test_a_grad_scaler_unscaled_by_hand_is_not_unscaled_again() -> None:
    """torch's AMP recipe (unscale_, clip by hand, step) raised torch's "unscale_() has
    already been called"; the step now equals the one the guard unscales itself."""
    assert torch.equal(_scaled_step("unscaled by hand"), _scaled_step("guard"))
    assert torch.allclose(_scaled_step("guard"), torch.tensor([0.9, 0.8]))


def test_a_grad_scaler_used_on_another_object_is_refused() -> None:
    """scaler.step(opt) / scaler.unscale_(opt) on prepare's optimizer: the gradients
    would be unscaled twice, and the user's scaler.update() failed in torch."""
    with pytest.raises(ConfigError, match=r"leave out scaler\.step\(\) and scaler\.update"):
        _scaled_step("unscaled another")


def test_one_grad_scaler_for_two_optimizers_is_not_refused() -> None:
    """torch's recipe for a GAN: scaler.step(opt_g) on another optimizer, then this one."""
    param, other = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    guard = GuardedOptimizer(torch.optim.SGD([param], lr=0.1), scaler=scaler)
    second = torch.optim.SGD([other], lr=0.1)
    scaler.scale((param * torch.tensor([1.0, 2.0])).sum() + other.sum()).backward()
    scaler.step(second)
    assert guard.step().committed
    assert torch.allclose(param.detach(), torch.tensor([0.9, 0.8]))


def test_a_step_not_applied_forgets_that_it_was_unscaled() -> None:
    """Its redo's gradients are scaled afresh: they must be unscaled again (they were
    applied scaled, 1024 times too large)."""
    param = torch.nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    guard = GuardedOptimizer(torch.optim.SGD([param], lr=0.1), scaler=scaler)
    scaler.scale((param * torch.tensor([1.0, 2.0])).sum()).backward()
    scaler.unscale_(guard.optimizer)  # the loop unscaled by hand; then the step failed
    guard.forget_unscale()
    guard.zero_grad()
    scaler.scale((param * torch.tensor([1.0, 2.0])).sum()).backward()  # the redo
    assert guard.step().committed
    assert torch.allclose(param.detach(), torch.tensor([0.9, 0.8]))


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_a_rank_sitting_out_reads_two_samples_the_others_train_all(rank: int) -> None:
    """Rank 1 of 3 sits out (quarantined on a fixed cohort): ranks 0 and 2 split each
    whole step, and rank 1 reads the step's first two samples (batch norm in train mode
    refuses a batch of one), which another rank trains."""
    data = TensorDataset(torch.arange(24).float())
    cursor = DataCursor(24, 8, seed=0)
    loader = StepLoader(data, cursor, lambda: (rank, 3), sitting_out=lambda n: {1})
    (batch,) = next(iter(loader))
    block = cursor.permutation(0)[:8].tolist()
    expected = {0: block[:4], 1: block[:2], 2: block[4:]}[rank]
    assert [int(i) for i in batch.tolist()] == expected


@pytest.mark.parametrize(("shares", "block", "out"), [
    ([1.0, 1.0, 1.0, 1.0], 64, {3}), ([0.5, 0.25, 0.125], 4, {1}), ([1.0, 1.0, 1.0], 3, {0}),
    ([0.9, 0.05, 0.05], 5, {0}), ([1.0, 1.0], 1, {1}), ([3.0, 1.0, 1.0, 1.0], 12, {0, 2})])
def test_a_round_with_a_rank_sitting_out_tiles_its_block_and_leaves_nobody_out(
        shares: list[float], block: int, out: set[int]) -> None:
    """Under rounds a rank sitting out gets SIT_OUT samples of a round's block where the
    others still get one each (else one, then equal shares among the others): the parts
    tile the block, and no trusted rank is left without a sample."""
    from potluck.data.split import split_counts
    from potluck.data.step_loader import SIT_OUT, _one_each

    counts = split_counts(block, _one_each(shares, block, out))
    assert sum(counts) == block
    trusted = [c for r, c in enumerate(counts) if r not in out]
    if block >= len(shares):
        assert all(c > 0 for c in trusted), counts
        assert all(1 <= counts[r] <= SIT_OUT for r in out), counts
    if block - SIT_OUT * len(out) >= 8 * len(trusted):  # (room for it)
        assert all(counts[r] == SIT_OUT for r in out), counts
