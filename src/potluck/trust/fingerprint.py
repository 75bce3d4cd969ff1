"""A bitwise fingerprint of a replica's parameters (honest replicas are bitwise equal).

Each tensor's bit patterns are read as integers of at most 32 bits (8-byte values as two
32-bit words), each half of them summed in 32 bits (wrapping: ``word_sums``), and the
sums are folded in order into 63 bits: a single flipped bit changes one sum by 2^k for
some k < 32, which is not 0 modulo 2^32, and the fold keeps any change below 2^63 (read
whole, a float64's sign bit would change a sum by 2^63, which the fold drops). One
pass over the parameters and one host sync per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import blake3
import numpy as np
import torch

_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}  # (8: two words)
_MASK = (1 << 63) - 1  # non-negative: below it, wire.py marks "no majority"
_WORD = (1 << 32) - 1  # a 32-bit sum as a non-negative number


def fingerprint(tensors: Sequence[torch.Tensor]) -> int:
    if not tensors:
        return 0
    halves = _host_halves(tensors)
    if halves is not None:  # read in place with numpy: the same sums, a few calls a
        return _fold(_sums(halves))  # tensor, not ten
    return _fold(torch.stack([word_sums(t) for t in tensors]).view(-1).tolist())


class Fingerprints:
    """``fingerprint`` of a replica's parameters step after step: the numpy views of
    their bits are made once and kept while the tensors' storage, dtype, shape and
    strides stay (an optimizer updates them in place), so a step's fingerprint is two
    sums a tensor."""

    def __init__(self) -> None:
        self._key: tuple[tuple[int, torch.dtype, torch.Size, tuple[int, ...]], ...] | None = None
        self._halves: list[np.ndarray] | None = None

    def __call__(self, tensors: Sequence[torch.Tensor]) -> int:
        key = tuple((t.data_ptr(), t.dtype, t.shape, t.stride()) for t in tensors)
        if key != self._key:
            self._key, self._halves = key, _host_halves(tensors)
        if self._halves is None or not tensors:
            return fingerprint(tensors)
        return _fold(_sums(self._halves))


def _host_halves(tensors: Sequence[torch.Tensor]) -> list[np.ndarray] | None:
    """Each tensor's ``bit_words`` in two halves, as numpy views of its bytes; None
    unless every tensor is a contiguous CPU tensor (``host_bytes``)."""
    halves: list[np.ndarray] = []
    for tensor in tensors:
        data = host_bytes(tensor)
        if data is None:
            return None
        words = data.view(_NUMPY_INT[tensor.element_size()])
        half = words.size // 2
        halves += [words[:half], words[half:]]
    return halves


def _sums(halves: Sequence[np.ndarray]) -> list[int]:
    """Each half's wrapping 32-bit sum, widened as torch widens it (``word_sums``)."""
    return [int(h.sum(dtype=np.int32)) for h in halves]


def _fold(values: Sequence[int]) -> int:
    folded = 0
    for value in values:
        folded = (folded * 1_000_003 + (value & _WORD)) & _MASK
    return folded


def keyed_digest(tensors: Sequence[torch.Tensor], key: int) -> int:
    """A 64-bit digest of the tensors' bit patterns, in order, keyed by ``key``, a signed
    64-bit word drawn after the values were chosen (the result is never 0, which means
    "none"). Whoever chose the values before the key existed cannot make two different
    runs of values digest alike but by a chance of about 2^-64 (2^-32 on an
    accelerator), even though 64 bits alone would let them search for a collision.

    On the CPU: the first 64 bits of keyed BLAKE3 (``hash64``: its 32-byte key is the
    key's 8 bytes four times) over the values' bytes, read in place (one pass, several
    GB/s on one core). On an
    accelerator: ``dot_digest`` there, in chunks (``chunked_dot_digest``), with the
    key's words computed there (``_table``: the same words on every card), so only a
    scalar comes back to the host, not a gradient's worth of bytes. The two differ, so
    a trusted cohort's gradients must all be on the CPU or all on accelerators
    (``docs/trust.md``)."""
    if not tensors:
        return 1
    if tensors[0].device.type == "cpu":
        return hash64(tensors, key)
    return chunked_dot_digest(tensors, key)


