"""``potluck.DataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Wraps a module so that ``loss.backward()`` returns with gradients averaged across the
process group. At construction every rank checks that all ranks hold the same model,
then takes rank 0's parameters and buffers. Buffers (BatchNorm statistics) are
broadcast from rank 0 at the end of every synchronized backward, so replicas hold the
same buffers between steps and every forward starts from rank 0's.

Works on an explicit group object or a cohort's ``GroupHandle`` (``cohort.group``), which
it holds for life: when an elastic cohort moves to a new generation, the handle follows
and so does every step after. Without one it takes torch's default group, else the
cohort ``potluck.init()`` returned; with neither, a single process communicates nothing,
and a worker a launcher started among several is refused (each would train alone).

Also what code written for torch DDP touches: ``require_backward_grad_sync`` (what
``no_sync()`` sets; read by every forward), torch's communication hooks
(``torch_hooks``), torch's ``Join`` for uneven inputs (``join``), and DDP's read-only
attributes (``process_group``, ``find_unused_parameters``, ``static_graph``,
``gradient_as_bucket_view``, ``bucket_bytes_cap``) with the values that hold here.

A model built without ``clock=`` may still be timed: ``watch_models`` lets a layer above
(``potluck run``'s worker bootstrap, through ``potluck.metrics.plain``) hand it a
``StepWatch``. A plain loop has no step transaction, so the model tells the watch where
a step ends: when a backward that averages gradients has settled its collectives.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable

from potluck.cohort.current import current
from potluck.collectives import Group, broadcast_coalesced, default_group
from potluck.env import launched_world_size
from potluck.errors import ConfigError
from potluck.group import GroupHandle, as_handle
from potluck.reducer.consistency import same_values, verify_same_model
from potluck.reducer.contribution import Contribution
from potluck.reducer.hooks import Bucket
from potluck.reducer.join import DataParallelJoinHook, iteration_vote
from potluck.reducer.options import (
    check_bucket_sizes,
    check_device_ids,
    check_flags,
    check_module,
)
from potluck.reducer.reducer import AnyHook, Reducer, ReducerConfig
from potluck.reducer.torch_hooks import hook_name, is_torch_hook

log = logging.getLogger(__name__)

_MB = 1024 * 1024


class LocalClock(Protocol):
    """Times this rank's own compute (``potluck.balance.ComputeClock``)."""

    def forward_started(self) -> None: ...

    def backward_done(self, waited: float = 0.0) -> None:
        """``waited``: seconds of the pass this rank spent blocked in its collectives
        (a communication hook that waits, as trust's does), not computing."""


class StepWatch(LocalClock, Protocol):
    """Times the steps of a model that no step transaction drives (a plain loop).

    ``committed``: a backward that averages gradients has settled its collectives (the
    step's end). ``abandoned``: that backward failed, its step is void."""

    def committed(self) -> object: ...

    def abandoned(self) -> None: ...


# The one who times models built without clock=, if any (``watch_models``).
WatchFactory = Callable[["DataParallel"], "StepWatch | None"]
_watch_lock = threading.Lock()
_watchers: list[WatchFactory] = []


def watch_models(factory: WatchFactory) -> Callable[[], None]:
    """Hand each ``DataParallel`` built from now on without ``clock=`` to ``factory``.

    The watch it returns times that model's steps; None leaves the model alone. This is
    how a layer above the reducer sees a plain script's steps without the reducer
    importing it. Returns the call that stops watching."""
    with _watch_lock:
        _watchers.append(factory)

    def stop() -> None:
        with _watch_lock:
            if factory in _watchers:
                _watchers.remove(factory)

    return stop


def _watch_for(model: DataParallel) -> StepWatch | None:
    """The first watch a factory gives ``model``. A factory that fails is logged and
    skipped: seeing the run must never stop it."""
    with _watch_lock:
        factories = list(_watchers)
    for factory in factories:
        try:
            watch = factory(model)
        except Exception:
            log.warning("a step watch could not be made; this model is not timed",
                        exc_info=True)
            continue
        if watch is not None:
            return watch
    return None


