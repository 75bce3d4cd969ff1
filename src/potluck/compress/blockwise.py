"""What the blockwise integer codecs share (``int8.py``, ``int4.py``): values cut into
blocks of ``block``, each with one float32 scale (its largest magnitude / ``levels``), and
rounded to the nearest of the symmetric codes ``-levels .. levels``."""

from __future__ import annotations

import math

import torch

from potluck.errors import ConfigError


def checked_block(codec: str, block: object) -> int:
    """``block`` if it is a positive int; else the error, naming ``codec``."""
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise ConfigError(f"{codec}(block={block!r}): a block is a positive number of "
                          "values sharing one scale, e.g. 256")
    return block


def blocks(numel: int, block: int) -> int:
    return math.ceil(numel / block)


def quantize(flat: torch.Tensor, block: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 scales, one a block; the ``numel`` codes as float32 integers)."""
    numel, count = flat.numel(), blocks(flat.numel(), block)
    padded = torch.zeros(count * block, dtype=torch.float32, device=flat.device)
    padded[:numel] = flat
    rows = padded.view(count, block)
    scale = rows.abs().amax(dim=1) / levels
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round(rows / divisor[:, None]).clamp_(-levels, levels)
    return scale, codes.reshape(-1)[:numel]


def dequantize(codes: torch.Tensor, scale: torch.Tensor, block: int,
               dtype: torch.dtype) -> torch.Tensor:
    """The values ``codes`` (float32 integers) stand for under their blocks' ``scale``."""
    per_value = scale.repeat_interleave(block)[:codes.numel()]
    return (codes * per_value).to(dtype)


def half_step(decoded: torch.Tensor, block: int, levels: int) -> torch.Tensor:
    """Per value, half its block's step: how far rounding to nearest can have moved it.
    Read from the decoded values: a block's largest magnitude is ``levels`` steps (its
    own code), so a payload whose scale claims more than its codes use gains nothing.
    A sliver over the half step covers the float rounding of the scale and of the
    product ``code * scale``."""
    numel, count = decoded.numel(), blocks(decoded.numel(), block)
    padded = torch.zeros(count * block, dtype=torch.float32, device=decoded.device)
    padded[:numel] = decoded.reshape(-1)
    step = padded.view(count, block).abs().amax(dim=1) / levels
    return (step * (0.5 + 1e-5)).repeat_interleave(block)[:numel].view_as(decoded)
