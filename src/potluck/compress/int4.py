"""Blockwise int4: each block of ``block`` values is sent as 4-bit codes (two a byte) and
one float32 scale (its largest magnitude / 7), about 7.8x fewer bytes than float32 at
the default block of 256, half of int8's. Round to nearest: the error of one value is
at most half a step of its block (scale / 2, a fourteenth of the block's largest
magnitude), so it is meant with error feedback (``feedback.py``), which sends what was
lost in a later round. For pseudo-gradients synced every H steps that buys a smaller H
(more syncs) for the same bytes as int8."""

from __future__ import annotations

import torch

from potluck.compress.blockwise import blocks, checked_block, dequantize, half_step, quantize
from potluck.compress.codec import aligned, as_bytes, check_flat

LEVELS = 7  # symmetric: -7..7, so 0 is exact and the sign of a code is the value's
_OFFSET = 8  # a code c travels as the nibble c + 8 (1..15)


class Int4Blockwise:
    """4-bit codes, two a byte, one float32 scale per ``block`` values."""

    name = "int4"
    summable = False
    dense = True

    def __init__(self, block: int = 256) -> None:
        self.block = checked_block("Int4Blockwise", block)

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        check_flat(flat, self.name)
        scale, codes = quantize(flat, self.block, LEVELS)
        # (a NaN's code is undefined: the mask keeps it inside its own nibble)
        nibbles = (codes + _OFFSET).to(torch.uint8) & 0x0F
        if codes.numel() % 2:
            nibbles = torch.cat([nibbles, nibbles.new_full((1,), _OFFSET)])
        pairs = nibbles.view(-1, 2)
        packed = pairs[:, 0] | (pairs[:, 1] << 4)
        return as_bytes(scale, packed)  # scales first: 4-byte aligned

    def decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        payload = aligned(payload)
        count = blocks(numel, self.block)
        scale = payload[:4 * count].view(torch.float32)
        packed = payload[4 * count:4 * count + (numel + 1) // 2]
        nibbles = torch.stack([packed & 0x0F, packed >> 4], dim=1).reshape(-1)[:numel]
        return dequantize(nibbles.to(torch.float32) - _OFFSET, scale, self.block, dtype)

    def nbytes(self, numel: int) -> int:
        return (numel + 1) // 2 + 4 * blocks(numel, self.block)

    def rounding(self, decoded: torch.Tensor) -> torch.Tensor:
        return half_step(decoded, self.block, LEVELS)
