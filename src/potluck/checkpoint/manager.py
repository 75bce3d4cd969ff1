"""``CheckpointManager``: durable training state in a directory, newest K kept.

Every rank calls ``save`` (entries such as ``DistributedRng`` gather across ranks);
only the writer (rank 0) writes, because the model and optimizer are replicated. The
rank is asked at each save (of the current potluck cohort by default, which an elastic
job renumbers), so a new rank 0 takes over when the old one is gone. Each
checkpoint is one atomic, checksummed file (see ``fileformat``); older ones are deleted
only after the new one is complete. With ``blocking=False`` the state is copied to CPU
at once and written by a background thread; the next ``save`` or ``wait`` waits for it
and raises its error, if any. The first file is read back as the loader will read it,
so state the loader would refuse fails at once, not at resume. ``load_latest`` skips
(with a warning) checkpoints that fail their checksum and returns the newest good one;
every rank reads the directory, so it must be visible to all of them.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch.distributed as dist

from potluck.checkpoint.atomic import fsync_dir, is_temp
from potluck.checkpoint.fileformat import (
    checkpoint_name,
    read_checkpoint,
    step_of,
    write_checkpoint,
)
from potluck.checkpoint.snapshot import cpu_copy, resolve_state
from potluck.cohort.current import current
from potluck.errors import CheckpointError, ConfigError, CorruptCheckpointError
from potluck.events import note

log = logging.getLogger(__name__)

# The first file is read back only up to this size: loading reads a whole file into
# memory, and a large model's state, twice in memory at its first save, could run the
# host out of it. (Its state is a model's and an optimizer's: tensors, rarely objects.)
READ_BACK_LIMIT = 1 << 30


class Checkpoint(NamedTuple):
    """A loaded checkpoint; unpacks as ``step, state, path``."""

    step: int
    state: dict[str, Any]
    path: Path


class PendingSave:
    """A save that may still be writing; ``wait()`` joins it and raises its error."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @classmethod
    def start(cls, path: Path, write: Callable[[], None]) -> PendingSave:
        """Run ``write`` in a (non-daemon) thread; its exception is kept for ``wait``."""
        pending = cls(path)

        def run() -> None:
            try:
                write()
            except BaseException as error:  # surfaced by the next wait() or save()
                log.error("background checkpoint write of %s failed: %s", path, error)
                pending._error = error

        pending._thread = threading.Thread(target=run, name=f"potluck-save-{path.name}")
        pending._thread.start()
        return pending

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> Path | None:
        """Block until written; return the file (None on ranks that do not write)."""
        if self._thread is not None:
            self._thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointError(f"background write of {self.path} failed: {_reason(error)}; "
                                  "the newest checkpoint before it is intact") from error
        return self.path


