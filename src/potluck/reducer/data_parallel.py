"""``potluck.DataParallel``: a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

Wraps a module so that ``loss.backward()`` returns with gradients averaged across the
process group. At construction every rank checks that all ranks hold the same model,
then takes rank 0's parameters and buffers. Buffers (BatchNorm statistics) are
broadcast from rank 0 at the end of every synchronized backward, so replicas hold the
same buffers between steps and every forward starts from rank 0's.

Works on the default process group, an explicit group object, or a cohort's
``GroupHandle`` (``cohort.group``), which it holds for life: when an elastic cohort moves
to a new generation, the handle follows and so does every step after. With one rank (or
no process group at all) nothing is communicated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from potluck.collectives import Group, broadcast_coalesced, default_group
from potluck.errors import ConfigError
from potluck.group import GroupHandle, as_handle
from potluck.reducer.consistency import verify_same_model
from potluck.reducer.hooks import Bucket, CommHook
from potluck.reducer.reducer import Reducer, ReducerConfig

_MB = 1024 * 1024


class DataParallel(nn.Module):
    """Data-parallel wrapper: one full replica per rank, gradients averaged in backward.

    Arguments that torch's DDP takes and potluck does not need (``find_unused_parameters``,
    ``gradient_as_bucket_view``, ``static_graph``, ``output_device``, ``dim``) are
    accepted so that code swaps the class unchanged: unused parameters are always
    handled, and gradients are always bucket views.
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
        comm_hook: CommHook | None = None,
        comm_state: Any = None,
        check_model: bool = True,
        init_sync: bool = True,
        on_failure: str = "raise",
        **torch_ddp_compat: Any,
    ) -> None:
        super().__init__()
        _check_compat_kwargs(torch_ddp_compat)
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
        if bucket_cap_mb <= 0 or first_bucket_cap_mb <= 0:
            raise ConfigError(
                f"bucket sizes must be positive, got bucket_cap_mb={bucket_cap_mb} and "
                f"first_bucket_cap_mb={first_bucket_cap_mb}; 25 and 1 are good defaults"
            )
        self.module = module
        self.device_ids = list(device_ids) if device_ids else None
        self.broadcast_buffers = broadcast_buffers
        explicit = group if group is not None else process_group
        self._group = as_handle(explicit if explicit is not None else default_group())

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
            if state:
                with torch.no_grad():
                    broadcast_coalesced(state, group, src=0)
        self.reducer = Reducer(
            [p for _, p in named],
            [n for n, _ in named],
            self._group,
            ReducerConfig(
                bucket_cap_bytes=max(1, int(bucket_cap_mb * _MB)),
                first_bucket_cap_bytes=max(1, int(first_bucket_cap_mb * _MB)),
                abandon_on_failure=on_failure == "abandon",
            ),
            buffers=buffers,
        )
        if comm_hook is not None:
            self.reducer.register_comm_hook(comm_state, comm_hook)

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

    def register_comm_hook(self, state: Any, hook: CommHook) -> None:
        """Reduce each bucket with ``hook(state, bucket) -> Future`` (see potluck.reducer)."""
        self.reducer.register_comm_hook(state, hook)

    # --------------------------------------------------------------------- training

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the next synchronized backward averages them."""
        previous = self.reducer.require_sync
        self.reducer.require_sync = False
        try:
            yield
        finally:
            self.reducer.require_sync = previous

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        active = torch.is_grad_enabled() and self.world_size > 1
        if active:
            self.reducer.prepare_for_forward()
        if self.device_ids:
            inputs, kwargs = _to_device((inputs, kwargs), self._device)
        output = self.module(*inputs, **kwargs)
        if active and self.reducer.require_sync:
            for tensor in _tensors_requiring_grad(output):
                tensor.register_hook(self._on_output_grad)  # type: ignore[no-untyped-call]
        return output

    def _on_output_grad(self, grad: torch.Tensor) -> None:
        self.reducer.on_backward_start()


_COMPAT_ARGS = {
    "output_device", "dim", "find_unused_parameters", "check_reduction",
    "gradient_as_bucket_view", "static_graph", "delay_all_reduce_named_params",
    "param_to_hook_all_reduce", "mixed_precision", "device_mesh",
}


def _check_compat_kwargs(kwargs: dict[str, Any]) -> None:
    unknown = sorted(set(kwargs) - _COMPAT_ARGS)
    if unknown:
        raise ConfigError(
            f"DataParallel got unexpected argument(s) {unknown}; it takes group=, "
            "bucket_cap_mb=, first_bucket_cap_mb=, broadcast_buffers=, comm_hook=, "
            "comm_state=, check_model=, init_sync=, on_failure= and torch DDP's "
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