def hash64(pieces: Sequence[torch.Tensor], key: int | None = None) -> int:
    """The first 64 bits of BLAKE3 over the pieces' bytes, in order, keyed by the
    64-bit ``key`` when one is given, as a signed word (never 0, which means "none");
    each piece is read in place when it is on the CPU (one copy to the host otherwise).
    BLAKE3, not SHA-256: on one core of this project's machines it hashes about 6 GB/s
    against SHA-256's 1.8 (with the CPU's SHA instructions), and trust hashes a
    gradient's worth or more every step."""
    h = blake3.blake3() if key is None else blake3.blake3(
        key=(key & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big") * 4)
    for piece in pieces:
        data = host_bytes(piece)
        if data is None:  # (bit_words: contiguous, and the same bytes in the same order)
            data = bit_words(piece).view(torch.uint8).cpu().numpy()
        h.update(data.data)
    return int.from_bytes(h.digest(8), "big", signed=True) or 1


_NUMPY_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int32}  # as _AS_INT


def host_bytes(tensor: torch.Tensor) -> np.ndarray | None:
    """A contiguous CPU tensor's bytes as a numpy array, read in place (no copy, one or
    two calls); None for any other tensor (the caller takes the slow, general way)."""
    if (tensor.device.type != "cpu" or not tensor.is_contiguous()
            or (tensor.dim() and tensor.numel() == 1 and tensor.stride(-1) != 1)):  # (bit_words)
        return None
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype not in _NUMPY_DTYPES:
        tensor = tensor.view(_AS_INT[tensor.element_size()])  # bfloat16: no numpy type
    return tensor.numpy().reshape(-1).view(np.uint8)


_NUMPY_DTYPES = {torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8,
                 torch.int16, torch.int32, torch.int64, torch.bool}


def chunked_dot_digest(tensors: Sequence[torch.Tensor], key: int,
                       chunk: int = 1 << 22) -> int:
    """``dot_digest`` of the tensors' ``bit_words`` in order with ``_table``'s words,
    ``chunk`` words at a time, each chunk's key words computed for it and dropped: the
    memory it takes is a few chunks' worth, not three 64-bit copies of the values (the
    words widened, the table, their product), and nothing is kept between steps. The
    sum stays on the device until the end (one host sync)."""
    total: torch.Tensor | None = None
    done = 0
    for t in tensors:
        words = bit_words(t)
        for start in range(0, words.numel(), chunk):
            piece = words[start:start + chunk].to(torch.int64)
            part = (piece * _table(done + start, piece.numel(), key, piece.device)).sum()
            total = part if total is None else total + part  # (int64: wraps)
        done += words.numel()
    if total is None:
        return 1
    return _as_digest(int(total))


def dot_digest(bits: torch.Tensor, table: torch.Tensor) -> int:
    """The dot product, wrapping in 64 bits, of ``bits`` (``bit_words`` widened to
    int64: 32-bit words, or 16-bit values as they are, so a flipped bit moves one by at
    most 2^31) with ``table``'s random 64-bit words, as a signed word, never 0. For a
    given difference between two runs of values it vanishes modulo 2^64 with a chance of
    at most about 2^-32."""
    return _as_digest(int((bits * table).sum()))


def _as_digest(total: int) -> int:
    return _signed(total) or 1


def word_sums(tensor: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The tensor's ``bit_words`` (of each row of a 2-d tensor with ``dim=1``) in two
    halves, each summed in 32 bits, wrapping: an int32 tensor ``[2]`` (``[rows, 2]``).
    A single flipped bit changes one sum by 2^k, k < 32, so never to the same value; two
    sums make a chance repeat between unrelated runs of values about 2^-64. Summed as
    they are: on the CPU a sum of 32-bit words in 64 bits is several times slower (a
    widened copy's sum was the old way, a copy of twice the values' bytes)."""
    if dim not in (None, 1) or (dim == 1 and tensor.dim() != 2):
        raise ValueError(f"word_sums: dim None (the whole tensor) or 1 (the rows of a 2-d "
                         f"tensor), got dim {dim} of a {tensor.dim()}-d tensor")
    if dim is None:  # two 1-d sums: several times faster than a row sum of a [1, n] view
        words = bit_words(tensor)
        half = words.numel() // 2
        return torch.stack([words[:half].sum(dtype=torch.int32),
                            words[half:].sum(dtype=torch.int32)])
    values = tensor.detach()  # rows read in place (a strided view, e.g. copies beside
    if values.stride(-1) != 1:  # their headers)
        values = values.contiguous()
    rows = values.view(_AS_INT[values.element_size()])
    half = rows.shape[1] // 2
    return torch.stack([rows[:, :half].sum(1, dtype=torch.int32),
                        rows[:, half:].sum(1, dtype=torch.int32)], dim=1)


def bit_words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits, flat, as integers of at most 32 bits (8-byte values as two
    32-bit words): a single flipped bit changes one by 2^k, k < 32, so a wrapping 32-bit
    sum sees it (``word_sums``), and a product with a 64-bit word never loses a high
    bit."""
    flat = tensor.detach().contiguous().view(-1)
    if flat.numel() == 1 and flat.stride(0) != 1:  # one value of a strided view counts as
        flat = flat.new_empty(1).copy_(flat)  # contiguous, but its stride cannot be
        # reinterpreted (and a clone keeps the stride)
    return flat.view(_AS_INT[flat.element_size()])


_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # splitmix64's constants, as signed words
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _table(start: int, length: int, key: int, device: torch.device) -> torch.Tensor:
    """The key's random 64-bit words ``start .. start + length - 1``: word i is
    splitmix64 of ``key + (i + 1) * golden``, a function of the key and the index alone,
    so every card (and the CPU) computes the same table, whatever its number of cores (a
    device generator's stream depends on its launch grid), and any chunk of it alone."""
    index = torch.arange(start + 1, start + length + 1, dtype=torch.int64, device=device)
    z = index * _GOLDEN + _signed(key)  # (int64 products and sums wrap)
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """A logical right shift of int64 words (torch's is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _signed(value: int) -> int:
    value &= 0xFFFF_FFFF_FFFF_FFFF
    return value - (1 << 64) if value >> 63 else value
