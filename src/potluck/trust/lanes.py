"""What a sender's copy looks like in its lane of the robust exchange's first all-to-all.

``Plain``: the copy as it is, in the bucket's dtype (``Trust()`` alone). ``Coded``: the
copy encoded by a codec (``prepare(trust=Trust(), comm_hook=CompressedSum(codec))``):

- each sender encodes its copy of each owner's slice on its own, and keeps the codec's
  error feedback itself, per bucket, by position in the bucket (so a change of owners,
  which cuts the slices anew, keeps it). The residual never leaves the sender;
- each owner decodes every sender's copy and aggregates the decoded copies. Decoding is
  deterministic, so an auditor that decodes the carried copies gets the owner's inputs
  bit for bit;
- what trust digests, replays and audits is the encoded copy: the bytes sent.

An all-to-all moves lanes of one size, so a codec must encode ``numel`` values in
``nbytes(numel)`` bytes whatever they are (``Coded`` checks it when built and at every
encoding).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from potluck.compress import Codec, ErrorFeedback, Identity
from potluck.errors import ConfigError

Take = Callable[[str, int], torch.Tensor]  # (name, numel) -> a scratch buffer of the bucket


def laid_out(flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``flat`` written into ``rows`` (``[owners, piece]``, maybe strided), owner k's
    slice in row k, zeros past its end; returns ``rows``."""
    piece = rows.shape[1]
    whole, rest = divmod(flat.numel(), piece)
    rows[:whole] = flat[:whole * piece].view(whole, piece)
    if whole < rows.shape[0]:
        rows[whole, :rest] = flat[whole * piece:]
        rows[whole, rest:] = 0
        rows[whole + 1:] = 0
    return rows