class DataParallel(nn.Module, Joinable):
    """Data-parallel wrapper: one full replica per rank, gradients averaged in backward.

    Arguments that torch's DDP takes and potluck does not need (``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``output_device``, ``dim``) are
    accepted so that code swaps the class unchanged: unused parameters are always
    handled, and gradients are always bucket views. It is not a subclass of torch's DDP:
    code that tests ``isinstance(model, DistributedDataParallel)`` to unwrap should use
    ``model.module`` (docs/data-parallel.md).
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        *,
        group: Group | None = None,
        process_group: Group | None = None,
        bucket_cap_mb: float | None = 25.0,
        first_bucket_cap_mb: float = 1.0,
        broadcast_buffers: bool = True,
        comm_hook: AnyHook | None = None,
        comm_state: Any = None,
        check_model: bool = True,
        init_sync: bool = True,
        on_failure: str = "raise",
        contribution: Contribution | None = None,
        clock: LocalClock | None = None,
        sync_gradients: bool = True,
        **torch_ddp_compat: Any,
    ) -> None:
        super().__init__()
        Joinable.__init__(self)
        _check_compat_kwargs(torch_ddp_compat)
        if isinstance(module, (DataParallel, torch.nn.parallel.DistributedDataParallel)):
            raise ConfigError(
                f"DataParallel got a module already wrapped in {type(module).__name__}: each "
                "wrapper averages the gradients again, so they would be divided by the world "
                "size twice; wrap the plain module once (module.module is the plain one)")
        if group is not None and process_group is not None and group is not process_group:
            raise ConfigError("pass the process group once: either group= or process_group=")
        if on_failure not in ("raise", "abandon"):
            raise ConfigError(
                f"on_failure={on_failure!r}: use 'raise' (a failed collective raises "
                "CommunicationError from backward) or 'abandon' (the step is dropped and "
                "step_failed is set, for elastic training)"
            )
        if bucket_cap_mb is None:
            bucket_cap_mb = 25.0
        check_bucket_sizes(bucket_cap_mb, first_bucket_cap_mb)
        check_flags({"broadcast_buffers": broadcast_buffers, "check_model": check_model,
                     "init_sync": init_sync, "sync_gradients": sync_gradients})
        check_module(module)
        check_device_ids(device_ids, _module_device(module))
        self.module = module
        self.device_ids = list(device_ids) if device_ids else None
        self.broadcast_buffers = broadcast_buffers
        # What no_sync() sets, as in torch DDP; every forward reads it.
        self.require_backward_grad_sync = True
        # False: every backward stays local, for a sync strategy that reconciles the
        # replicas' parameters every few steps instead (potluck.prepare(sync=DiLoCo(...))).
        self._sync_gradients = sync_gradients
        explicit = group if group is not None else process_group
        plain = explicit if explicit is not None else _implicit_group()
        self._group = as_handle(plain)
        # The user's own process group (not a potluck handle): what torch's Join and
        # torch's hooks can talk on.
        self._process_group = None if isinstance(plain, GroupHandle) else plain
        self._bucket_bytes_cap = max(1, int(bucket_cap_mb * _MB))
        # potluck.prepare's: this rank's part of each step's average, and its compute clock
        self._clock, self._clock_queued = clock, False

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        buffers = list(module.buffers()) if broadcast_buffers else []
        self._device = _module_device(module)
        group = self._group
        # A late joiner (init_sync=False) gets the state from the cohort instead.
        if group is not None and self.world_size > 1 and init_sync:
            if check_model:
                verify_same_model(module, group, self._device)
            state = [p.detach() for _, p in module.named_parameters()]
            state += list(module.buffers())
            if state and not same_values(state, group, self._device):
                with torch.no_grad():  # (equal replicas skip a model's worth of bytes)
                    broadcast_coalesced(state, group, src=0)
        self.reducer = Reducer(
            [p for _, p in named],
            [n for n, _ in named],
            self._group,
            ReducerConfig(
                bucket_cap_bytes=self._bucket_bytes_cap,
                first_bucket_cap_bytes=max(1, int(first_bucket_cap_mb * _MB)),
                abandon_on_failure=on_failure == "abandon",
            ),
            buffers=buffers,
            contribution=contribution,
        )
        if comm_hook is not None:
            self.register_comm_hook(comm_state, comm_hook)
        # Built by hand (no clock=): a watch from above may time its steps.
        self._watch = _watch_for(self) if clock is None else None
        self._watch_queued = False
        if self._watch is not None:
            self._clock = self._watch

    # ------------------------------------------------------------------- properties

    @property
    def group(self) -> GroupHandle | None:
        return self._group

    @property
    def world_size(self) -> int:
        return 1 if self._group is None else int(self._group.size())

    @property
    def rank(self) -> int:
        return 0 if self._group is None else int(self._group.rank())

    @property
    def buckets(self) -> list[Bucket]:
        return self.reducer.buckets

    @property
    def step_failed(self) -> bool:
        """True after a backward whose collectives failed (``on_failure="abandon"``)."""
        return self.reducer.step_failed

    def register_comm_hook(self, state: Any, hook: AnyHook) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> Future``: a potluck hook (gets a
        ``potluck.reducer.Bucket``) or one of torch DDP's (gets a ``GradBucket``)."""
        if is_torch_hook(hook) and self._process_group is None and self._group is not None:
            raise ConfigError(
                f"{hook_name(hook)} is a torch DDP hook: it talks on the process group in "
                "its state (None: the default group), not on this model's GroupHandle "
                "(such as cohort.group), which moves to a new group when the membership "
                "changes. Use a potluck hook, which talks on bucket.group: "
                "potluck.allreduce_mean (the default) or potluck.weighted_mean"
            )
        self.reducer.register_comm_hook(state, hook)

    # ------------------------------------------------- torch DDP's attributes, true here

    @property
    def process_group(self) -> Group | None:
        """The torch process group given (or the default one); a cohort's ``GroupHandle``
        when the model talks on a cohort."""
        return self._process_group if self._process_group is not None else self._group

    @property
    def find_unused_parameters(self) -> bool:
        return True  # unused parameters are always handled, without a flag

    @property
    def static_graph(self) -> bool:
        return False  # nothing assumes the same graph every iteration

    @property
    def gradient_as_bucket_view(self) -> bool:
        return True  # .grad is always a view into its bucket

    @property
    def bucket_bytes_cap(self) -> int:
        return self._bucket_bytes_cap

    # ------------------------------------------------------------ torch's Join protocol

    def join_hook(self, **kwargs: Any) -> DataParallelJoinHook:
        self._torch_group("torch.distributed.algorithms.Join")  # refuses before Join starts
        return DataParallelJoinHook(self, **kwargs)

    @property
    def join_device(self) -> torch.device:
        return self._device

    @property
    def join_process_group(self) -> Any:
        return self._torch_group("torch.distributed.algorithms.Join")

    def _torch_group(self, what: str) -> Group:
        if self._process_group is not None:
            return self._process_group
        if self._group is not None:
            raise ConfigError(
                f"{what} needs a torch.distributed process group, and this model talks on "
                "a potluck GroupHandle (such as cohort.group), whose group changes with "
                "the membership. On a cohort, potluck.prepare's loader gives every rank its "
                "share of every global batch, so inputs are never uneven: drop the Join "
                "context; otherwise pass the torch process group itself as group="
            )
        raise ConfigError(
            f"{what} needs an initialized process group: call "
            "torch.distributed.init_process_group before wrapping the model"
        )

    # --------------------------------------------------------------------- training

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next synchronized backward averages them.

        The same switch as ``model.require_backward_grad_sync = False``; as in torch DDP,
        the forward decides: a forward run inside the context keeps its backward local.
        """
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def sync_now(self) -> None:
        """Average the gradients accumulated under ``no_sync()`` now, as the end of a
        synchronized backward would (``potluck.fit_backward`` does this after a part
        taken in micro-batches that might run out of memory). Every rank must call it
        at the same point; it does nothing with one rank, under a sync strategy, or
        inside ``no_sync()`` (as a backward there would not sync)."""
        if self.world_size > 1 and self._sync_gradients and self.require_backward_grad_sync:
            self._refuse_under_join("sync_now()")
            self.reducer.reduce_now()

    @property
    def under_join(self) -> bool:
        """Inside torch's ``Join`` context: every forward is then a collective vote."""
        return bool(self._join_config.enable)

    def start_accumulation(self) -> None:
        """A step's gradient passes begin (``potluck.fit_backward``): from here on,
        ``restart_accumulation`` refuses once one of them issued a collective."""
        if self.world_size > 1:
            self.reducer.start_window()

    def restart_accumulation(self) -> bool:
        """Forget the step's gradient passes so far (they ran out of memory), so that it
        can be taken again in smaller micro-batches: True, or False if a collective of
        the pass was already issued (its peers expect the rest: it cannot be taken
        back). The caller resets ``.grad``."""
        if self.world_size == 1:
            return True
        self._refuse_under_join("restart_accumulation()")
        return self.reducer.restart_window()

    def _refuse_under_join(self, what: str) -> None:
        if self.under_join:
            raise ConfigError(f"{what} under torch's Join: there every forward is a "
                              "collective vote, so a pass cannot be retried or synced "
                              "apart; use potluck.accumulate there")

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        grad_enabled = torch.is_grad_enabled()
        active = grad_enabled and self.world_size > 1
        timed = grad_enabled and self._clock is not None
        if self._watch is not None and self._watch_queued:
            self._watch_queued = False  # the last backward raised before its step ended
            self._tell_watch(self._watch.abandoned)
        if self._clock is not None and grad_enabled:
            self._clock.forward_started()
            self._clock_queued = False  # a backward that raised never ran its callback
        # Under a watch, the backward of this forward ends a step if it averages.
        ends_step = (self._watch is not None and grad_enabled
                     and self.require_backward_grad_sync and self._sync_gradients)
        if active:
            sync, buffer_src = self.require_backward_grad_sync and self._sync_gradients, 0
            if self._join_config.enable:
                buffer_src = self._notify_join(sync)
            self.reducer.prepare_for_forward(sync=sync, buffer_src=buffer_src)
        if self.device_ids:
            inputs, kwargs = _to_device((inputs, kwargs), self._device)
        output = self.module(*inputs, **kwargs)
        synced = active and self.reducer.require_sync
        if synced or timed:
            for tensor in _tensors_requiring_grad(output):
                tensor.register_hook(  # type: ignore[no-untyped-call]
                    lambda grad: self._on_output_grad(synced, ends_step))
        return output

    def _on_output_grad(self, synced: bool, ends_step: bool = False) -> None:
        """Backward reached the output. The clock's callback is queued before the
        reducer's, so it runs when the local work is done, before the wait for peers;
        a watch's after it, so it runs once the collectives settled."""
        engine = torch.autograd.Variable._execution_engine
        if self._clock is not None and not self._clock_queued:
            self._clock_queued = True
            engine.queue_callback(self._backward_done)
        if synced:
            self.reducer.on_backward_start()
        if ends_step and not self._watch_queued:
            self._watch_queued = True
            engine.queue_callback(self._step_ended)

    def _backward_done(self) -> None:
        self._clock_queued = False
        if self._clock is not None:
            self._clock.backward_done(self.reducer.blocked_in_pass)

    def _step_ended(self) -> None:
        """A backward that averages ran to its end (its collectives settled, or failed
        under ``on_failure="abandon"``): the end of a step of a plain loop."""
        self._watch_queued = False
        if self._watch is not None:
            self._tell_watch(self._watch.abandoned if self.step_failed
                             else self._watch.committed)

    def _tell_watch(self, call: Callable[[], object]) -> None:
        """Seeing the run must never stop it: a watch that fails is dropped."""
        try:
            call()
        except Exception:
            log.warning("the step watch failed; this model's steps are no longer timed",
                        exc_info=True)
            self._clock = self._watch = None  # (the watch was the clock)

    def _notify_join(self, sync: bool) -> int:
        """Under torch's Join: say this rank still trains, and whether it synchronizes
        (joined ranks mirror it); returns the rank whose buffers are broadcast."""
        work = Join.notify_join_context(self)
        if work is not None:
            work.wait()
        assert self._group is not None  # active: world size > 1
        _, buffer_src = iteration_vote(self._group, self.rank, sync, self._device)
        return buffer_src


