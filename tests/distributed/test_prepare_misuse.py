"""A loop or setup that would train silently wrong is refused, on every rank, with what
to fix: ranks that disagree on the data's order, a second step() for one batch, a
step() without backward()."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from potluck.testing import free_port, join, run_ranks

DATA = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))


def _setup(rank: int, world_size: int, port: int, seed_of: list[int]) -> Any:
    import potluck

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    return potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DATA,
                           global_batch=8, seed=seed_of[rank],
                           cohort=join(rank, world_size, port, timeout=20.0))


def _refusal(rank: int, world_size: int, port: int, seed_of: list[int]) -> str:
    """``_setup``'s ConfigError as text ("no error" when there was none)."""
    from potluck.errors import ConfigError

    try:
        _setup(rank, world_size, port, seed_of)
    except ConfigError as exc:
        return str(exc)
    return "no error"


def _different_seeds(rank: int, world_size: int, port: int) -> str:
    return _refusal(rank, world_size, port, [0, 1])


@pytest.mark.timeout(60)
def test_ranks_with_different_seeds_are_refused_on_every_rank() -> None:
    """Each would walk its own order of the data: samples trained twice and never."""
    for message in run_ranks(_different_seeds, 2, free_port(), init_group=False, timeout=50):
        assert "different seed (seed: rank 0 0, rank 1 1)" in message, message


def _different_settings(rank: int, world_size: int, port: int, which: str) -> str:
    import potluck
    from potluck.compress import Int8Blockwise
    from potluck.errors import ConfigError

    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    mine: dict[str, Any] = {
        "sync": {"sync": potluck.DiLoCo(inner_steps=2, codec=Int8Blockwise() if rank else None)},
        "balance": {"balance": rank == 0},
        "clip": {"clip_grad_norm": 1.0 + 1.5 * rank},
        # each rank's own device and memory cap; 1 and 1.0 are one setting
        "per rank": {"device_ids": None if rank else [], "max_micro_batch": 4 + rank,
                     "clip_grad_norm": [1, 1.0][rank]},
    }[which]
    try:
        potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DATA, global_batch=8,
                        cohort=join(rank, world_size, port, timeout=20.0), **mine)
    except ConfigError as exc:
        return str(exc)
    return "no error"


def _different_wire(rank: int, world_size: int, port: int, newer: bool) -> str:
    import potluck.prepare_checks
    import potluck.protocol

    if rank == 1 and not newer:  # as a worker with another potluck installed would be
        potluck.protocol.WIRE += 98
    if rank == 1 and newer:  # a version that agrees on one setting more
        signature = potluck.prepare_checks.signature
        potluck.prepare_checks.signature = lambda *args: {  # type: ignore[assignment]
            **signature(*args), "potluck": "9.9 (wire 99)", "new setting": 1}
    return _refusal(rank, world_size, port, [0, 0])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("newer", [False, True])
def test_ranks_running_another_potluck_are_refused_on_every_rank(newer: bool) -> None:
    """Another wire would run other collectives (a hang, or bytes read wrongly); a
    version that agrees on other settings is shown too, not left waiting."""
    from potluck import __version__
    from potluck.protocol import WIRE

    for message in run_ranks(_different_wire, 2, free_port(), newer, init_group=False,
                             timeout=50):
        theirs = "9.9 (wire 99)" if newer else f"{__version__} (wire {WIRE + 98})"
        assert (f"the workers run different potluck (potluck: rank 0 {__version__} (wire "
                f"{WIRE}), rank 1 {theirs}") in message, message
        assert "install the same potluck on every worker" in message, message
        assert ("new setting: rank 0 None, rank 1 1" in message) == newer, message


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("which", "shown"), [
    ("sync", "sync: rank 0 DiLoCo(inner_steps=2, outer_lr=0.7, outer_momentum=0.9, "
             "nesterov=True, codec=None"),
    ("balance", "balance: rank 0 BalanceConfig(smoothing=0.5, min_gain=0.03, "
                "max_micro_batch=None), rank 1 None"),
    ("per rank", "no error"),
    ("clip", "clip_grad_norm: rank 0 1, rank 1 2.5")])