class Lanes(Protocol):
    """How copies travel in the first all-to-all: ``width`` values of the bucket's dtype
    per copy of a ``piece``-value slice."""

    def width(self, piece: int, dtype: torch.dtype) -> int: ...

    def lay_out(self, index: int, flat: torch.Tensor, rows: torch.Tensor, piece: int,
                take: Take) -> torch.Tensor:
        """This sender's copies of bucket ``index`` (``flat``) written into ``rows``
        (``[owners, width]``); returns ``rows``."""
        ...

    def idle(self, flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` for a rank that sends nothing (a quarantined member)."""
        ...

    def copies(self, rows: torch.Tensor, piece: int) -> torch.Tensor:
        """``[n, width]`` copies as they travelled to ``[n, piece]`` float32 values."""
        ...

    def begin(self) -> None:
        """A pass's first bucket."""

    def commit(self) -> None:
        """The pass's step committed."""

    def rollback(self) -> None:
        """The pass's step will not commit (it failed, or a new generation began)."""


class Plain:
    """The copy as it is."""

    coded = False

    def width(self, piece: int, dtype: torch.dtype) -> int:
        return piece

    def lay_out(self, index: int, flat: torch.Tensor, rows: torch.Tensor, piece: int,
                take: Take) -> torch.Tensor:
        return laid_out(flat, rows)

    def idle(self, flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return laid_out(flat, rows)

    def copies(self, rows: torch.Tensor, piece: int) -> torch.Tensor:
        return rows.float()

    def begin(self) -> None:
        pass

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


PLAIN = Plain()


class Coded:
    """Each copy encoded by ``codec``, with this sender's error feedback (``feedback``;
    None: what the codec drops is lost)."""

    coded = True

    def __init__(self, codec: Codec, feedback: ErrorFeedback | None) -> None:
        self.codec, self.feedback = codec, feedback
        self._payload = _fixed_size(codec)  # the payload's dtype
        self._saved: dict[str, torch.Tensor] | None = None  # the residuals at a pass's start
        self._open = False  # a pass began and its step did not commit yet

    def width(self, piece: int, dtype: torch.dtype) -> int:
        size = torch.empty(0, dtype=dtype).element_size()
        return math.ceil(self.codec.nbytes(piece) / size)

    def lay_out(self, index: int, flat: torch.Tensor, rows: torch.Tensor, piece: int,
                take: Take) -> torch.Tensor:
        owners, numel, key = rows.shape[0], flat.numel(), f"bucket{index}"
        feedback = self.feedback
        sent = flat if feedback is None else feedback.compensate(key, flat)
        laid = laid_out(sent, take("laid", owners * piece).view(owners, piece))
        decoded = take("decoded", owners * piece).view(owners, piece)
        wire, size = rows.view(torch.uint8), self.codec.nbytes(piece)
        for k in range(owners):
            payload = self._encoded(laid[k])
            wire[k, :size] = payload.reshape(-1).view(torch.uint8)
            wire[k, size:] = 0
            decoded[k] = self.codec.decode(payload, piece, flat.dtype)
        if feedback is not None:
            feedback.remember(key, sent, decoded.view(-1)[:numel])
            residual = feedback.residual(key)
            if residual is not None and not bool(torch.isfinite(residual.sum())):
                feedback.forget(key)  # (a non-finite step must not spoil every later one)
        return rows

    def idle(self, flat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return rows.zero_()

    def copies(self, rows: torch.Tensor, piece: int) -> torch.Tensor:
        wire, size = rows.view(torch.uint8), self.codec.nbytes(piece)
        out = torch.empty(rows.shape[0], piece, dtype=torch.float32, device=rows.device)
        for i in range(rows.shape[0]):
            payload = wire[i, :size]
            if self._payload != torch.uint8:  # (a clone starts aligned for the view)
                payload = payload.clone().view(self._payload)
            out[i] = self.codec.decode(payload, piece, torch.float32)
        return out

    def begin(self) -> None:
        if self.feedback is None:
            return
        self.rollback()  # the last pass's step never committed: its sends never counted
        self._saved, self._open = self.feedback.snapshot(), True

    def commit(self) -> None:
        self._open = False

    def rollback(self) -> None:
        if self._open and self.feedback is not None and self._saved is not None:
            self.feedback.restore(self._saved)
        self._open = False

    def _encoded(self, values: torch.Tensor) -> torch.Tensor:
        payload = self.codec.encode(values)
        size = payload.numel() * payload.element_size()
        if size != self.codec.nbytes(values.numel()) or payload.dtype != self._payload:
            raise ConfigError(_varies(self.codec, values.numel(), size, payload.dtype))
        return payload


def lanes_for(codec: Codec | None, error_feedback: bool = True) -> Plain | Coded:
    """``Coded`` for a codec (``Identity`` sends copies as they are: ``Plain``)."""
    if codec is None or isinstance(codec, Identity):
        return PLAIN
    return Coded(codec, ErrorFeedback() if error_feedback else None)


def _fixed_size(codec: Codec) -> torch.dtype:
    """The codec's payload dtype, once it encoded two unlike tensors in the bytes its
    ``nbytes`` names (else the error: it cannot travel in lanes of one size)."""
    gen = torch.Generator().manual_seed(0)
    numel = 1000
    dtypes = set()
    for values in (torch.zeros(numel), torch.randn(numel, generator=gen) * 1e3):
        payload = codec.encode(values)
        size = payload.numel() * payload.element_size()
        if size != codec.nbytes(numel):
            raise ConfigError(_varies(codec, numel, size, payload.dtype))
        dtypes.add(payload.dtype)
    if len(dtypes) != 1:
        raise ConfigError(f"codec {codec.name} encoded into {sorted(map(str, dtypes))}: "
                          "trust's exchange needs one payload dtype")
    return dtypes.pop()


def _varies(codec: Codec, numel: int, size: int, dtype: torch.dtype) -> str:
    return (f"codec {codec.name} encoded {numel} values in {size} bytes of {dtype}, but its "
            f"nbytes({numel}) is {codec.nbytes(numel)}: trust's exchange sends every copy "
            "in an all-to-all of fixed sizes, so it needs a codec whose payload size "
            "depends only on the number of values (Int8Blockwise, Int4Blockwise, Fp16, "
            "Bf16, TopK); use one of those, or drop trust= or comm_hook=")
