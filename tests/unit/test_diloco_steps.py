"""``opt.steps`` under DiLoCo counts rounds whose every sample reached the model (one
process: a round's sync is made to report part of its block lost, as when a member dies
mid-round; the cursor owes that part and hands it out again as a round of its own)."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

import potluck
from potluck.data.state import Range
from potluck.step.transaction import StepTransaction
from potluck.sync import DiLoCoSync

GLOBAL_BATCH, INNER_STEPS = 4, 2
ROUND = GLOBAL_BATCH * INNER_STEPS  # samples a round


def _prepare() -> tuple[torch.nn.Module, StepTransaction, potluck.data.StepLoader]:
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 1)
    data = TensorDataset(torch.arange(48.0).unsqueeze(1), torch.zeros(48, 1))
    return potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.01), data,
                           global_batch=GLOBAL_BATCH,
                           sync=potluck.DiLoCo(inner_steps=INNER_STEPS))


def _lose_half_of_round(opt: StepTransaction, lossy: int) -> None:
    """Round ``lossy`` (from 1) commits without the back half of its block."""
    strategy = opt.part(DiLoCoSync)
    assert strategy is not None
    synchronize = strategy.synchronize

    def losing() -> tuple[Range, ...] | None:
        lost = synchronize()
        if strategy.rounds == lossy:
            start, stop = opt.cursor.state.block  # the round's (not committed yet)
            return ((start + (stop - start) // 2, stop),)
        return lost

    strategy.synchronize = losing  # type: ignore[method-assign]


def test_a_loop_that_stops_after_k_rounds_trains_k_rounds_of_samples() -> None:
    model, opt, loader = _prepare()
    _lose_half_of_round(opt, lossy=2)
    rounds, seen, owed_at = 3, [], None
    while opt.steps < rounds:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if opt.cursor.state.owed and owed_at is None:
                owed_at = opt.steps  # right after the lossy round's commit
                partial = opt.state_dict()
            seen.append(opt.steps)
            if opt.steps == rounds:
                break
    state = opt.cursor.state
    assert (state.cursor, state.owed) == (rounds * ROUND, ())  # 3 rounds' positions
    assert owed_at == 1  # the lossy round counts once its owed half is trained
    # 2 local steps a round, 1 for the owed half (4 samples), 2 for the third round
    assert seen == [0, 1, 1, 1, 2, 2, 3]
    opt.finish()
    # The count travels with the live state (a joiner's, a checkpoint's).
    _, fresh, _ = _prepare()
    fresh.load_state_dict(partial)
    assert fresh.steps == 1 and fresh.cursor.state.owed
    fresh.finish()
