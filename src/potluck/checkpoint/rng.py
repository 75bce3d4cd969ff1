"""Capture and restore the random number generators: Python, NumPy, torch CPU and CUDA.

A captured state is a dict of tensors, ints and tuples, so it survives
``torch.load(weights_only=True)``. Per rank: ``DistributedRng`` gathers every rank's
state to every rank (rank 0 writes it with the rest of the checkpoint) over the current
potluck cohort's group (``potluck.init()``) or torch's default group, and, on load,
gives rank ``r`` the saved state of rank ``r``. A rank that did not exist when the
checkpoint was saved (the cohort grew) gets ``derive_rng`` of a seed hashed from the
saved rank 0 state and ``r``: deterministic, and distinct per rank.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from potluck.cohort.current import current
from potluck.collectives import allgather_object, default_group, group_rank_and_size
from potluck.errors import CheckpointError

RngState = dict[str, Any]


def _numpy_state(state: Any) -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = state
    return {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _cuda_states() -> list[torch.Tensor] | None:
    if not torch.cuda.is_available():
        return None
    return [state.clone() for state in torch.cuda.get_rng_state_all()]


def capture_rng() -> RngState:
    """This process's generator states (does not change them)."""
    return {"python": random.getstate(), "numpy": _numpy_state(np.random.get_state()),
            "torch": torch.get_rng_state(), "cuda": _cuda_states()}


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set this process's generators to ``state`` (from ``capture_rng``)."""
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise CheckpointError(
            f"RNG state lacks {sorted(missing)}: it must come from capture_rng()."
        )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        # Restore as many devices as both sides have; extra devices keep their state.
        for device, cuda_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


def derive_rng(seed: int) -> RngState:
    """Fresh generator states seeded with ``seed``, without touching the global ones."""
    cuda = None
    if torch.cuda.is_available():
        cuda = [torch.Generator(device=f"cuda:{d}").manual_seed(seed).get_state()
                for d in range(torch.cuda.device_count())]
    return {"python": random.Random(seed).getstate(),
            "numpy": _numpy_state(np.random.RandomState(seed % 2**32).get_state()),
            "torch": torch.Generator().manual_seed(seed).get_state(), "cuda": cuda}


def rng_for_rank(saved: Sequence[Mapping[str, Any]], rank: int) -> RngState:
    """Rank ``rank``'s saved state, or one derived for a rank the checkpoint lacks."""
    if not saved:
        raise CheckpointError("no RNG states were saved: save DistributedRng on every rank.")
    if rank < len(saved):
        return dict(saved[rank])
    base = bytes(saved[0]["torch"].numpy().tobytes())
    digest = hashlib.sha256(base + rank.to_bytes(8, "big")).digest()
    return derive_rng(int.from_bytes(digest[:8], "big") >> 1)


class DistributedRng:
    """Every rank's RNG states as one checkpoint entry (pass it to ``CheckpointManager``).

    ``state_dict()`` is a collective on ``group``: call the manager's ``save`` on every
    rank. Default: the current cohort's group and device (``potluck.init()``), looked up
    at each call, else torch's default group, else this process alone.
    """

    def __init__(self, group: Any = None, device: torch.device | None = None) -> None:
        self.group = group
        self.device = device  # where the gathered bytes travel: the group's (CUDA for NCCL)

    def state_dict(self) -> dict[str, Any]:
        group, device = self._group_and_device()
        _, world_size = group_rank_and_size(group)
        states = [capture_rng()]
        if world_size > 1 and group is not None:
            states = allgather_object(states[0], group, device)
        return {"world_size": world_size, "ranks": states}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        group, _ = self._group_and_device()
        rank, _ = group_rank_and_size(group)
        restore_rng(rng_for_rank(state_dict["ranks"], rank))

    def _group_and_device(self) -> tuple[Any, torch.device | None]:
        """The group to gather over (None: a single process) and its device."""
        if self.group is not None:
            return self.group, self.device
        cohort = current()
        if cohort is not None:
            return cohort.group, self.device or cohort.device
        return default_group(), self.device
