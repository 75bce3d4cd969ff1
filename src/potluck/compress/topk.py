"""Top-k: only the ``fraction`` of values largest in magnitude travel, as int32 indices
and float32 values (8 bytes each: at 1% about 50x fewer bytes than float32). Sparse
payloads do not sum under an all-reduce and a slice's top-k is not the tensor's, so
top-k is all-gathered and every rank decodes every payload (``exchange.py``). Without
error feedback the small values would never be sent; with it they accumulate until
they are large enough to be picked (``feedback.py``)."""

from __future__ import annotations

import math

import torch

from potluck.compress.codec import aligned, as_bytes, check_flat
from potluck.errors import ConfigError


class TopK:
    """The ``k = ceil(fraction * numel)`` largest-magnitude values and their indices."""

    name = "topk"
    summable = False
    dense = False

    def __init__(self, fraction: float = 0.01) -> None:
        if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ConfigError(f"TopK(fraction={fraction!r}): the fraction of values sent "
                              "is in (0, 1], e.g. 0.01 for the largest 1%")
        self.fraction = float(fraction)

    def k(self, numel: int) -> int:
        return max(1, math.ceil(self.fraction * numel)) if numel else 0

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        check_flat(flat, self.name)
        if flat.numel() >= 2**31:
            raise ConfigError(f"TopK encodes at most 2**31 - 1 values per tensor, got "
                              f"{flat.numel()}: send it in smaller buckets")
        k = self.k(flat.numel())
        # indices ascending: the payload is a function of the values alone
        index = torch.topk(flat.abs(), k, sorted=True).indices.sort().values
        values = flat[index].to(torch.float32)
        return as_bytes(index.to(torch.int32), values)

    def decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        payload = aligned(payload)
        k = self.k(numel)
        index = payload[:4 * k].view(torch.int32).to(torch.int64)
        values = payload[4 * k:8 * k].view(torch.float32)
        out = torch.zeros(numel, dtype=dtype, device=payload.device)
        out[index] = values.to(dtype)
        return out

    def nbytes(self, numel: int) -> int:
        return 8 * self.k(numel)