def test_ranks_with_different_settings_are_refused_on_every_rank(which: str, shown: str) -> None:
    """Other sync, balance or clipping settings would sync differently: a hang, a crash
    in Gloo or replicas drifting apart, where one setup error names the setting."""
    messages = run_ranks(_different_settings, 2, free_port(), which, init_group=False,
                         timeout=50)
    for message in messages:
        if which == "per rank":
            assert message == "no error", message
            continue
        assert "called prepare() with different" in message and shown in message, message
    if which == "sync":
        assert "rank 1 DiLoCo(inner_steps=2" in messages[0]
        assert "codec=Int8Blockwise(block=256)" in messages[0]


def _loop(rank: int, world_size: int, port: int, mistake: str) -> str:
    from potluck.errors import CursorError, ReducerError

    model, opt, loader = _setup(rank, world_size, port, [0, 0])
    try:
        for step, (x, y) in enumerate(loader):
            if mistake == "accumulate" and step % 2 == 0:  # torch DDP's recipe: A = 2
                with model.no_sync():
                    torch.nn.functional.mse_loss(model(x), y).backward()
                continue
            opt.zero_grad()
            forward = model.module if mistake == "bare module" and step == 1 else model
            if not (mistake == "no backward" and rank == 1 and step == 1):
                torch.nn.functional.mse_loss(forward(x), y).backward()
            opt.step()
            if mistake == "twice":
                opt.step()
    except (CursorError, ReducerError) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # the other rank's consequence (its peer left)
        return f"other: {type(exc).__name__}"
    return "no error"


@pytest.mark.timeout(60)
def test_a_second_step_for_one_batch_is_refused() -> None:
    """It used to commit the cursor again: half of the data never trained on."""
    for message in run_ranks(_loop, 2, free_port(), "twice", init_group=False, timeout=50):
        assert message.startswith("CursorError: step() was called again at step 1"), message


@pytest.mark.timeout(60)
def test_an_accumulation_loop_over_the_loader_is_refused_at_once() -> None:
    """The loader hands a step's batch out until step() commits it: a loop that steps
    every second batch trained each batch twice and half the data never, silently."""
    for message in run_ranks(_loop, 2, free_port(), "accumulate", init_group=False,
                             timeout=50):
        assert message.startswith("CursorError: the loader was asked for the next batch"), \
            message
        assert "potluck.accumulate(model, batch, k)" in message


@pytest.mark.timeout(60)
def test_a_backward_through_the_bare_module_is_refused() -> None:
    """Its gradients were averaged with the last pass's weights (wrong on a step whose
    split changed), silently."""
    for message in run_ranks(_loop, 2, free_port(), "bare module", init_group=False,
                             timeout=50):
        assert message.startswith("ReducerError: parameter '"), message
        assert ("received a gradient in a synchronized backward pass with no forward of "
                "the wrapped model since the last one") in message, message


@pytest.mark.timeout(60)
def test_a_step_without_backward_is_refused_before_any_collective() -> None:
    """It used to pair this rank's finiteness vote with the others' gradient all-reduce
    (an elastic job then trained on and exited 0 with samples trained twice)."""
    results = run_ranks(_loop, 2, free_port(), "no backward", init_group=False, timeout=50,
                        may_die=(0,))
    assert results[1].startswith("ReducerError: step() at step 1 on rank 1 without a "
                                 "synchronized backward()"), results[1]


def _gradient_penalty(rank: int, world_size: int, port: int) -> list[float]:
    """torch.autograd.grad of the output (a gradient penalty, a PINN) before backward:
    its pass reaches no parameter, so the backward after it is the step's."""
    model, opt, loader = _setup(rank, world_size, port, [0, 0])
    for x, y in loader:
        x = x.requires_grad_()
        opt.zero_grad()
        out = model(x)
        (slope,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        (torch.nn.functional.mse_loss(out, y) + slope.pow(2).mean()).backward()
        opt.step()
    opt.finish()
    return [float(p.sum()) for p in model.module.parameters()]


@pytest.mark.timeout(60)
def test_a_gradient_penalty_through_autograd_grad_is_not_refused() -> None:
    first, second = run_ranks(_gradient_penalty, 2, free_port(), init_group=False, timeout=50)
    assert first == second
