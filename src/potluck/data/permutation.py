"""The per-epoch sample order: a seeded permutation that depends on (seed, epoch) only.

World size never enters here, so N ranks together consume the same global stream as
one process does. ``mix`` turns (seed, epoch) into a well-spread 63-bit generator seed
(SplitMix64 finalizer), so neighbouring epochs or seeds do not get related streams.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def mix(seed: int, epoch: int) -> int:
    """A seed for ``torch.Generator.manual_seed`` derived from ``(seed, epoch)``."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (epoch & _MASK64)) >> 1


def epoch_permutation(dataset_len: int, seed: int, epoch: int) -> torch.Tensor:
    """The order in which epoch ``epoch`` visits the ``dataset_len`` samples (int64)."""
    generator = torch.Generator().manual_seed(mix(seed, epoch))
    return torch.randperm(dataset_len, generator=generator)
