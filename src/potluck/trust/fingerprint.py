"""A bitwise fingerprint of a replica's parameters (honest replicas are bitwise equal).

Each tensor's bit patterns are read as integers and summed in 64 bits (wrapping), and
the sums are folded in order: any single flipped bit changes the fingerprint. One pass
over the parameters and one host sync per call.
"""

from __future__ import annotations

import functools
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


def keyed_digest(tensors: Sequence[torch.Tensor], key: int) -> int:
    """A 64-bit digest of the tensors' bit patterns, in order, keyed by ``key`` (never
    0, which means "none"): the dot product, wrapping in 64 bits, of the bits with a
    table of random words (fixed, one per length) rotated by the key. Whoever chose
    the values without knowing the key cannot make two different runs of values digest
    alike but by chance: a difference must be orthogonal to every rotation of the
    table to pass for all keys, and a random table's rotations span everything, so a
    difference passes for few keys out of ``length`` (about 2^-32 of them for a flip
    of one sign bit). Three passes over the values, not a cryptographic hash."""
    if not tensors:
        return 1
    bits = torch.cat([_bits(t) for t in tensors])
    n = bits.numel()
    if n == 0:
        return 1
    table = _table(n, bits.device)
    turn = key % n
    total = (int((bits[:n - turn] * table[turn:]).sum())
             + int((bits[n - turn:] * table[:turn]).sum())) & 0xFFFF_FFFF_FFFF_FFFF
    return (total - (1 << 64) if total >> 63 else total) or 1


@functools.lru_cache(maxsize=8)
def _table(length: int, device: torch.device) -> torch.Tensor:
    """``length`` random 64-bit words, the same on every rank (a fixed seed: they need
    not be secret, only the key that rotates them)."""
    generator = torch.Generator().manual_seed(0x5EED_D16E57)
    low = torch.randint(0, 1 << 32, (length,), generator=generator, dtype=torch.int64)
    high = torch.randint(0, 1 << 32, (length,), generator=generator, dtype=torch.int64)
    return ((high << 32) | low).to(device)
