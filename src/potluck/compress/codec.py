"""What a codec is: how a flat float tensor travels on the wire, and back.

A codec is one small class (hivemind.compression is the model) with pure ``encode`` and
``decode``; how the encoded payloads are combined across ranks is ``exchange.py``'s job,
told by two flags:

- ``summable``: payloads add up under an all-reduce (a cast to fp16 or bf16), so one
  all-reduce of the payload is the sum;
- ``dense``: a payload encodes a contiguous slice on its own, so a slice's owner can sum
  every rank's payload of its slice and send the sum back encoded (a reduce-scatter,
  then an all-gather: the bytes of a ring all-reduce); a sparse codec (top-k) is
  all-gathered instead, every rank decoding every payload.

Every codec here is CPU-first (no GPU-only kernels) and deterministic: the same input
gives the same payload on every rank.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from potluck.errors import ConfigError


@runtime_checkable
class Codec(Protocol):
    """Encodes a flat floating-point tensor; ``decode`` gives a tensor of ``numel``
    elements of ``dtype`` (the input's shape and dtype)."""

    name: str
    summable: bool
    dense: bool

    def encode(self, flat: torch.Tensor) -> torch.Tensor: ...

    def decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor: ...

    def nbytes(self, numel: int) -> int:
        """Bytes of the payload for ``numel`` elements (what one rank puts on the wire
        per copy it sends)."""
        ...


@runtime_checkable
class Bounded(Protocol):
    """A codec that bounds how far encoding moves each value (round to nearest), and can
    say so from the decoded values alone: a receiver that never saw the input bounds
    the sender's rounding (trust's spot checks through a codec). Top-k bounds nothing:
    a value it drops may be any size."""

    def rounding(self, decoded: torch.Tensor) -> torch.Tensor:
        """Per value of ``decoded`` (one payload's values, decoded), the most its
        encoding can have moved it: ``|input - decoded| <= rounding(decoded)``."""
        ...


class Identity:
    """No compression: the tensor itself (the reference every codec is measured by)."""

    name = "none"
    summable = True
    dense = True

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        return flat

    def decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return payload.to(dtype)

    def nbytes(self, numel: int) -> int:
        return numel * 4  # counted as float32, the usual gradient dtype

    def rounding(self, decoded: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(decoded)


def check_flat(flat: torch.Tensor, codec: str) -> None:
    """Refuse what no codec can encode (the bad value, the rule)."""
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or not flat.is_floating_point():
        what = (f"a {flat.dim()}-d {flat.dtype} tensor" if isinstance(flat, torch.Tensor)
                else type(flat).__name__)
        raise ConfigError(f"codec {codec} encodes a flat (1-d) floating-point tensor, got "
                          f"{what}; flatten it first (tensor.reshape(-1))")


def as_bytes(*parts: torch.Tensor) -> torch.Tensor:
    """One uint8 payload from contiguous tensors (each viewed as its bytes)."""
    return torch.cat([p.contiguous().reshape(-1).view(torch.uint8) for p in parts])


def aligned(payload: torch.Tensor) -> torch.Tensor:
    """``payload`` where its bytes can be viewed as 4-byte values (a slice of a gathered
    buffer may start anywhere)."""
    return payload if payload.storage_offset() % 4 == 0 else payload.clone()
