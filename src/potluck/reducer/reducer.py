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
* A "produced a gradient" bitmap tells every rank which parameters no rank used: those
  keep ``.grad`` as it was (None stays None). It rides in the last bucket's all-reduce
  under the default mean, in the hook's own collectives for a hook that carries it
  (``hooks.BitmapCarrier``), and in one small all-reduce of its own otherwise.
* After the first synchronized pass, buckets are rebuilt once in the order gradients
  actually became ready on rank 0 (broadcast, so every rank agrees).
* A hook written for torch DDP gets a ``GradBucketView`` (``torch_hooks``); one that
  chains collectives in its future's callbacks (PowerSGD) gets one bucket at a time, and
  the reducer's own end-of-step collectives wait for every bucket, so that every rank
  issues collectives in the same order.
* A rank that ran out of inputs under torch's ``Join`` mirrors a pass with zero
  gradients (``shadow_pass``).

The reducer holds one ``GroupHandle`` for life: a new membership generation is the
handle's business, not the reducer's. A lost peer becomes ``PeerLostError``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from potluck.collectives import PendingBroadcast, wait_for
from potluck.data.memory import is_out_of_memory
from potluck.errors import (
    CommHookError,
    CommunicationError,
    ConfigError,
    PeerLostError,
    ReducerError,
)
from potluck.group import GroupHandle
from potluck.reducer.buckets import assign_buckets
from potluck.reducer.contribution import Contribution
from potluck.reducer.hook_failure import hook_error, is_backend_failure
from potluck.reducer.hooks import (
    Bucket,
    CommHook,
    allreduce_mean,
    carries_bitmap,
    sums_prescaled,
    weighted_mean,
)
from potluck.reducer.torch_hooks import (
    call_hook,
    chains_collectives,
    check_hook,
    hook_name,
    is_torch_hook,
)

log = logging.getLogger(__name__)

# Hooks under which zero bitmap entries stay zero and positive ones positive. Not
# weighted_mean: a rank with weight 0 would erase its own "used" bits.
_BITMAP_SAFE_HOOKS: frozenset[CommHook] = frozenset({allreduce_mean})
# Hooks whose result is one all-reduce's: the same bits on every rank.
_AGREED_HOOKS: frozenset[CommHook] = frozenset({allreduce_mean, weighted_mean})

# A potluck hook (takes a Bucket) or one written for torch DDP (takes a GradBucket).
AnyHook = Callable[[Any, Any], "torch.futures.Future[Any]"]


@dataclass(frozen=True)
class ReducerConfig:
    bucket_cap_bytes: int = 25 * 1024 * 1024
    first_bucket_cap_bytes: int = 1024 * 1024
    rebuild_buckets: bool = True
    # On a failed collective: raise CommunicationError out of backward(), or abandon the
    # step (drop every gradient, record the failure, return) so that an elastic loop can
    # move to the next generation and redo the step.
    abandon_on_failure: bool = False


@dataclass
class PassStats:
    """What one synchronized backward pass put on the wire (``time.perf_counter``
    instants), for observers (``potluck.metrics.observer``). On a GPU the instants are
    when the CPU launched and finished waiting, not when the kernels ran."""

    launched_at: float | None = None  # the first bucket's collective was launched
    settled_at: float | None = None  # every collective of the pass was done
    bytes: int = 0  # bucket bytes handed to the hook (before any codec)
    blocked: float = 0.0  # seconds backward spent in the launches (a hook that waits)


