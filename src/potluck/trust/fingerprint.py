"""A bitwise fingerprint of a replica's parameters (honest replicas are bitwise equal).

Each tensor's bit patterns are read as integers and summed in 64 bits (wrapping), and
the sums are folded in order: any single flipped bit changes the fingerprint. One pass
over the parameters and one host sync per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MASK = (1 << 63) - 1  # non-negative: below it, wire.py marks "no majority"


def fingerprint(tensors: Sequence[torch.Tensor]) -> int:
    if not tensors:
        return 0
    sums = torch.stack([_bits(t).sum() for t in tensors]).tolist()
    folded = 0
    for value in sums:
        folded = (folded * 1_000_003 + int(value)) & _MASK
    return folded


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().contiguous().view(-1)
    return flat.view(_AS_INT[flat.element_size()]).to(torch.int64)