_COMPAT_ARGS = {
    "output_device", "dim", "find_unused_parameters", "check_reduction",
    "gradient_as_bucket_view", "static_graph", "delay_all_reduce_named_params",
    "param_to_hook_all_reduce", "mixed_precision", "device_mesh",
}


def _implicit_group() -> Group | None:
    """What ``group=None`` means: torch's default group, else the handle of the cohort
    ``potluck.init()`` returned in this process, else none (one process). A worker that a
    launcher started among several (``WORLD_SIZE`` > 1) with neither would train its own
    model, unseen: refused, as torch DDP refuses it."""
    found = default_group()
    if found is not None:
        return found
    cohort = current()
    if cohort is not None:
        return cohort.group
    workers = launched_world_size()
    if workers > 1:
        raise ConfigError(
            f"DataParallel has no process group, but WORLD_SIZE={workers}: each of the "
            f"{workers} workers would train its own model; call "
            "torch.distributed.init_process_group(...) before wrapping the model, or "
            "`cohort = potluck.init()` and pass group=cohort.group")
    return None


def _check_compat_kwargs(kwargs: dict[str, Any]) -> None:
    unknown = sorted(set(kwargs) - _COMPAT_ARGS)
    if unknown:
        raise ConfigError(
            f"DataParallel got unexpected argument(s) {unknown}; it takes group=, "
            "bucket_cap_mb=, first_bucket_cap_mb=, broadcast_buffers=, comm_hook=, "
            "comm_state=, check_model=, init_sync=, on_failure=, sync_gradients= and torch DDP's "
            f"{sorted(_COMPAT_ARGS)}"
        )
    if kwargs.get("mixed_precision") is not None or kwargs.get("device_mesh") is not None:
        raise ConfigError(
            "DataParallel does not support torch DDP's mixed_precision= or device_mesh=; "
            "use torch.autocast around the forward instead"
        )


def _module_device(module: nn.Module) -> torch.device:
    for tensor in list(module.parameters()) + list(module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _tensors_requiring_grad(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors_requiring_grad(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors_requiring_grad(item)]
    return []


def _to_device(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