class Reducer:
    """Averages the gradients of ``params`` across ``group`` during backward."""

    def __init__(
        self,
        params: Sequence[torch.nn.Parameter],
        names: Sequence[str],
        group: GroupHandle | None,
        config: ReducerConfig,
        buffers: Sequence[torch.Tensor] = (),
        contribution: Contribution | None = None,
    ) -> None:
        self._params = list(params)
        self._contribution = contribution
        self._names = list(names)
        self._group = group
        self._config = config
        self._buffers = list(buffers)
        self._hook: AnyHook = allreduce_mean
        self._hook_state: Any = None
        self._prescaled = True  # the reducer weighs buckets for the hook (sums_prescaled)
        self._torch_style = False  # the hook takes a GradBucket (torch_hooks)
        self._chains = False  # ... and issues collectives from its future's callbacks
        self.require_sync = True  # set by every forward (prepare_for_forward)
        self._forwarded = False  # a forward began the pass (cleared when a pass ends)
        self._had_grads = False  # a parameter's gradient reached this pass
        self._buffer_src = 0  # the rank whose buffers are broadcast after the pass
        self.failure: CommunicationError | None = None  # set when a step was abandoned
        self._failed_generation = -1  # ... in this generation of the handle
        self._rebuilt = not config.rebuild_buckets
        self.last_pass = PassStats()  # the last synchronized pass that settled or failed
        self._pass = PassStats()
        self._issued = False  # the last pass begun issued a collective (issued_in_pass)
        self._ready_order: list[int] = []
        self._buckets: list[Bucket] = []
        self._members: list[list[int]] = []
        self._bucket_of: list[int] = []  # parameter index -> bucket index
        self._views: list[torch.Tensor] = []  # parameter index -> its view in the bucket
        self._tail: torch.Tensor | None = None  # bitmap slots after the last bucket's grads
        self._carries = False  # the hook agrees the bitmap itself (hooks.BitmapCarrier)
        self._carried: torch.Tensor | None = None  # ... this pass's, which it wrote back
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

    def register_comm_hook(self, state: Any, hook: AnyHook) -> None:
        check_hook(hook)
        if carries_bitmap(hook) and is_torch_hook(hook):
            raise ConfigError(
                f"{hook_name(hook)} carries the unused-parameter bitmap (carries_bitmap = "
                "True) but takes a torch GradBucket, which has no Bucket.produced to "
                "carry it in: take a potluck.reducer.Bucket, or drop carries_bitmap")
        fused_before = self._fuse_bitmap
        self._hook, self._hook_state = hook, state
        self._prescaled = sums_prescaled(hook)
        self._torch_style, self._chains = is_torch_hook(hook), chains_collectives(hook)
        self._carries = carries_bitmap(hook) and not self._fuse_bitmap
        if self._fuse_bitmap != fused_before:
            self._build([i for members in self._members for i in members])
        self._reset_pass()

    @property
    def _fuse_bitmap(self) -> bool:
        """Whether the unused-parameter bitmap rides in the last bucket's all-reduce.

        Only for hooks known to keep zero entries zero and positive entries positive
        (a scaled sum); any other hook gets a separate small all-reduce for the bitmap.
        """
        return self._hook in _BITMAP_SAFE_HOOKS

    @property
    def agreed_result(self) -> bool:
        """Every rank gets the same bits from the hook (an all-reduce's result: the
        default mean, the weighted mean), so what a rank decides from a synchronized
        pass's gradients alone (e.g. that they are finite) every rank decides alike."""
        return self._hook in _AGREED_HOOKS

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
        n = len(self._params)
        bucket_of = [0] * n
        views: list[torch.Tensor | None] = [None] * n
        buckets = []
        self._tail = None
        for b, members in enumerate(assignment):
            first = self._params[members[0]]
            total = sum(self._params[i].numel() for i in members)
            tail = n if self._fuse_bitmap and b == len(assignment) - 1 else 0
            buffer = torch.zeros(total + tail, dtype=first.dtype, device=first.device)
            if tail:
                self._tail = buffer[total:]
            offset = 0
            for i in members:
                param = self._params[i]
                view = buffer[offset : offset + param.numel()].view(param.shape)
                offset += param.numel()
                if param.grad is not None:
                    view.copy_(param.grad)
                    param.grad = view
                bucket_of[i], views[i] = b, view
            buckets.append(Bucket(b, buffer, tuple(self._params[i] for i in members),
                                  self._group or GroupHandle(None), count=len(assignment)))
        self._bucket_of = bucket_of
        self._views = [v for v in views if v is not None]
        self._buckets = buckets
        self._members = assignment

    def bucket_order(self) -> list[int] | None:
        """The parameter order of the buckets once rebuilt (None before): hand it to a
        late joiner's ``adopt_bucket_order`` so that its buckets match the cohort's."""
        return [i for m in self._members for i in m] if self._rebuilt else None

    def adopt_bucket_order(self, order: list[int] | None) -> None:
        """Take the cohort's bucket layout without a collective (a joiner, from a peer)."""
        if order is None:
            return
        self._rebuilt = True
        if order != [i for m in self._members for i in m]:
            self._build(order)
        self._reset_window()

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
            try:
                work = self._group.broadcast([shared], opts)
            except RuntimeError as exc:
                raise self._lost("the bucket order broadcast", exc) from exc
            self._wait(work, "bucket order broadcast")
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
        self._pass.blocked = 0.0  # (a pass that raised left its launches' time behind)
        if not self._rebuilt:  # a pass that failed before the rebuild left a partial order
            self._ready_order = []
        self._ready = bytearray(len(self._params))
        self._pending = [len(m) for m in self._members]
        self._next_launch = 0
        self._futures: list[torch.futures.Future[Any] | None] = [None] * len(self._buckets)
        self._finalize_queued = False
        # The default hook's (or a summing hook's) weighting is fused into staging (see
        # _stage): 1 / N, or this rank's part of the step when ranks train on unequal parts.
        self._prescale, self._sum_weight = 1.0, False
        if self._prescaled:
            share = self._contribution
            if share is not None and share.ready:
                self._prescale, self._sum_weight = share.scale, share.needs_total
            else:
                self._prescale = 1.0 / self.world_size

    def prepare_for_forward(self, sync: bool = True, buffer_src: int = 0) -> None:
        """Start a pass; ``sync``: its backward averages (False: gradients stay local,
        as under ``no_sync``); ``buffer_src``: whose buffers to broadcast after it.

        Gradients are not touched here on purpose.

        A ``.grad`` that is None is left None: autograd then hands over the fresh
        gradient and the ready hook copies it once into the bucket view. Zeroing the
        buckets and accumulating into them instead costs a fill and a read more per
        step. Once a gradient is a view (no_sync windows, zero_grad(set_to_none=False))
        autograd accumulates into the bucket in place.
        """
        self.require_sync, self._buffer_src = sync, buffer_src
        self._forwarded = True
        self._issued = False  # a new pass: nothing of it is on the wire yet
        self._reset_pass()

    def on_backward_start(self) -> None:
        """Called from a hook on the forward's outputs: finalize even if no grad is local."""
        if self.require_sync and self.world_size > 1 and not self._finalize_queued:
            self._finalize_queued = True
            self.failure = None  # a new step begins; a forward alone does not clear it
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
        if not self._forwarded:
            raise ReducerError(
                f"parameter {self._names[index]!r} received a gradient in a synchronized "
                "backward pass with no forward of the wrapped model since the last one: "
                "potluck begins each synchronized pass in DataParallel's forward (this "
                "rank's weight in the average, the unused parameters), so it would average "
                "it with the last pass's settings; call the wrapped model (prepare's model, "
                "or the DataParallel), not model.module or the bare module, and run one "
                "forward per synchronized backward")
        self._had_grads = True
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
        self._stage(index, param)
        if not self._finalize_queued:
            self.on_backward_start()
        b = self._bucket_of[index]
        self._pending[b] -= 1
        if b == self._next_launch and self._pending[b] == 0:
            while self._next_launch < len(self._buckets) and self._pending[self._next_launch] == 0:
                self._launch(self._next_launch)

    def _stage(self, index: int, param: torch.Tensor) -> None:
        """Bring parameter ``index``'s gradient into its bucket view, ``.grad`` = the view.

        With the default mean hook the division by the world size is fused into this
        one pass (``mul(grad, 1/N, out=view)``), and the bucket is then only summed.
        """
        view, grad, scale = self._views[index], param.grad, self._prescale
        if grad is None:  # this rank made no gradient: it contributes zeros
            self._was_none[index] = 1
            view.zero_()
        elif grad is view:  # accumulated in place (no_sync, set_to_none=False)
            if scale != 1.0:
                view.mul_(scale)
            return
        elif scale != 1.0:
            torch.mul(grad, scale, out=view)
        else:
            view.copy_(grad)
        param.grad = view

    def _launch(self, b: int, stand_in: Bucket | None = None) -> None:
        """Reduce bucket ``b``, or ``stand_in`` for it (zeros, see ``shadow_pass``)."""
        bucket = self._buckets[b] if stand_in is None else stand_in
        if b == len(self._buckets) - 1:
            bucket = self._stage_bitmap(bucket, stand_in is not None)
        self._next_launch = b + 1
        if self.failure is not None:  # the group is broken: issue nothing more on it
            return
        self._issued = True  # (kept through _finalize's reset: see issued_in_pass)
        began = time.perf_counter()
        if self._pass.launched_at is None:
            self._pass.launched_at = began
        self._pass.bytes += bucket.buffer.nbytes
        try:
            if self._chains and b > 0:  # every collective of bucket b - 1 issued first
                self._result(b - 1)
            if self._hook is allreduce_mean:  # weighted while staging: sum only
                self._futures[b] = bucket.group.allreduce([bucket.buffer]).get_future()
            else:
                self._futures[b] = call_hook(self._hook, self._hook_state, bucket,
                                             len(self._buckets), self._torch_style)
        except CommunicationError as lost:
            if not self._config.abandon_on_failure:
                raise
            self._fail(lost)
        except (ConfigError, CommHookError):  # the hook refused its input, or failed
            raise  # in its own code (a chain's earlier bucket): not a lost peer
        except RuntimeError as exc:
            if is_out_of_memory(exc):  # this rank ran out of memory in it: not a lost
                raise  # peer (potluck.fit_backward says what to do)
            if self._hook is not allreduce_mean and not is_backend_failure(exc):
                raise self._hook_error(f"bucket {b}", exc) from exc
            error = self._lost(f"bucket {b}'s all-reduce", exc)
            if not self._config.abandon_on_failure:
                raise error from exc
            self._fail(error)
        finally:
            self._pass.blocked += time.perf_counter() - began

    def _stage_bitmap(self, bucket: Bucket, shadow: bool) -> Bucket:
        """The last bucket, with the pass's bitmap where it rides: in the tail of its
        buffer (a shadow pass produced nothing: its stand-in's tail is zeros already),
        or for a hook that carries it, in ``Bucket.produced``: a new tensor each pass,
        so that a late callback of an abandoned pass cannot write into the next one's."""
        if self._tail is not None and not shadow:
            self._tail.copy_(torch.frombuffer(self._produced, dtype=torch.uint8))
        self._carried = None
        if not self._carries or not self._params:
            return bucket
        produced = bytearray(len(self._params)) if shadow else bytearray(self._produced)
        self._carried = torch.frombuffer(produced, dtype=torch.uint8)
        return dataclasses.replace(bucket, produced=self._carried)

    def _finalize(self) -> None:
        """End of a synchronized backward: every bucket reduced before backward returns."""
        try:
            if self.failure is None:
                self._complete_pass()
        except CommunicationError as exc:
            if not self._config.abandon_on_failure:
                raise
            self._fail(exc)
        finally:
            # (a pass no parameter's gradient reached, e.g. torch.autograd.grad of the
            # output for a gradient penalty, leaves the forward to the backward after it)
            self._forwarded = self._forwarded and not self._had_grads
            self._had_grads = False
            if self.failure is not None:
                self._abandon()
            self._pass.settled_at = time.perf_counter()
            self.last_pass, self._pass = self._pass, PassStats()
            self._reset_window()

    def _fail(self, error: CommunicationError) -> None:
        self.failure = error
        self._failed_generation = -1 if self._group is None else self._group.generation

    @property
    def blocked_in_pass(self) -> float:
        """Seconds the pass in progress has spent in its launches so far: a hook that
        waits for its collectives (trust's, a compressed sum's scatter) blocks backward
        there; the compute clock leaves that time out."""
        return self._pass.blocked

    @property
    def step_failed(self) -> bool:
        """The last synchronized backward's collectives failed in the current generation.

        A new generation starts clean: with one member left, no backward of it ever
        communicates (nor clears ``failure``), yet its steps must be applied."""
        generation = -1 if self._group is None else self._group.generation
        return self.failure is not None and self._failed_generation == generation

    def _abandon(self) -> None:
        """Drop every gradient of the failed step: a bucket may be half-reduced."""
        for param in self._params:
            param.grad = None
        log.warning("step abandoned, gradients dropped: %s", self.failure)

    def _complete_pass(self) -> None:
        for i, param in enumerate(self._params):
            if not self._ready[i]:
                self._stage(i, param)
        for b in range(self._next_launch, len(self._buckets)):
            self._launch(b)
        if self.failure is not None:  # a launch failed: nothing more on this group
            raise self.failure
        self._settle(self._produced, write_back=True)

    def _settle(self, produced_map: bytearray, write_back: bool) -> None:
        """Wait for every bucket (``write_back``: its reduced tensor becomes the bucket) and
        run the end-of-step collectives: the unused-parameter bitmap (unless fused), the
        buffer broadcast, and once the bucket rebuild."""
        group = self._communicating()
        # A chaining hook may still be issuing collectives: let it finish first.
        results = [self._result(b) for b in range(len(self._buckets))] if self._chains else []
        produced_work = weight = weight_work = None
        try:
            if self._sum_weight and self._contribution is not None:
                # A rank mirroring a pass under Join contributes nothing, but takes part.
                mine = self._contribution.weight if write_back else 0.0
                weight = torch.tensor([mine], dtype=torch.float64,
                                      device=self._buckets[0].buffer.device)
                weight_work = group.allreduce([weight])
            if self._tail is None and not self._carries and self._params:
                produced = torch.frombuffer(bytearray(produced_map), dtype=torch.uint8).to(
                    device=self._buckets[0].buffer.device, dtype=torch.int32
                )
                produced_work = group.allreduce([produced])
            buffers = (PendingBroadcast(self._buffers, group, src=self._buffer_src)
                       if self._buffers else None)
        except RuntimeError as exc:
            raise self._lost("the end-of-step collectives", exc) from exc
        results = results or [self._result(b) for b in range(len(self._buckets))]
        for bucket, result in zip(self._buckets, results, strict=True):
            if write_back and result.data_ptr() != bucket.buffer.data_ptr():
                bucket.buffer.copy_(result)  # the hook returned another tensor
        if weight_work is not None and weight is not None:
            self._wait(weight_work, "the step's total weight")
            total = float(weight.item())  # 0 (all padding): inf/NaN, skipped by every rank
            for bucket in self._buckets if write_back else ():
                bucket.buffer.div_(total)  # zero bitmap entries stay zero
        if produced_work is not None:
            self._wait(produced_work, "unused-parameter bitmap")
        else:
            produced = self._agreed_bitmap()
        if any(self._was_none):
            for i in (produced == 0).nonzero().flatten().tolist():
                if self._was_none[i]:
                    self._params[i].grad = None
        if buffers is not None:
            buffers.wait()  # settles on the handle: a lost peer is PeerLostError
        if not self._rebuilt:
            self._rebuild_from_ready_order()

    def _agreed_bitmap(self) -> torch.Tensor:
        """The bitmap every rank holds after the pass, where no all-reduce of its own
        summed it: the last bucket's tail, or what the carrying hook wrote back."""
        if self._tail is not None:
            return self._tail
        if self._carried is not None:
            return self._carried
        return torch.ones(0)

    def shadow_pass(self, buffer_src: int) -> None:
        """Mirror one synchronized backward with zero gradients, leaving ``.grad`` alone.

        For a rank that ran out of inputs under torch's ``Join``: it issues the same
        collectives in the same order as the ranks still training (same buckets, same
        hook, bitmap, buffer broadcast, rebuild) and contributes nothing to the average.
        """
        self.prepare_for_forward(sync=True, buffer_src=buffer_src)
        self._was_none = bytearray(len(self._params))  # keep this rank's .grad as it is
        for b, bucket in enumerate(self._buckets):
            self._launch(b, dataclasses.replace(bucket, buffer=torch.zeros_like(bucket.buffer)))
        if self.failure is not None:
            raise self.failure
        self._settle(bytearray(len(self._params)), write_back=False)
        self._reset_window()

    def reduce_now(self) -> None:
        """Average the current ``.grad`` of every parameter outside of backward, as a
        synchronized backward's end would (the same failure handling, pass statistics
        and window reset).

        For gradients accumulated under ``no_sync`` (``step.fit``), benchmarks, and
        callers that produce gradients by other means; every rank must call it at the
        same point.
        """
        if self.world_size == 1:
            return
        self.prepare_for_forward()
        self.failure = None  # a new step begins, as in on_backward_start
        self._finalize()

    @property
    def issued_in_pass(self) -> bool:
        """Whether the last pass begun (by a forward or ``reduce_now``) issued a
        collective, even one whose end failed: its peers then expect the rest of it, so
        it can no longer be taken back. Unlike the pass statistics this survives the
        reset at the end of a pass that raised."""
        return self._issued

    def start_window(self) -> None:
        """A new step's gradient passes begin (``fit_backward``): what earlier steps
        issued is not theirs."""
        self._issued = False

    def restart_window(self) -> bool:
        """Forget the accumulation window so far (passes that ran out of memory), before
        any collective of it: True, or False (nothing changed) if one was issued."""
        if self._issued:
            return False
        self._reset_window()
        return True

    # ------------------------------------------------------------------------ errors

    def _lost(self, what: str, cause: BaseException | str) -> PeerLostError:
        group = self._group
        generation = 0 if group is None else group.generation
        rank = group.rank() if group is not None and group.usable else -1
        return PeerLostError.from_failure(what, cause, rank=rank, generation=generation)

    def _hook_error(self, what: str, cause: BaseException) -> CommHookError:
        group = self._group
        rank = group.rank() if group is not None and group.usable else -1
        return hook_error(hook_name(self._hook), what, cause, rank)

    def _result(self, b: int) -> torch.Tensor:
        future = self._futures[b]
        assert future is not None  # launched: every launch before the first failure sets it
        return self._value(future, f"bucket {b}")

    def _value(self, future: torch.futures.Future[Any], what: str) -> torch.Tensor:
        # Elastic: a live peer that gave up on the step never sends, and Gloo would wait
        # out its whole timeout; the handle says so without I/O (see wait_for).
        try:
            value = wait_for(future, self._communicating(), f"{what}'s all-reduce")
        except PeerLostError as lost:
            cause = lost.__cause__  # what the future failed with, if it failed
            if (self._hook is not allreduce_mean and isinstance(cause, RuntimeError)
                    and not is_backend_failure(cause)):
                raise self._hook_error(what, cause) from cause
            raise
        if isinstance(value, (list, tuple)):
            value = value[0]
        if not isinstance(value, torch.Tensor):
            raise ReducerError(
                f"the communication hook's future for {what} gave {type(value).__name__}; "
                "it must give the reduced flat tensor (or a one-element list of it)"
            )
        return value

    def _wait(self, work: Any, what: str) -> None:
        wait_for(work, self._communicating(), what)

    def _communicating(self) -> GroupHandle:
        group = self._group
        assert group is not None  # waits happen only in passes with a world size > 1
        return group
