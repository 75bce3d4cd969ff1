"""Casts: fp16 and bf16 on the wire. Half the bytes of float32; payloads stay summable,
so one all-reduce in the narrow type is the sum (as torch's ``fp16_compress_hook``).
fp16 keeps 11 bits of mantissa but overflows past 65504 (fine for averaged gradients
and pseudo-gradients scaled before the sum); bf16 keeps float32's range with 8 bits."""

from __future__ import annotations

import torch

from potluck.compress.codec import check_flat


class Cast:
    """The tensor in ``dtype`` (torch.float16 or torch.bfloat16)."""

    summable = True
    dense = True

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            from potluck.errors import ConfigError
            raise ConfigError(f"Cast({dtype}) : a cast codec sends torch.float16 or "
                              "torch.bfloat16")
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        check_flat(flat, self.name)
        return flat.to(self.dtype)

    def decode(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return payload.to(dtype)

    def nbytes(self, numel: int) -> int:
        return numel * 2

    def rounding(self, decoded: torch.Tensor) -> torch.Tensor:
        """Half a unit in the last place: relative to the value (``2 ** -(bits + 1)`` of
        it, ``bits`` the mantissa's), and at least half the smallest subnormal."""
        info = torch.finfo(self.dtype)
        return decoded.float().abs() * info.eps / 2 * (1 + 1e-3) + info.smallest_normal * info.eps


def Fp16() -> Cast:
    return Cast(torch.float16)


def Bf16() -> Cast:
    return Cast(torch.bfloat16)
