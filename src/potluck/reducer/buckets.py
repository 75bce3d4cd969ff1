"""Bucket assignment: which gradients travel together in one flat all-reduce.

Pure function of sizes, keys and an expected ready order; no tensors, no process group.
A bucket holds tensors of one key (device and dtype) only; it closes once it reaches
its cap, so a bucket exceeds the cap by at most one tensor and a tensor larger than the
cap travels alone. The first bucket of every key has a smaller cap, so that the first
all-reduce starts early in the backward pass. Buckets are returned in the order they
are expected to complete (by the ready position of their last tensor); the reducer
launches them strictly in that order on every rank.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from potluck.errors import ConfigError


def assign_buckets(
    sizes: Sequence[int],
    keys: Sequence[Hashable],
    order: Sequence[int],
    cap_bytes: int,
    first_cap_bytes: int | None = None,
) -> list[list[int]]:
    """Group tensor indices into buckets.

    sizes[i] is tensor i's size in bytes, keys[i] its grouping key (tensors of different
    keys never share a bucket), and ``order`` the indices in the order their gradients
    are expected to become ready. Returns a list of buckets, each a list of indices in
    ready order; every index of ``order`` appears exactly once.
    """
    if len(sizes) != len(keys):
        raise ConfigError(
            f"sizes has {len(sizes)} entries but keys has {len(keys)}; give one key per tensor"
        )
    if sorted(order) != list(range(len(sizes))):
        raise ConfigError(
            f"order must be a permutation of 0..{len(sizes) - 1}, got {list(order)[:8]}..."
        )
    if cap_bytes <= 0:
        raise ConfigError(f"bucket cap must be positive, got {cap_bytes} bytes")
    first_cap = cap_bytes if first_cap_bytes is None else max(1, first_cap_bytes)

    position = {index: pos for pos, index in enumerate(order)}
    open_buckets: dict[Hashable, tuple[list[int], int]] = {}
    closed_per_key: dict[Hashable, int] = {}
    buckets: list[list[int]] = []
    for index in order:
        key = keys[index]
        members, filled = open_buckets.get(key, ([], 0))
        members.append(index)
        filled += sizes[index]
        cap = first_cap if closed_per_key.get(key, 0) == 0 else cap_bytes
        if filled >= cap:
            buckets.append(members)
            closed_per_key[key] = closed_per_key.get(key, 0) + 1
            open_buckets.pop(key, None)
        else:
            open_buckets[key] = (members, filled)
    buckets.extend(members for members, _ in open_buckets.values())
    buckets.sort(key=lambda members: position[members[-1]])
    return buckets
