"""Byzantine attacks on one rank's gradients, for the trust bench and tests.

``Attack`` wraps the reducer's communication hook: on the attacker's rank it rewrites
the bucket (this rank's plain gradient) before the real exchange sends it, exactly
what a worker running modified code could put on the wire. ``flip_bit`` flips one bit
of a parameter, as broken memory would. It is lab code, not training API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from potluck.reducer.hooks import Bucket

GROSS = ("sign_flip", "noise", "nan", "bit_flip")  # must be caught within a few steps
ATTACKS = ("sign_flip", "noise", "nan", "alie", "stale", "bit_flip")

Hook = Callable[[Any, Bucket], "torch.futures.Future[Any]"]


def plain_mean(state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
    """torch DDP's semantics on a plain gradient: divide by N, sum."""
    bucket.buffer.div_(bucket.world_size)
    future: torch.futures.Future[Any] = bucket.group.allreduce([bucket.buffer]).get_future()
    return future


class Attack:
    """``name`` on this rank when ``active`` (else a pass-through), then ``inner``.

    - ``sign_flip``: the gradient times -10;
    - ``noise``: plus Gaussian noise, 100 times the gradient's RMS (a card producing
      garbage);
    - ``nan``: every value NaN;
    - ``alie``: "a little is enough" (Baruch et al., 2019), omniscient: every rank's true
      gradient is all-gathered (the bench gives the attacker them all) and the attacker
      sends their mean minus ``z`` standard deviations, per coordinate;
    - ``stale``: the gradient this rank computed ``lag`` steps ago, replayed;
    - ``bit_flip``: no gradient change (see ``flip_bit``, after each step).
    """

    prescaled = False  # the inner hook decides the weighting

    def __init__(self, inner: Hook, name: str, active: bool, *, z: float = 1.0,
                 lag: int = 10, seed: int = 0) -> None:
        if name not in (*ATTACKS, "none"):
            raise ValueError(f"attack {name!r}: one of {', '.join(ATTACKS)} or none")
        self.inner, self.name, self.active, self.z, self.lag = inner, name, active, z, lag
        self.steps = 0
        self._history: dict[int, list[torch.Tensor]] = {}
        self._gen = torch.Generator().manual_seed(seed)

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[Any]:
        if bucket.index == 0:
            self.steps += 1
        if self.name == "alie":  # every rank takes part in the oracle's all-gather
            rows = [torch.empty_like(bucket.buffer) for _ in range(bucket.world_size)]
            bucket.group.allgather([rows], [bucket.buffer]).wait()
            if self.active:
                honest = torch.stack([r for i, r in enumerate(rows) if i != bucket.rank])
                bucket.buffer.copy_(honest.mean(0) - self.z * honest.std(0))
        elif self.active:
            self._corrupt(bucket)
        return self.inner(state, bucket)

    def _corrupt(self, bucket: Bucket) -> None:
        buf = bucket.buffer
        if self.name == "sign_flip":
            buf.mul_(-10.0)
        elif self.name == "noise":
            rms = float(buf.float().pow(2).mean().sqrt())
            buf.add_(torch.randn(buf.shape, generator=self._gen).to(buf) * 100.0 * max(rms, 1e-3))
        elif self.name == "nan":
            buf.fill_(float("nan"))
        elif self.name == "stale":
            history = self._history.setdefault(bucket.index, [])
            history.append(buf.clone())
            if len(history) > self.lag:
                buf.copy_(history.pop(0))

    def starts_at(self) -> int:
        """The first step whose gradient the attack changes."""
        if self.name == "stale":
            return self.lag + 1
        return 2 if self.name == "bit_flip" else 1  # a flip after step 1 corrupts step 2


def flip_bit(module: torch.nn.Module, step: int, bit: int = 22) -> None:
    """Flip ``bit`` of one float32 parameter value (22: the top mantissa bit, a value
    off by up to half itself: silent, no NaN), a different value each step."""
    params = [p for p in module.parameters() if p.dtype == torch.float32]
    target = params[step % len(params)]
    flat = target.data.view(-1)
    bits = flat.view(torch.int32)
    index = (step * 7919) % flat.numel()
    bits[index] ^= 1 << bit
