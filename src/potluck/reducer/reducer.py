"""The gradient reducer: bucketed, overlapped averaging of gradients across ranks.

Contract, per synchronized backward pass:

* Every trainable parameter's ``.grad`` is a view into a flat bucket buffer, so the
  autograd engine accumulates straight into the buffer that is sent (no copies).
* A post-accumulate-grad hook marks a parameter ready; when every parameter of a
  bucket is ready, buckets are launched through the communication hook strictly in
  bucket order (collectives must be issued in the same order on every rank).
* A callback queued on the autograd engine runs when the backward pass ends: it
  launches any bucket still waiting (parameters this rank did not use contribute their
  current gradient, zero if none), waits for every bucket, and only then does
  ``backward()`` return, so gradients are final (averaged) for clipping and stepping.
* One small all-reduce of a "produced a gradient" bitmap tells every rank which
  parameters no rank used: those keep ``.grad`` as it was (None stays None).
* After the first synchronized pass, buckets are rebuilt once in the order gradients
  actually became ready on rank 0 (broadcast, so every rank agrees).

The group can be swapped between steps (``set_group``); the reducer never looks at the
default group.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from potluck.errors import CommunicationError, ReducerError
from potluck.reducer.buckets import assign_buckets
from potluck.reducer.collectives import Group, PendingBroadcast
from potluck.reducer.hooks import Bucket, CommHook, allreduce_mean

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReducerConfig:
    bucket_cap_bytes: int = 25 * 1024 * 1024
    first_bucket_cap_bytes: int = 1024 * 1024
    rebuild_buckets: bool = True


@dataclass(frozen=True)
class _Slot:
    """Where parameter i's gradient lives: bucket index and its view into the buffer."""

    bucket: int
    view: torch.Tensor


