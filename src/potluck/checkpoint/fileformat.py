"""The checkpoint file: a ``torch.save`` payload followed by a fixed-size trailer.

Trailer (56 bytes, big-endian): magic ``POTLCKP1``, SHA-256 of the payload, payload
length, step. The payload is hashed while it streams to disk, so the state is never
held twice in memory. A file counts only if the trailer is there, the length matches
and the hash matches; otherwise reading it raises ``CorruptCheckpointError``.
Files are named ``ckpt-<step, 12 digits>.pt`` so that names sort by step.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from pathlib import Path
from typing import Any, BinaryIO

import torch

from potluck.checkpoint.atomic import atomic_write
from potluck.errors import CheckpointError, CorruptCheckpointError

MAGIC = b"POTLCKP1"
TRAILER = struct.Struct(">8s32sQQ")
_NAME = re.compile(r"^ckpt-(\d{12})\.pt$")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:012d}.pt"


def step_of(path: Path) -> int | None:
    """The step a checkpoint's file name carries, or None for any other file."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


class _HashingWriter:
    """A write-only stream that hashes and counts what passes through it."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.sha, self.length = file, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.length += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def write_checkpoint(path: Path, step: int, state: dict[str, Any]) -> None:
    """Atomically write ``state`` at ``step`` to ``path`` with its checksum trailer."""

    def write(file: BinaryIO) -> None:
        stream = _HashingWriter(file)
        torch.save({"step": step, "state": state}, stream)  # type: ignore[arg-type]
        file.write(TRAILER.pack(MAGIC, stream.sha.digest(), stream.length, step))

    atomic_write(path, write)


def read_checkpoint(path: Path, *, weights_only: bool = True) -> tuple[int, dict[str, Any]]:
    """Verify and load one checkpoint file; returns ``(step, state)``."""
    data = path.read_bytes()
    payload = _verified_payload(path, data)
    try:
        loaded = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=weights_only)
    except Exception as error:
        raise CheckpointError(
            f"{path} passed its checksum but could not be unpickled ({error}). If it holds "
            "objects other than tensors and plain containers and you trust the file, "
            "load it with weights_only=False."
        ) from error
    return int(loaded["step"]), loaded["state"]


def _verified_payload(path: Path, data: bytes) -> memoryview:
    if len(data) < TRAILER.size:
        raise CorruptCheckpointError(
            f"{path} is {len(data)} bytes, shorter than the {TRAILER.size}-byte trailer: "
            "it is truncated or not a potluck checkpoint."
        )
    magic, digest, length, _ = TRAILER.unpack(data[-TRAILER.size:])
    if magic != MAGIC:
        raise CorruptCheckpointError(
            f"{path} has no potluck trailer (found {magic!r}, expected {MAGIC!r}): it is "
            "truncated or not a potluck checkpoint."
        )
    if length != len(data) - TRAILER.size:
        raise CorruptCheckpointError(
            f"{path} holds {len(data) - TRAILER.size} payload bytes but its trailer says "
            f"{length}: the file is truncated or was appended to."
        )
    payload = memoryview(data)[:length]
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpointError(
            f"{path} fails its SHA-256 checksum: the file is corrupted. Use an older checkpoint."
        )
    return payload
