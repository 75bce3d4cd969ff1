"""Codecs on the wire (pure): round trips within each codec's stated error, payload
sizes, error feedback that loses nothing over rounds, clear errors for bad input."""

from __future__ import annotations

import math

import pytest
import torch

from potluck.compress import (
    Bf16,
    ErrorFeedback,
    Fp16,
    Identity,
    Int4Blockwise,
    Int8Blockwise,
    TopK,
    route,
    sent_bytes,
)
from potluck.errors import ConfigError


def _flat(numel: int = 1000, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("codec,rtol", [(Fp16(), 2**-11), (Bf16(), 2**-8)])
def test_casts_round_trip_within_half_a_unit_in_the_last_place(codec, rtol) -> None:
    x = _flat()
    back = codec.decode(codec.encode(x), x.numel(), x.dtype)
    assert back.dtype == x.dtype and back.shape == x.shape
    assert torch.all((back - x).abs() <= rtol * x.abs() + 1e-30)
    assert codec.nbytes(x.numel()) == 2 * x.numel()


@pytest.mark.parametrize("numel,block", [(1000, 256), (256, 256), (1, 256), (777, 7)])
def test_int8_round_trip_within_half_a_step_of_each_block(numel: int, block: int) -> None:
    codec = Int8Blockwise(block=block)
    x = _flat(numel, dtype=torch.float64)
    x[min(3, numel - 1)] = 40.0  # an outlier costs precision in its own block only
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(numel)
    back = codec.decode(payload, numel, x.dtype)
    assert back.dtype == torch.float64
    for start in range(0, numel, block):
        part = x[start:start + block]
        step = float(part.abs().max()) / 127
        assert float((back[start:start + block] - part).abs().max()) <= step / 2 + 1e-6 * step
    if numel > block:  # blocks away from the outlier keep their own fine scale
        far = slice(block, min(2 * block, numel))
        assert float((back[far] - x[far]).abs().max()) < 0.05


@pytest.mark.parametrize("numel,block", [(1000, 256), (256, 256), (1, 256), (777, 7), (2, 1)])
def test_int4_round_trip_within_half_a_step_of_each_block(numel: int, block: int) -> None:
    """Two codes a byte (an odd count pads one), one scale a block; every value within
    half a step (its block's largest magnitude / 7) and the largest one exact."""
    codec = Int4Blockwise(block=block)
    x = _flat(numel, seed=1, dtype=torch.float64)
    x[min(3, numel - 1)] = -40.0
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.numel() == codec.nbytes(numel)
    assert codec.nbytes(numel) == (numel + 1) // 2 + 4 * math.ceil(numel / block)
    back = codec.decode(payload, numel, x.dtype)
    assert back.dtype == torch.float64 and back.shape == x.shape
    for start in range(0, numel, block):
        part = x[start:start + block]
        step = float(part.abs().max()) / 7
        assert float((back[start:start + block] - part).abs().max()) <= step / 2 + 1e-6 * step
        top = int(part.abs().argmax())
        assert math.isclose(float(back[start + top]), float(part[top]), rel_tol=1e-6)
    assert torch.equal(torch.sign(back[back != 0]), torch.sign(x[back != 0]))
    # every code from -7 to 7 survives the packing (both nibbles of a byte)
    ramp, one_block = torch.arange(-7.0, 8.0), Int4Blockwise(block=16)
    assert torch.equal(one_block.decode(one_block.encode(ramp), 15, ramp.dtype), ramp)


def test_int8_keeps_zeros_and_signs_exactly() -> None:
    codec = Int8Blockwise(block=4)
    x = torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0, 2.0, 0.0, -3.0, 5.0])
    back = codec.decode(codec.encode(x), x.numel(), x.dtype)
    assert torch.equal(back[:4], torch.zeros(4))
    assert torch.equal(torch.sign(back), torch.sign(x))
    assert math.isclose(codec.nbytes(9), 9 + 4 * 3)  # 9 codes, 3 float32 scales


def test_topk_keeps_the_largest_exactly_and_zeros_the_rest() -> None:
    codec = TopK(fraction=0.1)
    x = _flat(100)
    back = codec.decode(codec.encode(x), 100, x.dtype)
    kept = back != 0
    assert int(kept.sum()) == 10 == codec.k(100)
    assert torch.equal(back[kept], x[kept])
    assert float(x[~kept].abs().max()) <= float(x[kept].abs().min())
    assert codec.nbytes(100) == 80


