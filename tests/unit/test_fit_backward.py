"""``fit_backward`` and ``MemoryCap``: a part that runs out of memory is taken again in
smaller micro-batches, and the gradient is exactly the part's mean gradient (float64,
against one pass without a memory limit). One process: ``DataParallel`` with one rank
communicates nothing, so every pass can be retried (the distributed cases are in
``tests/distributed/test_fit_backward.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from potluck import DataParallel
from potluck.data.memory import MemoryCap, is_out_of_memory
from potluck.errors import ConfigError, OutOfMemoryError
from potluck.step.fit import fit_backward


class Limited(nn.Module):
    """Raises ``torch.OutOfMemoryError`` for more than ``limit`` rows: in the forward,
    or (``in_backward``) in the backward of its first layer, after the later layers'
    gradients are already made."""

    def __init__(self, limit: int | None, in_backward: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.first = nn.Linear(6, 16, dtype=torch.float64)
        self.second = nn.Linear(16, 3, dtype=torch.float64)
        self.limit, self.in_backward = limit, in_backward
        self.raised = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.limit is not None and len(x) > self.limit:
            if not self.in_backward:
                self.raised += 1
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate "
                                             f"{len(x)} rows")
            h = _FailInBackward.apply(self.first(x), self)
        else:
            h = self.first(x)
        return self.second(torch.tanh(h))


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, owner: Limited) -> torch.Tensor:
        ctx.owner = owner
        return h.view_as(h)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        ctx.owner.raised += 1
        raise torch.OutOfMemoryError("CUDA out of memory in backward")


class Loader:
    def __init__(self, cap: int | None = None) -> None:
        self.memory = MemoryCap(cap)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return (torch.randn(16, 6, generator=gen, dtype=torch.float64),
            torch.randn(16, 3, generator=gen, dtype=torch.float64))


def _one_pass() -> tuple[dict[str, torch.Tensor], float]:
    net = Limited(None)
    x, y = _data()
    loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    return {n: p.grad.clone() for n, p in net.named_parameters()}, float(loss.detach())


def _grads(model: DataParallel) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.module.named_parameters()}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("in_backward", [False, True], ids=["forward", "backward"])
def test_a_part_that_runs_out_of_memory_is_taken_again_smaller_and_stays_exact(
        in_backward: bool) -> None:
    expected, expected_loss = _one_pass()
    net = Limited(5, in_backward=in_backward)
    model, loader = DataParallel(net), Loader()
    x, y = _data()

    def loss_of(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return ((model(batch[0]) - batch[1]) ** 2).mean()

    loss = fit_backward(model, (x, y), loss_of, loader)
    # 16 rows ran out, then 8; 4 fit: the part went in 4 micro-batches
    assert (net.raised, loader.memory.found, loader.memory.errors) == (2, 4, 2)
    assert loader.memory.micro_batches(16) == 4 and loader.memory.known_to_fit(4)
    torch.testing.assert_close(float(loss), expected_loss, rtol=1e-12, atol=0)
    for name, grad in _grads(model).items():  # nothing of the failed passes is left
        torch.testing.assert_close(grad, expected[name], rtol=1e-12, atol=1e-15)
    # The next step goes straight to the cap found: no more out-of-memory errors.
    for p in model.parameters():
        p.grad = None
    fit_backward(model, (x, y), loss_of, loader)
    assert net.raised == 2
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-12, atol=1e-15)


@pytest.mark.timeout(30)
def test_gradients_kept_between_steps_are_zeroed_not_dropped_on_a_retry() -> None:
    # zero_grad(set_to_none=False): .grad tensors exist (zero) at the start; a retry
    # zeroes them in place instead of dropping them.
    expected, _ = _one_pass()
    net = Limited(8)
    model, loader = DataParallel(net), Loader()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    tensors = [p.grad for p in model.parameters()]
    x, y = _data()
    fit_backward(model, (x, y), lambda b: ((model(b[0]) - b[1]) ** 2).mean(), loader)
    assert [p.grad for p in model.parameters()] == tensors  # the same tensors, in place
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-12, atol=1e-15)


@pytest.mark.timeout(30)
def test_the_users_cap_is_used_from_the_start_and_weigh_false_keeps_the_loss_as_given(
        ) -> None:
    net = Limited(None)
    model, loader = DataParallel(net), Loader(cap=6)
    x, y = _data()
    seen: list[int] = []

    def summed(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        seen.append(len(batch[0]))  # a sum over the micro-batch, over the part's count
        return ((model(batch[0]) - batch[1]) ** 2).sum() / (16 * 3)

    loss = fit_backward(model, (x, y), summed, loader, weigh=False)
    assert seen == [5, 5, 6]  # ceil(16 / 6) = 3 near-equal micro-batches
    expected, expected_loss = _one_pass()
    torch.testing.assert_close(float(loss), expected_loss, rtol=1e-12, atol=0)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-12, atol=1e-15)


@pytest.mark.timeout(30)
def test_one_sample_that_does_not_fit_and_other_errors_are_told_apart() -> None:
    net = Limited(0)
    model, loader = DataParallel(net), Loader()
    x, y = _data()
    with pytest.raises(OutOfMemoryError, match="one sample does not fit"):
        fit_backward(model, (x, y), lambda b: ((model(b[0]) - b[1]) ** 2).mean(), loader)
    assert net.raised == 5  # 16, 8, 4, 2, 1

    def broken(batch: Any) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        fit_backward(model, (x, y), broken, Loader())
    with pytest.raises(ConfigError, match="empty batch"):
        fit_backward(model, (x[:0], y[:0]), broken, Loader())


def test_out_of_memory_errors_are_recognized() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] "
                                         "DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocator's


def test_memory_cap_halves_below_what_ran_out_and_forgets_what_no_longer_fits() -> None:
    cap = MemoryCap(32)
    assert (cap.cap, cap.micro_batches(64), cap.micro_batches(10)) == (32, 2, 1)
    cap.fit(32)
    assert cap.known_to_fit(32) and not cap.known_to_fit(33)
    assert cap.ran_out(32) == 16  # what fitted once ran out: no longer known to fit
    assert (cap.cap, cap.known_to_fit(17), cap.known_to_fit(16)) == (16, False, False)
    assert cap.ran_out(40) == 16  # a larger size never raises the cap found
    assert MemoryCap().micro_batches(1000) == 1
    with pytest.raises(ConfigError, match="max_micro_batch=0"):
        MemoryCap(0)
    with pytest.raises(OutOfMemoryError, match="one sample"):
        MemoryCap().ran_out(1)


class Normed(nn.Module):
    """Linear, BatchNorm, dropout, then out of memory for more than ``limit`` rows
    (after the BatchNorm statistics moved and dropout drew its mask)."""

    def __init__(self, limit: int | None) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.first = nn.Linear(6, 8, dtype=torch.float64)
        self.norm = nn.BatchNorm1d(8, dtype=torch.float64)
        self.drop = nn.Dropout(0.5)
        self.last = nn.Linear(8, 3, dtype=torch.float64)
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.norm(self.first(x)))
        if self.limit is not None and len(x) > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return self.last(h)


@pytest.mark.timeout(30)
def test_a_retry_leaves_no_trace_in_buffers_or_random_streams() -> None:
    # The same part with the cap known from the start: what the retried run must equal.
    runs = []
    for limit, cap in ((4, None), (None, 4)):
        net = Normed(limit)
        model, loader = DataParallel(net), Loader(cap)
        x, y = _data()
        torch.manual_seed(9)
        fit_backward(model, (x, y), lambda b, m=model: ((m(b[0]) - b[1]) ** 2).mean(),
                     loader)
        runs.append((_grads(model), {n: b.clone() for n, b in net.named_buffers()},
                     torch.rand(3)))
    (grads, buffers, draw), (expected_grads, expected_buffers, expected_draw) = runs
    assert int(buffers["norm.num_batches_tracked"]) == 4  # the 4 micro-batches only
    for name, value in expected_buffers.items():
        torch.testing.assert_close(buffers[name], value, rtol=0, atol=0)
    for name, value in expected_grads.items():  # the same dropout masks
        torch.testing.assert_close(grads[name], value, rtol=0, atol=0)
    torch.testing.assert_close(draw, expected_draw, rtol=0, atol=0)


@pytest.mark.timeout(30)
def test_fit_backward_refuses_no_sync_and_join() -> None:
    model, x, y = DataParallel(Limited(None)), *_data()
    with model.no_sync(), pytest.raises(ConfigError, match=r"inside model\.no_sync"):
        fit_backward(model, (x, y), lambda b: ((model(b[0]) - b[1]) ** 2).mean(), Loader())
    from torch.distributed.algorithms.join import _JoinConfig

    model._join_config = _JoinConfig(enable=True, throw_on_early_termination=False,
                                     is_first_joinable=True)
    with pytest.raises(ConfigError, match="Join"):
        fit_backward(model, (x, y), lambda b: ((model(b[0]) - b[1]) ** 2).mean(), Loader())


@pytest.mark.timeout(30)
def test_a_part_that_must_be_whole_is_not_split_and_says_why() -> None:
    # trust's spot checks recompute a part in one pass: no micro-batches there
    model, x, y = DataParallel(Limited(5)), *_data()

    class Whole:
        memory = MemoryCap(whole="spot checks recompute it in one pass")

    with pytest.raises(OutOfMemoryError, match="must be taken in one pass: spot checks"):
        fit_backward(model, (x, y), lambda b: ((model(b[0]) - b[1]) ** 2).mean(), Whole())
    assert Whole.memory.cap is None and Whole.memory.micro_batches(16) == 1
    with pytest.raises(ConfigError, match="max_micro_batch=4: spot checks"):
        MemoryCap(4, whole="spot checks recompute it in one pass")
