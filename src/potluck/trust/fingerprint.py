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


def keyed_digest(tensors: Sequence[torch.Tensor], key: int) -> int:
    """A 64-bit digest of the tensors' bit patterns, in order, keyed by ``key`` (never
    0, which means "none"): each value's bits times a pseudo-random 64-bit word drawn
    from the key and its position, summed wrapping. Whoever chose the values without
    knowing the key cannot make two different runs of values digest alike but by
    chance (at most about 2^-32 for a difference in one sign bit, less otherwise); it
    costs a few elementwise passes, not a cryptographic hash of the bytes."""
    total, offset = 0, 0
    for tensor in tensors:
        bits = _bits(tensor)
        position = torch.arange(offset, offset + bits.numel(), dtype=torch.int64,
                                device=bits.device)
        total = (total + int((bits * _mix(position, key)).sum())) & 0xFFFF_FFFF_FFFF_FFFF
        offset += bits.numel()
    return (total - (1 << 64) if total >> 63 else total) or 1


def _mix(position: torch.Tensor, key: int) -> torch.Tensor:
    """A pseudo-random int64 per position (splitmix64's finaliser, wrapping)."""
    z = position + _signed(key * 0x9E3779B97F4A7C15)
    z = (z ^ _shift(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _shift(z, 27)) * _signed(0x94D049BB133111EB)
    return z ^ _shift(z, 31)


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 values (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _signed(value: int) -> int:
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >> 63 else value
