"""Atomic file writes: a reader sees the old file or the complete new one, never a part.

The bytes go to a temporary file in the same directory (same filesystem, so the rename
is atomic), which is flushed and fsynced, renamed over the target, and then the
directory is fsynced so the rename itself survives a power cut. On any exception the
temporary file is removed. Temporary names start with ``.`` and contain ``.tmp-``, so
they never match a checkpoint's name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

TEMP_MARK = ".tmp-"


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and TEMP_MARK in path.name


def fsync_dir(directory: Path) -> None:
    """Make renames and unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Create or replace ``path`` with what ``write(file)`` writes, atomically."""
    tmp = temp_path(path)
    try:
        with open(tmp, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        # The write's own error is the one to see: a directory that refused the write
        # may refuse the cleanup too, and that second error would only hide the first.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
