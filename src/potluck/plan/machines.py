"""What the planner knows about a candidate machine and about the job (pure data).

A ``Machine`` is one worker: its compute speed on the job (samples a second), its
link's rates up and down (bits a second), its one-way latency to its region's
exchange point, its region and, if known, its price. A ``Workload`` is the job: the
parameters that travel, the global batch, and the costs the runtime adds on top of
compute and the wire (``Overheads``, measured by ``potluck plan --calibrate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from potluck.errors import ConfigError

# A TCP segment's payload over what an IPv4 Ethernet link carries for it: a 1448-byte
# MSS (with TCP timestamps) in a 1514-byte frame. A link's rate counts frames. In a
# ring each member also receives, so its uplink carries its acknowledgements too: a
# 66-byte frame for every two segments (delayed ACK), 33 bytes a segment.
PAYLOAD_FRACTION = 1448 / (1514 + 33)


@dataclass(frozen=True)
class Machine:
    """One candidate worker. Rates are bits a second of the link, as a provider or
    ``tc`` states them; ``speed`` is samples a second of local work on the job.
    ``cores``: the CPU its worker gets, when its compute runs on that CPU (training on
    CPU); the all-reduce's CPU work then takes turns with compute. None: compute runs
    elsewhere (a GPU), and that work takes one core beside it."""

    name: str
    speed: float
    up_bps: float
    down_bps: float
    latency_s: float = 0.0
    region: str = ""
    price_per_h: float | None = None
    cores: float | None = None

    def __post_init__(self) -> None:
        for field, value in (("speed", self.speed), ("up_bps", self.up_bps),
                             ("down_bps", self.down_bps), ("cores", self.cores or 1.0)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"machine {self.name!r}: {field} {value!r} must be a "
                                  "positive number")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"machine {self.name!r}: latency {self.latency_s!r} s must be "
                              "0 or more")
        if self.price_per_h is not None and not self.price_per_h >= 0:
            raise ConfigError(f"machine {self.name!r}: price {self.price_per_h!r} per hour "
                              "must be 0 or more")

    @property
    def goodput(self) -> float:
        """Payload bytes a second this machine's link moves, its slower direction."""
        return min(self.up_bps, self.down_bps) / 8.0 * PAYLOAD_FRACTION


@dataclass(frozen=True)
class Overheads:
    """Seconds the runtime adds beyond compute and the wire.

    - ``step_s``: each synchronized step (the reducer's hooks, bucket copies, the
      commit); ``round_s``: each round (the pseudo-gradient, the outer step, the
      speed exchange);
    - ``overlap``: the part of a step's compute that its all-reduce can hide behind
      (buckets leave during backward; 0: none, the default 0.5: most of backward);
    - ``codec_s_per_param``: encoding and decoding, per parameter and sync;
    - ``cpu_s_per_byte``: CPU seconds (one core) an all-reduce spends per byte a member
      sends: Gloo's copies and sums, and the kernel's work for each TCP segment.
    """

    step_s: float = 0.0
    round_s: float = 0.0
    overlap: float = 0.5
    codec_s_per_param: float = 0.0
    cpu_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        for name in ("step_s", "round_s", "codec_s_per_param", "cpu_s_per_byte"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"overheads: {name} {value!r} must be 0 or more")
        if not 0 <= self.overlap <= 1:
            raise ConfigError(f"overheads: overlap {self.overlap!r} must be in [0, 1]")


@dataclass(frozen=True)
class Workload:
    """The job: ``parameters`` (their count), ``global_batch`` samples a step, each
    parameter ``bytes_per_param`` on the wire before a codec (4: float32)."""

    parameters: int
    global_batch: int
    bytes_per_param: int = 4
    overheads: Overheads = Overheads()

    def __post_init__(self) -> None:
        if self.parameters < 1 or self.global_batch < 1 or self.bytes_per_param < 1:
            raise ConfigError(f"workload: parameters {self.parameters}, global batch "
                              f"{self.global_batch} and bytes a parameter "
                              f"{self.bytes_per_param} must each be at least 1")

    @property
    def model_bytes(self) -> int:
        return self.parameters * self.bytes_per_param
