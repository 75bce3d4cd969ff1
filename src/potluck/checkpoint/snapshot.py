"""Turn a training-state dict into plain data, and copy it off the device for async saves.

``resolve_state`` calls ``state_dict()`` on every value that has one (model, optimizer,
scheduler, GradScaler, DataCursor, DistributedRng), so a caller passes the objects
themselves. ``cpu_copy`` clones every tensor to CPU and deep-copies everything else, so
training can change the originals while a background thread writes the copy.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch


def resolve_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: obj.state_dict() if obj has one else obj}``."""
    resolved: dict[str, Any] = {}
    for name, value in state.items():
        getter = getattr(value, "state_dict", None)
        resolved[name] = getter() if callable(getter) else value
    return resolved


def cpu_copy(value: Any) -> Any:
    """A deep copy of ``value`` whose tensors are fresh CPU tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, OrderedDict):
        return OrderedDict((k, cpu_copy(v)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: cpu_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cpu_copy(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(cpu_copy(v) for v in value)
    return copy.deepcopy(value)
