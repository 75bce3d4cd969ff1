"""``DataParallel``'s arguments checked before anything is built (pure).

What a wrong type or value would otherwise do far from its cause: a raw ``TypeError``
from a comparison, a bucket size of ``nan`` that cannot become an int, a truthy
``broadcast_buffers='no'`` that broadcasts, a ``device_ids`` that torch DDP refuses.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from potluck.errors import ConfigError


def check_module(module: Any) -> None:
    if not isinstance(module, nn.Module):
        raise ConfigError(f"DataParallel(module=...) takes a torch.nn.Module, got "
                          f"{type(module).__name__}: wrap the model itself")
    if not any(p.requires_grad for p in module.parameters()):
        raise ConfigError(f"DataParallel got a module ({type(module).__name__}) with no "
                          "parameter that requires a gradient: there is nothing to average; "
                          "set requires_grad=True on the parameters to train, or do not "
                          "wrap it (torch DDP refuses it too)")


def check_bucket_sizes(bucket_cap_mb: Any, first_bucket_cap_mb: Any) -> None:
    for name, value in (("bucket_cap_mb", bucket_cap_mb),
                        ("first_bucket_cap_mb", first_bucket_cap_mb)):
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(float(value)) or not float(value) > 0):
            raise ConfigError(f"{name}={value!r} must be a positive, finite number of "
                              "megabytes (a bucket's size); 25 and 1 (first) are good "
                              "defaults")


def check_flags(flags: Mapping[str, Any]) -> None:
    """Options that must be True or False (a string such as 'no' is truthy)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"DataParallel({name}={value!r}): pass True or False")


def check_device_ids(device_ids: Any, device: torch.device) -> None:
    """torch DDP's rule: none for a CPU module; for a module on one accelerator, that
    device (this process's one: potluck runs one device per process)."""
    if device_ids is None or (isinstance(device_ids, Sequence)
                              and not isinstance(device_ids, str) and len(device_ids) == 0):
        return
    if isinstance(device_ids, (str, torch.device)) or not isinstance(device_ids, Sequence):
        raise ConfigError(f"device_ids={device_ids!r} must be a list of one device, e.g. "
                          "device_ids=[local_rank], or None")
    if device.type == "cpu":
        raise ConfigError(f"device_ids={list(device_ids)!r} names an accelerator, but the "
                          "module's parameters are on the CPU: leave device_ids out on the "
                          "CPU, or move the module to its device first "
                          "(module.to(cohort.device))")
    given = [torch.device(device.type, d) if isinstance(d, int) and not isinstance(d, bool)
             else _device(d) for d in device_ids]
    # a device named without an index is the current one, as torch DDP takes it
    given = [torch.device(d.type, device.index) if d.index is None and d.type == device.type
             else d for d in given]
    if len(given) != 1 or given[0] != device:
        raise ConfigError(f"device_ids={list(device_ids)!r}: the module is on {device}; "
                          "potluck runs one device per process, so pass "
                          f"device_ids=[{device.index}] (that device) or leave it out")


def _device(value: Any) -> torch.device:
    try:
        return torch.device(value)
    except (TypeError, RuntimeError) as exc:
        raise ConfigError(f"device_ids entry {value!r} is not a device: pass ints "
                          "(device indices) or torch.device objects") from exc