class CheckpointManager:
    """Save and load training state as checkpoint files in ``directory``.

    Args:
        directory: where the files live (created by the writer if missing).
        keep: how many of the newest checkpoints to keep (>= 1).
        rank: this process's rank; only rank 0 writes. Default (None): asked at each
            save, of the current potluck cohort (``potluck.init()``), else of torch's
            default group if one is initialized, else 0.
        weights_only: passed to ``torch.load``; keep True unless the state holds
            objects other than tensors and plain containers and you trust the files.
    """

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3,
                 rank: int | None = None, weights_only: bool = True) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise ConfigError(f"directory={directory!r} is invalid: it must be a path (str or "
                              "os.PathLike), e.g. CheckpointManager('checkpoints').")
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ConfigError(f"keep={keep!r} is invalid: keep at least 1 checkpoint.")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)
                                 or rank < 0):
            raise ConfigError(f"rank={rank!r} is invalid: it must be an integer >= 0 (only "
                              "rank 0 writes); pass cohort.rank, or leave it out to follow "
                              "the current cohort.")
        self.directory = Path(directory)
        self.keep, self.weights_only = keep, weights_only
        self._rank = rank
        self._pending = PendingSave(None)
        self._directory_ready = False  # prepared by the first writer, once
        self._read_back = False  # the first file was read back as the loader reads it
        if self.is_writer:
            self._prepare_directory()

    @property
    def rank(self) -> int:
        """This process's rank now: the explicit one, else the current cohort's, else
        the default group's, else 0."""
        if self._rank is not None:
            return self._rank
        cohort = current()
        if cohort is not None:
            return cohort.rank
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoint files as ``(step, path)``, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(step_of(p), p) for p in self.directory.iterdir()]
        return sorted((step, p) for step, p in found if step is not None)

    def save(self, step: int, state: Mapping[str, Any], *, blocking: bool = True) -> PendingSave:
        """Save ``state`` (objects with ``state_dict()`` are resolved) as step ``step``."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"step={step!r} is invalid: it must be an integer >= 0.")
        self.wait()  # one write at a time; surfaces the previous write's error
        resolved = resolve_state(state)  # on every rank: entries may be collectives
        if not self.is_writer:
            return PendingSave(None)
        self._prepare_directory()  # a rank that became the writer since construction
        path = self.directory / checkpoint_name(step)
        if blocking:
            try:
                self._write(path, step, resolved)
            except OSError as error:
                raise CheckpointError(f"writing {path} failed: {_reason(error)}; the newest "
                                      "checkpoint before it is intact") from error
            return PendingSave(path)
        snapshot = cpu_copy(resolved)  # training may change the originals from now on
        self._pending = PendingSave.start(path, lambda: self._write(path, step, snapshot))
        return self._pending

    def wait(self) -> None:
        """Wait for a background save; raise ``CheckpointError`` if it failed."""
        pending, self._pending = self._pending, PendingSave(None)
        pending.wait()

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that passes its checksum; None if there is none at all."""
        self.wait()
        candidates = self.checkpoints()
        bad: list[str] = []
        for _, path in reversed(candidates):
            try:
                step, state = read_checkpoint(path, weights_only=self.weights_only)
            except CorruptCheckpointError as error:
                log.warning("rank %d: skipping bad checkpoint %s: %s", self.rank, path, error)
                bad.append(path.name)
                continue
            return Checkpoint(step, state, path)
        if bad:
            raise CheckpointError(
                f"every checkpoint in {self.directory} is corrupted or truncated ({bad}): "
                "restore one from a backup or delete them to start from scratch."
            )
        return None

    def restore_latest(self, objects: Mapping[str, Any]) -> int | None:
        """Load the newest good checkpoint into ``objects`` (by ``load_state_dict``).

        Returns its step, or None (nothing restored) if the directory has no checkpoint.
        """
        checkpoint = self.load_latest()
        if checkpoint is None:
            return None
        for name, obj in objects.items():
            if name not in checkpoint.state:
                raise CheckpointError(
                    f"{checkpoint.path} has no entry {name!r} (it has "
                    f"{sorted(checkpoint.state)}): save and restore the same names."
                )
            obj.load_state_dict(checkpoint.state[name])
        return checkpoint.step

    def _write(self, path: Path, step: int, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        write_checkpoint(path, step, state)
        took, size = time.perf_counter() - started, path.stat().st_size
        if self.weights_only and not self._read_back and size <= READ_BACK_LIMIT:
            self._read_back_first(path, step)
        log.info("rank %d: wrote checkpoint %s", self.rank, path)
        self._prune()  # (may remove it: a directory holding `keep` newer checkpoints)
        note("checkpoint", f"step {step} saved to {path} ({size / 1e6:.1f} MB in {took:.2f} s)",
             step=step)

    def _read_back_first(self, path: Path, step: int) -> None:
        """Load the first file as ``load_latest`` will (``weights_only``); one it cannot
        unpickle is deleted and raised now, not hours later at resume."""
        try:
            read_checkpoint(path, weights_only=True)
        except CorruptCheckpointError:
            raise
        except CheckpointError as error:
            path.unlink(missing_ok=True)
            fsync_dir(self.directory)
            raise CheckpointError(
                f"the checkpoint of step {step} could not be loaded back with "
                f"weights_only=True ({_unpickling_reason(error.__cause__ or error)}), so it "
                "was deleted: keep only tensors and plain containers (dict, list, tuple, "
                "str, numbers) in the state, or pass CheckpointManager(..., "
                "weights_only=False) if you trust the files"
            ) from error
        self._read_back = True

    def _prune(self) -> None:
        """Delete all but the newest ``keep`` checkpoints (after the new one is durable)."""
        old = self.checkpoints()[: -self.keep]
        for _, path in old:
            path.unlink(missing_ok=True)
        if old:
            fsync_dir(self.directory)

    def _prepare_directory(self) -> None:
        """The writer's directory exists and takes files, or a clear error now (not at
        the first save, minutes into training); unfinished files are removed. Once."""
        if self._directory_ready:
            return
        where = self.directory
        if where.exists() and not where.is_dir():
            raise CheckpointError(f"checkpoint directory {where} is a file: move it away or "
                                  "pass another directory to CheckpointManager")
        try:
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=where, prefix=".potluck-probe-"):
                pass
        except OSError as error:
            raise CheckpointError(
                f"cannot write checkpoints in {where}: {_reason(error)}; pass a directory "
                "this process can write (on a filesystem every rank can read, to resume)"
            ) from error
        self._remove_temp_files()
        self._directory_ready = True

    def _remove_temp_files(self) -> None:
        """Temp files are what a killed writer leaves behind; they never count."""
        for path in self.directory.iterdir():
            if is_temp(path) and path.name.startswith(".ckpt-"):
                log.info("rank %d: removing unfinished checkpoint %s", self.rank, path)
                path.unlink(missing_ok=True)


def _unpickling_reason(error: BaseException) -> str:
    """torch's long weights_only message -> its one line that names the refused type."""
    text = str(error)
    found = re.search(r"WeightsUnpickler error: (.*?)(?: Please use|\n|$)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [type(error).__name__])[0]
    line = line.strip().rstrip(".")
    return line if len(line) <= 200 else line[:197] + "..."


def _reason(error: BaseException) -> str:
    """``[Errno 30] Read-only file system: '/x'`` -> ``Read-only file system``."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__
