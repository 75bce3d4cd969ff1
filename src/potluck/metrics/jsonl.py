"""Per-step metrics as JSON lines: one object per line, flushed as it is written.

A run can be followed live (``tail -f``) and read back even if it was cut short: every
complete line is a valid record. The parent directory is created on open.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any


class JsonlWriter:
    """Appends records to ``path`` (truncated on open unless ``append``)."""

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one record as a line; non-finite floats become null (valid JSON)."""
        if self._file is None:
            raise ValueError(f"JsonlWriter for {self.path} is closed; open a new one")
        clean = {key: _finite_or_none(value) for key, value in record.items()}
        self._file.write(json.dumps(clean, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file, in order (blank lines skipped)."""
    records = []
    with Path(path).open(encoding="utf-8") as file:
        for line in file:
            if line.strip():
                records.append(json.loads(line))
    return records


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
