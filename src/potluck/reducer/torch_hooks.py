"""torch DDP's communication hooks on potluck buckets.

torch's hooks (``default_hooks.allreduce_hook``, ``fp16_compress_hook``,
``bf16_compress_hook``, ``powerSGD_hook.powerSGD_hook`` ...) are written against
``torch.distributed.GradBucket``: they call ``bucket.buffer()``, ``bucket.index()``,
``bucket.gradients()`` and so on, talk on the process group their state names (None: the
default group) and divide by its size themselves. ``GradBucketView`` offers exactly that
interface over one potluck ``Bucket``; ``is_torch_hook`` tells the two hook styles apart
when a hook is registered.

``CALL_TIME_HOOKS`` issue every collective when they are called. Other torch hooks
(PowerSGD, the quantization hooks) issue further collectives from their future's
callbacks, which on Gloo run on the backend's thread whenever the previous collective
completes: with two buckets in flight, ranks could issue them in different orders. The
reducer therefore gives such a hook one bucket at a time (``chains_collectives``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from potluck.errors import ConfigError
from potluck.reducer.hooks import Bucket

CALL_TIME_HOOKS: frozenset[Any] = frozenset({
    default_hooks.allreduce_hook,
    default_hooks.fp16_compress_hook,
    default_hooks.bf16_compress_hook,
})


class GradBucketView:
    """What ``torch.distributed.GradBucket`` offers a hook, over one potluck bucket.

    ``gradients()`` are views into the bucket's flat buffer, so a hook that writes into
    them (PowerSGD) writes the bucket. ``set_buffer`` changes what ``buffer()`` returns
    (the fp16/bf16 wrappers hand the inner hook a cast copy), as in torch.
    """

    def __init__(self, bucket: Bucket, bucket_count: int) -> None:
        self._bucket = bucket
        self._count = bucket_count
        self._buffer = bucket.buffer

    def index(self) -> int:
        return self._bucket.index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for param in self._bucket.parameters:
            views.append(self._bucket.buffer[offset : offset + param.numel()].view(param.shape))
            offset += param.numel()
        return views

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self._bucket.parameters)

    def is_last(self) -> bool:
        """The last bucket reduced in a pass (torch's meaning: the first layers)."""
        return self._bucket.index == self._count - 1


def is_torch_hook(hook: Any) -> bool:
    """A hook written for torch DDP: defined in torch, or its bucket annotated GradBucket.

    Any other hook is a potluck hook and receives a ``potluck.reducer.Bucket``.
    """
    target = hook
    while isinstance(target, functools.partial):
        target = target.func
    if str(getattr(target, "__module__", "")).startswith("torch."):
        return True
    try:
        parameters = list(inspect.signature(hook).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: treat as potluck's
        return False
    if len(parameters) < 2:
        return False
    annotation = parameters[1].annotation
    return "GradBucket" in str(annotation)  # the class, or "dist.GradBucket" as a string


def chains_collectives(hook: Any) -> bool:
    """Whether the reducer must give ``hook`` one bucket at a time (see the module doc)."""
    return is_torch_hook(hook) and not any(hook is known for known in CALL_TIME_HOOKS)


def check_hook(hook: Any) -> None:
    """Refuse at registration what cannot be a hook ``hook(state, bucket) -> Future``."""
    if not callable(hook):
        raise ConfigError(
            f"comm hook {hook!r} is not callable; a communication hook is a function "
            "hook(state, bucket) -> torch.futures.Future, e.g. potluck.weighted_mean or "
            "torch's default_hooks.fp16_compress_hook"
        )
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise ConfigError(
            f"comm hook {hook_name(hook)} has the signature {signature}; a communication hook "
            "takes two arguments, hook(state, bucket), and returns a torch.futures.Future"
        ) from None


def call_hook(hook: Any, state: Any, bucket: Bucket, bucket_count: int,
              torch_style: bool) -> torch.futures.Future[Any]:
    """``hook(state, bucket)`` with the bucket in the hook's style."""
    if torch_style:
        future: torch.futures.Future[Any] = hook(state, GradBucketView(bucket, bucket_count))
        return future
    try:
        future = hook(state, bucket)
    except TypeError as exc:
        if "object is not callable" not in str(exc):
            raise
        raise ConfigError(
            f"the communication hook {hook_name(hook)} failed with TypeError: {exc}. It was "
            "given a potluck Bucket, whose buffer, index and parameters are attributes; a "
            "hook written for torch DDP calls bucket.buffer() and must say so: annotate "
            "its bucket argument as torch.distributed.GradBucket"
        ) from exc
    return future


def hook_name(hook: Any) -> str:
    return str(getattr(hook, "__qualname__", None) or type(hook).__qualname__)