class Reducer:
    """Averages the gradients of ``params`` across ``group`` during backward."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        group: Group | None,
        config: ReducerConfig,
        buffers: Sequence[torch.Tensor] = (),
    ) -> None:
        self._params = list(params)
        self._names = list(names)
        self._group = group
        self._config = config
        self._buffers = list(buffers)
        self._hook: CommHook = allreduce_mean
        self._hook_state: Any = None
        self.require_sync = True
        self._rebuilt = not config.rebuild_buckets
        self._ready_order: list[int] = []
        self._buckets: list[Bucket] = []
        self._slots: list[_Slot] = []
        self._build(list(reversed(range(len(self._params)))))
        self._reset_window()
        self._handles = [
            p.register_post_accumulate_grad_hook(self._make_hook(i))  # type: ignore[no-untyped-call]
            for i, p in enumerate(self._params)
        ]

    # ----------------------------------------------------------------- configuration

    @property
    def world_size(self) -> int:
        return 1 if self._group is None else int(self._group.size())

    @property
    def buckets(self) -> list[Bucket]:
        return list(self._buckets)

    def set_group(self, group: Group | None) -> None:
        """Use ``group`` from the next backward on (a new membership generation)."""
        self._group = group
        self._buckets = [
            Bucket(b.index, b.buffer, b.parameters, group) for b in self._buckets
        ]
        self._reset_window()

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        self._hook, self._hook_state = hook, state

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ bucket layout

    def _build(self, order: list[int]) -> None:
        """(Re)allocate bucket buffers for ``order``, keeping every existing gradient."""
        sizes = [p.numel() * p.element_size() for p in self._params]
        keys = [(p.device, p.dtype) for p in self._params]
        assignment = assign_buckets(
            sizes, keys, order, self._config.bucket_cap_bytes,
            self._config.first_bucket_cap_bytes,
        )
        slots: list[_Slot | None] = [None] * len(self._params)
        buckets = []
        for b, members in enumerate(assignment):
            first = self._params[members[0]]
            total = sum(self._params[i].numel() for i in members)
            buffer = torch.zeros(total, dtype=first.dtype, device=first.device)
            offset = 0
            for i in members:
                param = self._params[i]
                view = buffer[offset : offset + param.numel()].view(param.shape)
                offset += param.numel()
                if param.grad is not None:
                    view.copy_(param.grad)
                    param.grad = view
                slots[i] = _Slot(b, view)
            buckets.append(Bucket(b, buffer, tuple(self._params[i] for i in members),
                                  self._group))
        self._slots = [s for s in slots if s is not None]
        self._buckets = buckets
        self._members = assignment

    def _rebuild_from_ready_order(self) -> None:
        """Rebuild buckets once in rank 0's observed ready order (every rank agrees)."""
        self._rebuilt = True
        seen = set(self._ready_order)
        order = self._ready_order + [
            i for i in reversed(range(len(self._params))) if i not in seen
        ]
        if self._group is not None and self.world_size > 1:
            device = self._params[0].device if self._params else torch.device("cpu")
            shared = torch.tensor(order, dtype=torch.int64, device=device)
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            self._wait(self._group.broadcast([shared], opts), "bucket order broadcast")
            order = [int(i) for i in shared.tolist()]
        if order != [i for members in self._members for i in members]:
            self._build(order)
            log.debug("rebuilt %d buckets in observed gradient-ready order", len(self._buckets))

    # --------------------------------------------------------------- per-step protocol

    def _reset_window(self) -> None:
        """Start a new accumulation window (after a synchronized backward)."""
        n = len(self._params)
        self._produced = bytearray(n)  # produced a gradient since the window began
        self._was_none = bytearray(n)  # .grad was None when potluck installed the view
        self._reset_pass()

    def _reset_pass(self) -> None:
        """Start a new synchronized backward pass."""
        self._ready = bytearray(len(self._params))
        self._pending = [len(m) for m in self._members]
        self._next_launch = 0
        self._futures: list[torch.futures.Future[Any] | None] = [None] * len(self._buckets)
        self._finalize_queued = False

    def prepare_for_forward(self) -> None:
        """Make every ``.grad`` a view into its bucket, so backward accumulates in place."""
        self._reset_pass()
        zero_whole: set[int] = set()
        for b, members in enumerate(self._members):
            if all(self._params[i].grad is None for i in members):
                zero_whole.add(b)
                self._buckets[b].buffer.zero_()
        for i, param in enumerate(self._params):
            slot = self._slots[i]
            grad = param.grad
            if grad is slot.view:
                continue
            if grad is None:
                self._was_none[i] = 1
                if slot.bucket not in zero_whole:
                    slot.view.zero_()
            else:
                slot.view.copy_(grad)
            param.grad = slot.view

    def on_backward_start(self) -> None:
        """Called from a hook on the forward's outputs: finalize even if no grad is local."""
        if self.require_sync and self.world_size > 1 and not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)

    def _make_hook(self, index: int) -> Any:
        def hook(param: torch.Tensor) -> None:
            self._mark_ready(index, param)

        return hook

    def _mark_ready(self, index: int, param: torch.Tensor) -> None:
        if self.world_size == 1:
            return
        self._produced[index] = 1
        if not self.require_sync:
            return
        if self._ready[index]:
            raise ReducerError(
                f"parameter {self._names[index]!r} received its gradient twice in one "
                "backward pass (reentrant checkpointing or a reused graph?); potluck "
                "averages each gradient once per pass: use non-reentrant checkpointing "
                "(use_reentrant=False) or call backward once per forward"
            )
        self._ready[index] = 1
        if not self._rebuilt:
            self._ready_order.append(index)
        slot = self._slots[index]
        if param.grad is not slot.view:  # .grad was None or replaced before this pass
            slot.view.copy_(param.grad)  # type: ignore[arg-type]
            param.grad = slot.view
        self.on_backward_start()
        self._pending[slot.bucket] -= 1
        while self._next_launch < len(self._buckets) and self._pending[self._next_launch] == 0:
            self._launch(self._next_launch)

    def _launch(self, b: int) -> None:
        self._futures[b] = self._hook(self._hook_state, self._buckets[b])
        self._next_launch = b + 1

    def _finalize(self) -> None:
        """End of a synchronized backward: every bucket reduced before backward returns."""
        try:
            self._complete_pass()
        finally:
            self._reset_window()

    def _complete_pass(self) -> None:
        group = self._group
        assert group is not None  # guarded by on_backward_start
        for i, param in enumerate(self._params):
            if self._ready[i]:
                continue
            slot = self._slots[i]
            if param.grad is None:
                self._was_none[i] = 1
                slot.view.zero_()
                param.grad = slot.view
            elif param.grad is not slot.view:
                slot.view.copy_(param.grad)
                param.grad = slot.view
        for b in range(self._next_launch, len(self._buckets)):
            self._launch(b)
        device = self._buckets[0].buffer.device if self._buckets else torch.device("cpu")
        produced = torch.frombuffer(bytearray(self._produced), dtype=torch.uint8).to(
            device=device, dtype=torch.int32
        )
        produced_work = group.allreduce([produced])
        buffers = PendingBroadcast(self._buffers, group) if self._buffers else None
        for bucket, future in zip(self._buckets, self._futures, strict=True):
            assert future is not None
            result = self._value(future, f"bucket {bucket.index}")
            if result is not bucket.buffer and result.data_ptr() != bucket.buffer.data_ptr():
                bucket.buffer.copy_(result)
        self._wait(produced_work, "unused-parameter bitmap")
        for i in (produced == 0).nonzero().flatten().tolist():
            if self._was_none[i]:
                self._params[i].grad = None
        if buffers is not None:
            buffers.wait()
        if not self._rebuilt:
            self._rebuild_from_ready_order()

    def reduce_now(self) -> None:
        """Average the current ``.grad`` of every parameter outside of backward.

        Used by benchmarks and by callers that produce gradients by other means; every
        rank must call it at the same point.
        """
        if self.world_size == 1:
            return
        self.prepare_for_forward()
        self._complete_pass()
        self._reset_window()

    # ------------------------------------------------------------------------ errors

    @staticmethod
    def _value(future: torch.futures.Future[Any], what: str) -> torch.Tensor:
        try:
            value = future.wait()
        except RuntimeError as exc:
            raise CommunicationError(f"{what} failed to all-reduce: {exc}") from exc
        if isinstance(value, (list, tuple)):
            value = value[0]
        if not isinstance(value, torch.Tensor):
            raise ReducerError(
                f"the communication hook's future for {what} gave {type(value).__name__}; "
                "it must give the reduced flat tensor (or a one-element list of it)"
            )
        return value

    @staticmethod
    def _wait(work: Any, what: str) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            raise CommunicationError(f"{what} failed: {exc}") from exc