def test_error_feedback_loses_nothing_over_rounds() -> None:
    """Sent in total = produced in total minus the last residual, exactly (float64): the
    bookkeeping. And the residual stays small (what a codec really keeps back): within
    half a step for int8 and fp16, bounded (not growing with the rounds) for top-k."""
    bounds = {"topk": 15.0, "int8": 0.05, "int4": 0.5, "fp16": 0.01}
    for codec in (TopK(fraction=0.05), Int8Blockwise(block=16), Int4Blockwise(block=16),
                  Fp16()):
        feedback, produced, sent = ErrorFeedback(), torch.zeros(200, dtype=torch.float64), \
            torch.zeros(200, dtype=torch.float64)
        for step in range(30):
            x = _flat(200, seed=step, dtype=torch.float64)
            y = feedback.compensate("g", x)
            payload = codec.encode(y)
            decoded = codec.decode(payload, 200, torch.float64)
            feedback.remember("g", y, decoded)
            produced += x
            sent += decoded
        residual = feedback.residual("g")
        assert residual is not None
        torch.testing.assert_close(sent + residual, produced, rtol=0, atol=1e-12)
        assert float(residual.abs().max()) < bounds[codec.name], codec.name


def test_error_feedback_state_round_trips_and_drops_a_resized_residual() -> None:
    feedback = ErrorFeedback()
    feedback.remember("b0", torch.ones(4), torch.zeros(4))
    other = ErrorFeedback()
    other.load_state_dict(feedback.state_dict())
    assert torch.equal(other.compensate("b0", torch.zeros(4)), torch.ones(4))
    assert torch.equal(other.compensate("b0", torch.zeros(5)), torch.zeros(5))  # rebuilt
    assert torch.equal(other.compensate("new", torch.full((2,), 3.0)), torch.full((2,), 3.0))


def test_routes_and_bytes() -> None:
    numel = 1_000_000
    assert route(Identity(), 4) == "allreduce" and route(Fp16(), 4) == "allreduce"
    assert route(TopK(), 2) == route(TopK(), 8) == "allgather"
    assert route(Int8Blockwise(), 2) == "allgather" and route(Int8Blockwise(), 3) == "scatter"
    ring = sent_bytes(Identity(), numel, 2)
    assert ring == 4 * numel  # 2 ranks: a ring all-reduce sends the whole tensor once
    assert ring / sent_bytes(Int8Blockwise(), numel, 2) > 3.9
    assert ring / sent_bytes(Int4Blockwise(), numel, 2) > 7.7
    assert ring / sent_bytes(TopK(0.01), numel, 2) == pytest.approx(50)
    # a scatter keeps the ring's bytes per rank whatever N; an all-gather grows with N
    assert sent_bytes(Int8Blockwise(), numel, 8) < 2 * sent_bytes(Int8Blockwise(), numel, 2)
    assert sent_bytes(Identity(), numel, 1) == 0


@pytest.mark.parametrize("make,message", [
    (lambda: Int8Blockwise(block=0), "block"),
    (lambda: Int4Blockwise(block=True), "block"),
    (lambda: TopK(fraction=0), "fraction"),
    (lambda: TopK(fraction=1.5), "fraction"),
])
def test_bad_settings_are_refused_with_the_rule(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_tensor_that_is_not_flat_float_is_refused() -> None:
    with pytest.raises(ConfigError, match="flat"):
        Int8Blockwise().encode(torch.ones(2, 3))
    with pytest.raises(ConfigError, match="floating-point"):
        TopK().encode(torch.ones(4, dtype=torch.int64))


def test_a_payload_sliced_from_a_gathered_buffer_decodes() -> None:
    """Slices of one receive buffer start at any byte: decoding must not care."""
    codec = Int8Blockwise(block=4)
    x = _flat(9)
    payload = codec.encode(x)
    buffer = torch.cat([payload, payload])  # the second copy starts at byte 21
    second = buffer[payload.numel():]
    torch.testing.assert_close(codec.decode(second, 9, x.dtype), codec.decode(payload, 9, x.dtype))
