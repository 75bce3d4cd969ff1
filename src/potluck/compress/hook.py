"""``CompressedSum``: a communication hook that sends gradient buckets through a codec.

The reducer weighs each bucket before it reaches the hook (``1 / N``, or this rank's
part of the step under ``potluck.prepare``, so unequal shares and token weights stay
exact up to the codec's error), and the hook only sums, encoded. Error feedback is on
by default: each bucket's residual is added to the next step's same bucket.

    model = potluck.DataParallel(net, comm_hook=CompressedSum(Int8Blockwise()))
    model, opt, loader = potluck.prepare(net, sgd, data, global_batch=64,
                                         comm_hook=CompressedSum(Fp16()))
"""

from __future__ import annotations

from typing import Any

import torch

from potluck.compress.codec import Codec
from potluck.compress.exchange import Traffic, start_sum
from potluck.compress.feedback import ErrorFeedback
from potluck.errors import ConfigError
from potluck.reducer.hooks import Bucket


class CompressedSum:
    """A summing hook (``prescaled``): the reducer weighs, the codec carries the sum."""

    prescaled = True

    def __init__(self, codec: Codec, *, error_feedback: bool = True) -> None:
        if isinstance(codec, type) or not isinstance(codec, Codec):
            raise ConfigError(f"CompressedSum({codec!r}): pass a codec object, e.g. "
                              "potluck.compress.Int8Blockwise() (with the parentheses) or "
                              "Fp16()")
        self.codec = codec
        self.feedback = ErrorFeedback() if error_feedback else None
        self.traffic = Traffic()

    def __call__(self, state: Any, bucket: Bucket) -> torch.futures.Future[torch.Tensor]:
        return start_sum(bucket.buffer, self.codec, bucket.group, feedback=self.feedback,
                         key=f"bucket{bucket.index}", traffic=self.traffic)

    def __repr__(self) -> str:
        return f"CompressedSum({self.codec.name})"
