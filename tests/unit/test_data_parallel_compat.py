"""What torch DDP code touches on potluck.DataParallel, without a process group.

torch's GradBucket interface over a potluck bucket, telling hook styles apart, DDP's
attributes, the no_sync switch, unwrapping, and Join refused where it cannot work.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms import Join
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from potluck import DataParallel, GroupHandle, weighted_mean
from potluck.errors import ConfigError
from potluck.metrics.sync_timer import SyncTimer
from potluck.reducer.hooks import Bucket
from potluck.reducer.torch_hooks import GradBucketView, check_hook, is_torch_hook


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


def test_grad_bucket_view_offers_what_torch_hooks_call() -> None:
    net = _net()
    params = tuple(reversed(list(net.parameters())))  # buckets hold the last layers first
    buffer = torch.arange(float(sum(p.numel() for p in params)))
    view = GradBucketView(Bucket(1, buffer, params, GroupHandle(None)), bucket_count=2)
    assert view.index() == 1 and view.is_last()
    assert view.buffer() is buffer and view.parameters() == list(params)
    grads = view.gradients()
    assert [g.shape for g in grads] == [p.shape for p in params]
    grads[1].fill_(-1.0)  # a view: PowerSGD writes its result through these
    assert buffer[1:3].tolist() == [-1.0, -1.0]
    half = buffer.half()
    view.set_buffer(half)  # what the fp16/bf16 wrappers do
    assert view.buffer() is half and view.gradients()[0].dtype == torch.float32
    assert not GradBucketView(Bucket(0, buffer, params, GroupHandle(None)), 2).is_last()


def _annotated(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)


def _potluck_style(state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
    return weighted_mean(state, bucket)


def test_torch_hooks_are_told_from_potluck_hooks() -> None:
    for hook in (default_hooks.fp16_compress_hook, powerSGD_hook, _annotated,
                 default_hooks.fp16_compress_wrapper(powerSGD_hook),
                 functools.partial(default_hooks.allreduce_hook)):
        assert is_torch_hook(hook), hook
    for hook in (weighted_mean, _potluck_style, SyncTimer(), lambda state, bucket: None):
        assert not is_torch_hook(hook), hook


def test_a_hook_that_cannot_be_one_is_refused_at_registration() -> None:
    model = DataParallel(_net())
    with pytest.raises(ConfigError, match="not callable"):
        model.register_comm_hook(None, "fp16")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"signature \(bucket\).*takes two arguments"):
        check_hook(lambda bucket: bucket)


class _TorchStyleCarrier:
    """A hook for torch's GradBucket that claims to carry the bitmap: it has no
    ``Bucket.produced`` to carry it in."""

    carries_bitmap = True

    def __call__(self, state: Any, bucket: dist.GradBucket) -> Any:
        return default_hooks.allreduce_hook(state, bucket)


def test_a_torch_style_hook_cannot_carry_the_bitmap() -> None:
    model = DataParallel(_net())
    with pytest.raises(ConfigError, match=r"carries the unused-parameter bitmap.*GradBucket"):
        model.register_comm_hook(None, _TorchStyleCarrier())


def test_torch_ddp_attributes_say_what_holds_here() -> None:
    model = DataParallel(_net(), bucket_cap_mb=10, find_unused_parameters=False)
    assert model.find_unused_parameters is True  # always handled, whatever was passed
    assert model.static_graph is False
    assert model.gradient_as_bucket_view is True
    assert model.bucket_bytes_cap == 10 * 1024 * 1024
    assert model.process_group is None  # no process group initialized


def test_no_sync_is_the_require_backward_grad_sync_switch() -> None:
    model = DataParallel(_net())
    assert model.require_backward_grad_sync is True
    with model.no_sync():
        assert model.require_backward_grad_sync is False
        with model.no_sync():
            pass
        assert model.require_backward_grad_sync is False
    assert model.require_backward_grad_sync is True


def test_unwrapping_takes_model_module_as_for_torch_ddp() -> None:
    net = _net()
    model = DataParallel(net)
    assert not isinstance(model, TorchDDP)  # libraries that unwrap only DDP keep it whole
    unwrapped = model.module  # what to hand them instead (works for torch DDP too)
    assert unwrapped is net
    assert list(model.state_dict()) == [f"module.{k}" for k in net.state_dict()]
    fresh = _net()
    fresh.load_state_dict(unwrapped.state_dict())  # no "module." prefix to strip


class _OneRank:
    """A process group of one, enough to build a handle a cohort would hold."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def allreduce(self, *args: Any, **kwargs: Any) -> Any: ...

    def broadcast(self, *args: Any, **kwargs: Any) -> Any: ...

    def allgather(self, *args: Any, **kwargs: Any) -> Any: ...

    def barrier(self, *args: Any, **kwargs: Any) -> Any: ...


def test_a_torch_hook_on_a_group_handle_is_refused_at_registration() -> None:
    on_cohort = DataParallel(_net(), group=GroupHandle(_OneRank(), owned=False))
    with pytest.raises(ConfigError, match=r"fp16_compress_hook is a torch DDP hook.*weighted"):
        on_cohort.register_comm_hook(None, default_hooks.fp16_compress_hook)
    on_cohort.register_comm_hook(0.5, weighted_mean)  # potluck's talk on the handle


def test_join_is_refused_clearly_where_it_cannot_work() -> None:
    on_cohort = DataParallel(_net(), group=GroupHandle(_OneRank(), owned=False))
    with pytest.raises(ConfigError, match="cohort"):
        Join([on_cohort])
    with pytest.raises(ConfigError, match="init_process_group"):
        Join([DataParallel(_net())])
    assert not dist.is_initialized()
