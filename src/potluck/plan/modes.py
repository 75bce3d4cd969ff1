"""The sync modes the planner compares (pure data).

- every step: the gradients are all-reduced each step (``rounds`` False), as they are
  or through a codec (``wire_fraction``: bytes on the wire per float32 byte);
- DiLoCo at H: a round of H global batches, local steps by speed, then one
  all-reduce of the pseudo-gradients;
- Streaming DiLoCo: the same round, the parameters synced in ``fragments`` parts,
  each overlapped with the next local steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError

# Bytes on the wire per float32 byte, per codec (potluck.compress; blocks of 256).
WIRE_FRACTION = {"none": 1.0, "fp16": 0.5, "bf16": 0.5,
                 "int8": (1 + 4 / 256) / 4, "int4": (0.5 + 4 / 256) / 4}


@dataclass(frozen=True)
class SyncMode:
    """One way to reconcile the replicas, as the planner prices it."""

    name: str
    rounds: bool = False
    inner_steps: int = 1
    codec: str = "none"
    fragments: int = 1
    adaptive: bool = True  # balanced shares (every step); local steps by speed (rounds)

    def __post_init__(self) -> None:
        if self.codec not in WIRE_FRACTION:
            raise ConfigError(f"sync mode {self.name!r}: codec {self.codec!r} is not one of "
                              f"{', '.join(WIRE_FRACTION)}")
        if self.inner_steps < 1 or self.fragments < 1:
            raise ConfigError(f"sync mode {self.name!r}: inner steps {self.inner_steps} and "
                              f"fragments {self.fragments} must be at least 1")
        if not self.rounds and (self.inner_steps != 1 or self.fragments != 1):
            raise ConfigError(f"sync mode {self.name!r}: a mode that syncs every step has "
                              "one step and one fragment a sync")

    @property
    def wire_fraction(self) -> float:
        return WIRE_FRACTION[self.codec]


def every_step(codec: str = "none", adaptive: bool = True) -> SyncMode:
    name = "every step" if codec == "none" else f"every step, {codec}"
    return SyncMode(name, codec=codec, adaptive=adaptive)


def diloco(inner_steps: int, codec: str = "none", adaptive: bool = True) -> SyncMode:
    name = f"DiLoCo H={inner_steps}" + ("" if codec == "none" else f", {codec}")
    return SyncMode(name, rounds=True, inner_steps=inner_steps, codec=codec, adaptive=adaptive)


def streaming(inner_steps: int, fragments: int = 4, codec: str = "int8") -> SyncMode:
    name = f"Streaming DiLoCo H={inner_steps} P={fragments}" + (
        "" if codec == "none" else f", {codec}")
    return SyncMode(name, rounds=True, inner_steps=inner_steps, codec=codec,
                    fragments=fragments)


def default_modes(inner_steps: Sequence[int] = (10, 50, 200)) -> list[SyncMode]:
    """What ``potluck plan`` prints: every step, plain and int8; DiLoCo at each H;
    Streaming DiLoCo (int8, 4 fragments) at the largest H."""
    modes = [every_step(), every_step("int8")]
    modes += [diloco(h) for h in inner_steps]
    if inner_steps:
        modes.append(streaming(max(inner_steps)))
    return modes
