"""``fit_backward``: this rank's part of the step, in micro-batches that fit in memory.

    for batch in loader:
        optimizer.zero_grad()
        loss = potluck.fit_backward(model, batch, lambda b: loss_fn(model(b[0]), b[1]),
                                    loader)
        optimizer.step()

The part goes in ``loader.memory.micro_batches(samples)`` micro-batches
(``data.memory.MemoryCap``: the user's cap, ``prepare(max_micro_batch=...)``, lowered
by what ran out of memory). When a micro-batch runs out of memory
(``torch.OutOfMemoryError``, or an allocator's RuntimeError saying so), the gradients
of the step so far are dropped, the cap is halved to below that micro-batch, and the
whole part is taken again in smaller ones: nothing of the failed attempt stays in the
gradient, so the result is exactly the part's mean gradient, as in one pass.

A retry is only possible before the pass issued a collective: its peers would expect
the rest of it. So a micro-batch size not known to fit yet (the first step, a share
that grew) is taken with every backward local (``no_sync``) and the accumulated
gradients are synced after (``DataParallel.sync_now``): a step without the overlap of
the all-reduce with the last backward, once per new size. Such a try also puts back
the buffers (BatchNorm statistics) and the random streams before a retry, so the
failed forwards leave no trace. Sizes known to fit take the last micro-batch's
backward synchronized as usual; should one of those run out of memory after a
collective was issued (memory that got shorter since), or the sync after local
backwards, the rank raises ``OutOfMemoryError`` with a smaller cap to give. A retry
of a size known to fit (an error before any collective) drops the gradients but not
what the failed forward did to the buffers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from potluck.checkpoint.rng import capture_rng, restore_rng
from potluck.data.memory import MemoryCap, is_out_of_memory
from potluck.errors import ConfigError, OutOfMemoryError
from potluck.events import note
from potluck.step.accumulate import batch_size, split_batch

log = logging.getLogger(__name__)


class Replica(Protocol):
    """What ``fit_backward`` needs of the model (``potluck.DataParallel`` has it)."""

    require_backward_grad_sync: bool

    @property
    def under_join(self) -> bool: ...

    def no_sync(self) -> contextlib.AbstractContextManager[None]: ...

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]: ...

    def start_accumulation(self) -> None: ...

    def sync_now(self) -> None: ...

    def restart_accumulation(self) -> bool: ...


class Fitted(Protocol):
    """What ``fit_backward`` needs of the loader (``potluck.prepare``'s has it)."""

    @property
    def memory(self) -> MemoryCap: ...


def fit_backward(model: Replica, batch: Any, loss_of: Callable[[Any], torch.Tensor],
                 loader: Fitted, *, weigh: bool = True) -> torch.Tensor:
    """Forward and backward of ``batch`` (this rank's part) in micro-batches that fit;
    returns the part's loss (detached). ``loss_of(micro_batch)`` is the mean loss over
    the micro-batch; each is weighed by its samples over the part's (``weigh=False``:
    ``loss_of`` weighs it itself, e.g. its tokens' loss sum over the part's tokens).
    Call ``optimizer.zero_grad()`` before: a retry starts again from zero gradients."""
    memory, size = loader.memory, batch_size(batch)
    if size == 0:
        raise ConfigError("fit_backward() got an empty batch: this rank would skip the "
                          "synchronized backward that every other rank waits for; give "
                          "every rank at least one sample per step")
    if model.under_join:
        raise ConfigError("fit_backward() under torch's Join: there every forward is a "
                          "collective vote, so a part cannot be taken again; use "
                          "potluck.accumulate there")
    if not model.require_backward_grad_sync:
        raise ConfigError("fit_backward() inside model.no_sync(): it takes one step's part "
                          "and syncs it (a retry would also drop the gradients accumulated "
                          "before); call it once per step, outside no_sync()")
    params = [p for p in model.parameters() if p.requires_grad]
    was_none = [p.grad is None for p in params]
    model.start_accumulation()  # what the last step put on the wire is not this one's
    while True:
        chunks = split_batch(batch, memory.micro_batches(size))
        largest = max(round(weight * size) for _, weight in chunks)  # (the split's own)
        probe = not memory.known_to_fit(largest)
        # A new size: what the failed forwards would change besides the gradients
        # (BatchNorm statistics, the random streams) is put back before a retry.
        before = _State(model) if probe else None
        try:
            loss = _passes(model, chunks, loss_of, weigh, sync_last=not probe)
        except Exception as error:  # only out-of-memory errors are retried
            if not is_out_of_memory(error):
                raise
            if not model.restart_accumulation():
                raise _too_late(largest, error) from error
        else:
            if probe:
                try:
                    model.sync_now()  # collectives go out here: never retried
                except Exception as error:
                    if is_out_of_memory(error):
                        raise _short_in_sync(error) from error
                    raise
            memory.fit(largest)
            return loss
        # Out of the handler: the error's frames (and the tensors they hold) are gone.
        _drop_gradients(params, was_none)
        if before is not None:
            before.restore(model)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # (a no-op where CUDA was never initialized)
        cap = memory.ran_out(largest)
        log.warning("out of memory on a micro-batch of %d sample(s): taking the part of "
                    "%d again in micro-batches of at most %d", largest, size, cap)
        note("memory", f"out of memory on {largest} sample(s) per forward; at most {cap} "
                       "from now on")


def _short_in_sync(error: BaseException) -> OutOfMemoryError:
    return OutOfMemoryError(
        "ran out of memory in the sync after the local backwards (the gradient buckets' "
        "collectives or a communication hook's buffers, not the micro-batches), after "
        "collectives had gone out, so the step cannot be taken again here. Give the "
        "all-reduce smaller buckets (potluck.prepare(..., bucket_cap_mb=...)) or free "
        f"the device's memory: {error}")


def _too_late(largest: int, error: BaseException) -> OutOfMemoryError:
    return OutOfMemoryError(
        f"ran out of memory on a micro-batch of {largest} sample(s) after the step's "
        "all-reduce had begun, so the step cannot be taken again here: its peers wait "
        "for the rest of it. Give this worker a smaller cap, e.g. potluck.prepare(..., "
        f"max_micro_batch={max(1, largest // 2)}) (half of what ran out), or free the "
        f"device's memory: {error}")


class _State:
    """The buffers' values (on the host: memory on the device may be what is short)
    and the random generators' states (``checkpoint.rng``), to put back."""

    def __init__(self, model: Replica) -> None:
        self.buffers = {name: b.detach().to("cpu", copy=True)
                        for name, b in model.named_buffers()}
        self.rng = capture_rng()

    def restore(self, model: Replica) -> None:
        """By name; a buffer the failed forward replaced by one of another shape (a
        cache that grew) or added is left as it is."""
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                value = self.buffers.get(name)
                if value is not None and value.shape == buffer.shape:
                    buffer.copy_(value)
        restore_rng(self.rng)


def _passes(model: Replica, chunks: list[tuple[Any, float]],
            loss_of: Callable[[Any], torch.Tensor], weigh: bool,
            sync_last: bool) -> torch.Tensor:
    total: torch.Tensor | None = None
    for index, (chunk, weight) in enumerate(chunks):
        synced = sync_last and index == len(chunks) - 1
        with contextlib.nullcontext() if synced else model.no_sync():
            loss = loss_of(chunk)
            if weigh:
                loss = loss * weight
            torch.autograd.backward(loss)
        part = loss.detach()
        total = part if total is None else total + part
    assert total is not None  # split_batch gives at least one chunk of a non-empty part
    return total


def _drop_gradients(params: list[torch.nn.Parameter], was_none: list[bool]) -> None:
    """Back to the step's start: None where ``.grad`` was None, zero elsewhere (in place:
    a bucket view stays one)."""
    for param, none in zip(params, was_none, strict=True):
        if none:
            param.grad = None
        elif param.grad is not None:
            param.grad.zero_()

