"""A machine's worker identity, kept across runs in a small file.

The first run on a machine makes ``<hostname>-<8 hex digits>`` and writes it to
``~/.cache/potluck/worker-id`` (or the folder given); every later run reads it back.
A new address or a renamed host keeps the identity; a new machine, or a deleted file,
makes a new one. Two processes that make it at once agree: the first rename wins.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

FILE = "worker-id"


def default_folder() -> Path:
    return Path.home() / ".cache" / "potluck"


def worker_identity(folder: str | Path | None = None) -> str:
    """This machine's identity, made and kept under ``folder`` on first use."""
    where = Path(folder).expanduser() if folder is not None else default_folder()
    file = where / FILE
    found = _read(file)
    if found:
        return found
    where.mkdir(parents=True, exist_ok=True)
    made = f"{socket.gethostname()}-{secrets.token_hex(4)}"
    draft = where / f".{FILE}.{os.getpid()}"
    draft.write_text(made + "\n")
    try:
        os.link(draft, file)  # fails if another process made it first
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return _read(file) or made


def _read(file: Path) -> str:
    try:
        return file.read_text().strip()
    except OSError:
        return ""
