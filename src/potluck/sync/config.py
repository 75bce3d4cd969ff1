"""What a user asks for: ``DiLoCo(...)`` (and ``LocalSGD``, its plain-averaging case).

DiLoCo (Douillard et al., arXiv 2311.08105): every worker takes ``inner_steps`` local
optimizer steps on its own data, then the replicas are reconciled once: each worker's
pseudo-gradient (the parameters at the last sync minus its parameters now) is averaged,
and an outer optimizer (SGD, Nesterov momentum: lr 0.7, momentum 0.9 in the paper)
steps the global parameters with it. Local SGD is the outer SGD with lr 1 and no
momentum: the new global parameters are the replicas' (weighted) average.

Streaming DiLoCo (Douillard et al., arXiv 2501.18512) cuts the parameters into
``fragments`` synced in turn within a round: fragment f's pseudo-gradient is sent at
``(f + 1) / P`` of each worker's part of the round and received while the worker goes
on with its next local steps (the overlap), then the outer step for that fragment and
the merge ``local = mixing * local + (1 - mixing) * global``. Peak bandwidth is 1/P
of DiLoCo's, and only the last fragment's sync is on the round's critical path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.compress.codec import Codec
from potluck.errors import ConfigError


@dataclass(frozen=True)
class DiLoCo:
    """``potluck.prepare(..., sync=DiLoCo(inner_steps=50))``.

    - ``inner_steps`` (H): a round is H global batches; at equal speeds every worker
      takes H local steps of ``global_batch / N`` samples.
    - ``outer_lr``, ``outer_momentum``, ``nesterov``: the outer SGD.
    - ``codec``: how pseudo-gradients travel (``potluck.compress``; None: as they are),
      with ``error_feedback``.
    - ``adaptive``: each worker's local steps per round follow its measured speed, so a
      fast worker never waits for a slow one (``round_plan.py``); ``split`` fixes them
      instead (one count per rank); ``min_gain``: the plan's hysteresis.
    - ``measure``: with ``adaptive``, an unmeasured round (the run's first, and the first
      after a join or a leave at a boundary) starts with this fraction of its global batches (at
      least one) split evenly; then the ranks exchange their speeds (a few bytes; no
      parameters travel) and split the rest of the round by them, so a fast worker
      waits for a slow one only through that start. 0: the whole round is even.
    - ``fragments`` (P > 1: Streaming DiLoCo; see the module doc), parameter tensors
      dealt out in turn (tensor i to fragment ``i % P``), and ``mixing``: how much of its
      own fragment a worker keeps when the new global one arrives (0: it takes the
      global one).
    """

    inner_steps: int = 50
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    codec: Codec | None = None
    error_feedback: bool = True
    adaptive: bool = True
    split: tuple[int, ...] | None = None
    min_gain: float = 0.05
    fragments: int = 1
    mixing: float = 0.0
    measure: float = 0.0625

    def __post_init__(self) -> None:
        if isinstance(self.inner_steps, bool) or not isinstance(self.inner_steps, int) \
                or self.inner_steps < 1:
            raise ConfigError(f"DiLoCo(inner_steps={self.inner_steps!r}): the local steps "
                              "per round are a positive int, e.g. 50 (1 syncs every step)")
        if self.codec is not None and (isinstance(self.codec, type)
                                       or not isinstance(self.codec, Codec)):
            raise ConfigError(f"DiLoCo(codec={self.codec!r}): pass a codec object, e.g. "
                              "potluck.compress.Int8Blockwise() (with the parentheses), or "
                              "None to send as is")
        for name in ("nesterov", "error_feedback", "adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"DiLoCo({name}={getattr(self, name)!r}) must be True or False")
        if isinstance(self.outer_momentum, (int, float)) and not self.outer_momentum < 1:
            raise ConfigError(f"DiLoCo(outer_momentum={self.outer_momentum!r}) must be in "
                              "[0, 1), e.g. 0.9")
        for name in ("outer_lr", "outer_momentum", "min_gain"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"DiLoCo({name}={value!r}) must be a finite number >= 0")
        if not self.min_gain < 1:
            raise ConfigError(f"DiLoCo(min_gain={self.min_gain!r}) must be in [0, 1): the "
                              "least predicted gain in a round's time worth a new plan of "
                              "local steps, e.g. 0.05")
        if not self.outer_lr > 0:
            raise ConfigError("DiLoCo(outer_lr=0) never moves the global parameters: "
                              "use e.g. 0.7 (DiLoCo) or 1.0 (Local SGD)")
        if self.nesterov and self.outer_momentum == 0:
            raise ConfigError("DiLoCo(nesterov=True, outer_momentum=0): Nesterov needs "
                              "momentum; set outer_momentum (e.g. 0.9) or nesterov=False")
        if self.split is not None:
            check_split(self.split)
        if isinstance(self.fragments, bool) or not isinstance(self.fragments, int) \
                or self.fragments < 1:
            raise ConfigError(f"DiLoCo(fragments={self.fragments!r}): the number of parts "
                              "the parameters are synced in, a positive int (1: all at once)")
        if isinstance(self.measure, bool) or not isinstance(self.measure, (int, float)) \
                or not 0 <= self.measure < 1:
            raise ConfigError(f"DiLoCo(measure={self.measure!r}) must be in [0, 1): the share "
                              "of an unmeasured round taken evenly before the speeds are "
                              "exchanged, e.g. 0.0625 (0: the whole round even)")
        if not isinstance(self.mixing, (int, float)) or not 0 <= self.mixing < 1:
            raise ConfigError(f"DiLoCo(mixing={self.mixing!r}) must be in [0, 1): the share "
                              "of its own fragment a worker keeps (0.5 in Streaming DiLoCo)")

    @property
    def strategy(self) -> str:
        if self.fragments > 1:
            return "streaming-diloco"
        plain = self.outer_lr == 1 and self.outer_momentum == 0
        return "local-sgd" if plain else "diloco"


def StreamingDiLoCo(inner_steps: int = 50, fragments: int = 4, *, mixing: float = 0.5,
                    outer_lr: float = 0.7, outer_momentum: float = 0.9,
                    nesterov: bool = True, codec: Codec | None = None,
                    error_feedback: bool = True, adaptive: bool = True,
                    split: tuple[int, ...] | None = None, min_gain: float = 0.05,
                    measure: float = 0.0625) -> DiLoCo:
    """Streaming DiLoCo: ``fragments`` parts synced in turn, each overlapped with the
    following local steps (see the module doc)."""
    if isinstance(fragments, int) and not isinstance(fragments, bool) and fragments < 2:
        raise ConfigError(f"StreamingDiLoCo(fragments={fragments!r}): streaming needs at "
                          "least 2 fragments (DiLoCo(...) syncs everything at once)")
    return DiLoCo(inner_steps=inner_steps, outer_lr=outer_lr, outer_momentum=outer_momentum,
                  nesterov=nesterov, codec=codec, error_feedback=error_feedback,
                  adaptive=adaptive, split=split, min_gain=min_gain, fragments=fragments,
                  mixing=mixing, measure=measure)


def LocalSGD(inner_steps: int = 8, *, codec: Codec | None = None, error_feedback: bool = True,
             adaptive: bool = True, split: tuple[int, ...] | None = None,
             min_gain: float = 0.05, measure: float = 0.0625) -> DiLoCo:
    """Local SGD: H local steps, then the replicas' weighted average."""
    return DiLoCo(inner_steps=inner_steps, outer_lr=1.0, outer_momentum=0.0, nesterov=False,
                  codec=codec, error_feedback=error_feedback, adaptive=adaptive, split=split,
                  min_gain=min_gain, measure=measure)


def check_split(split: Sequence[int]) -> None:
    if not split or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                        for n in split):
        raise ConfigError(f"DiLoCo(split={tuple(split)!r}): one positive number of local "
                          "steps per rank, e.g. split=(30, 10) for a fast and a slow worker")
