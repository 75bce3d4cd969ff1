"""A bitwise fingerprint of a replica's parameters (honest replicas are bitwise equal).

Each tensor's bit patterns are read as integers (8-byte values as two 32-bit words) and
summed in 64 bits (wrapping), and the sums are folded in order into 63 bits: any single
flipped bit changes a sum by at most 2^31, so it changes the fingerprint (read whole, a
float64's sign bit would change its sum by 2^63, which the fold drops). One pass over
the parameters and one host sync per call.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}  # (8: two words)
_MASK = (1 << 63) - 1  # non-negative: below it, wire.py marks "no majority"


def fingerprint(tensors: Sequence[torch.Tensor]) -> int:
    if not tensors:
        return 0
    sums = torch.stack([word_sum(t) for t in tensors]).tolist()
    folded = 0
    for value in sums:
        folded = (folded * 1_000_003 + int(value)) & _MASK
    return folded


def keyed_digest(tensors: Sequence[torch.Tensor], key: int) -> int:
    """A 64-bit digest of the tensors' bit patterns, in order, keyed by ``key`` (never
    0, which means "none"): the dot product, wrapping in 64 bits, of the values' bits,
    read as 32-bit words (two per float64; 16-bit values as they are), with random
    64-bit words drawn from a generator seeded with the key. For a given difference
    between two runs of values, the dot product with random words vanishes modulo 2^64
    with a chance of at most about 2^-32 (the words are at most 2^32 apart: a flipped
    sign bit is 2^31), so whoever chose the values before the key existed cannot make
    two different runs digest alike but by that chance. Two passes over the values and
    one draw of the words per key and length, not a cryptographic hash."""
    if not tensors:
        return 1
    bits = torch.cat([bit_words(t).to(torch.int64) for t in tensors])
    if bits.numel() == 0:
        return 1
    table = _table(bits.numel(), key, bits.device)
    if bits.device.type == "cpu":  # numpy's int64 product and sum: several times torch's
        total = int((bits.numpy() * table.numpy()).sum())
    else:
        total = int((bits * table).sum())
    total &= 0xFFFF_FFFF_FFFF_FFFF
    return (total - (1 << 64) if total >> 63 else total) or 1


def word_sum(tensor: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The sum, in 64 bits (wrapping), of the tensor's ``bit_words`` (of each row of a
    2-d tensor with ``dim=1``). On the CPU widened first: ``sum(dtype=torch.int64)`` of
    32-bit words is several times slower there than a widened copy's sum."""
    words = bit_words(tensor)
    if dim is not None:
        words = words.view(tensor.shape[0], -1)
    if words.device.type == "cpu":  # (not on an accelerator: its memory)
        words = words.to(torch.int64)
    return words.sum(dtype=torch.int64) if dim is None else words.sum(dim, dtype=torch.int64)


def bit_words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, flat, as integers of at most 32 bits (8-byte values as two
    32-bit words): a single flipped bit changes one by at most 2^31, so a sum in 64 bits
    sees it, and a product with a 64-bit word never loses a high bit."""
    flat = tensor.detach().contiguous().view(-1)
    return flat.view(_AS_INT[flat.element_size()])


@functools.lru_cache(maxsize=2)
def _table(length: int, key: int, device: torch.device) -> torch.Tensor:
    """``length`` random 64-bit words from the key, the same on every rank of a cohort
    (all on one device type), kept for the step's other owners, whose digests use the
    same key and length. On the CPU numpy's PCG64 stream (numpy keeps its bits the same
    across versions and machines; twice as fast as ``torch.randint``); on an
    accelerator drawn there (no host-side draw and copy of a gradient's worth)."""
    seed = key & 0xFFFF_FFFF_FFFF_FFFF
    if device.type == "cpu":
        return torch.from_numpy(np.random.PCG64(seed).random_raw(length).view(np.int64))
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-(1 << 63), (1 << 63) - 1, (length,), generator=generator,
                         dtype=torch.int64, device=device)
