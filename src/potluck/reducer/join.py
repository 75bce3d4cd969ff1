"""torch's ``Join`` for ``potluck.DataParallel``: uneven inputs, as in torch DDP.

Inside ``with Join([model]):`` a rank that runs out of inputs leaves its loop; the
context manager then calls ``main_hook`` once for every iteration that other ranks still
run, and there this rank mirrors that iteration's collectives with zero gradients
(``Reducer.shadow_pass``), so the others neither hang nor count it. When every rank is
out, ``post_hook`` gives every rank the model of the last rank to leave.

Each forward of a rank still training first tells the joined ranks (``iteration_vote``)
whether this iteration's backward synchronizes and whose buffers to broadcast after it:
the highest rank still training, since rank 0 may have left with stale ones. Gradients
are divided by the full world size (torch's ``divide_by_initial_world_size=True``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.algorithms.join import JoinHook

from potluck.collectives import allreduce_max, broadcast_coalesced
from potluck.errors import ConfigError
from potluck.group import GroupHandle

if TYPE_CHECKING:
    from potluck.reducer.data_parallel import DataParallel


def iteration_vote(group: GroupHandle, rank: int | None, sync: bool,
                   device: torch.device) -> tuple[bool, int]:
    """One all-reduce per iteration under ``Join``: does any rank synchronize, and which
    is the highest rank still training. A joined rank passes ``rank=None``."""
    vote = torch.tensor([int(sync and rank is not None), -1 if rank is None else rank],
                        dtype=torch.int64, device=device)
    allreduce_max(vote, group, "the Join iteration vote")
    return bool(vote[0].item()), int(vote[1].item())


class DataParallelJoinHook(JoinHook):
    """What a joined rank does while others train, and once all have joined."""

    def __init__(self, model: DataParallel, **kwargs: Any) -> None:
        if not kwargs.get("divide_by_initial_world_size", True):
            raise ConfigError(
                "Join(..., divide_by_initial_world_size=False) is not supported by "
                "potluck.DataParallel: gradients are always divided by the full world "
                "size; to weigh ranks by the samples they hold, use comm_hook="
                "potluck.weighted_mean with comm_state=local_samples / global_samples"
            )
        unknown = sorted(set(kwargs) - {"divide_by_initial_world_size"})
        if unknown:
            raise ConfigError(
                f"Join passed {unknown} to potluck.DataParallel's join hook; it takes only "
                "divide_by_initial_world_size=True"
            )
        self._model = model

    def main_hook(self) -> None:
        model = self._model
        group = model.group
        assert group is not None  # join_process_group refused a model without one
        sync, buffer_src = iteration_vote(group, None, False, model.join_device)
        if sync:
            model.reducer.shadow_pass(buffer_src)

    def post_hook(self, is_last_joiner: bool) -> None:
        model = self._model
        group = model.group
        assert group is not None
        candidate = torch.tensor([model.rank if is_last_joiner else -1], dtype=torch.int64,
                                 device=model.join_device)
        src = int(allreduce_max(candidate, group, "the Join final-model vote").item())
        state = [p.detach() for p in model.module.parameters()]
        if model.broadcast_buffers:
            state += list(model.module.buffers())
        if state:
            with torch.no_grad():
                broadcast_coalesced(state, group, src=src)
