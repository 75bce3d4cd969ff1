"""A CPU quota for some processes: a cgroup (v1 ``cpu`` controller) of their own.

    with CpuQuota("potluck-straggler-123", period_us=10_000, shares=16384) as quota:
        quota.set(0.5)  # half of one core, whatever the number of threads
        quota.add(pid)  # the whole process (all its threads, and threads it starts)

The cgroup is created on entry and removed on exit, also after an error or Ctrl-C
(processes still in it are moved back to the root first). A short period (10 ms)
throttles smoothly: the process runs ``fraction * period`` of every period, so a step of
tens of milliseconds sees its fraction, not a burst and a stall. ``shares`` weighs the
cgroup against the machine's other processes (one ordinary process weighs 1024), so
that a benchmark in it is disturbed less by them. ``QuotaSchedule`` changes the quota
when a worker's step records reach given steps; ``unavailable()`` says why a quota
cannot be had here (not root, no v1 cpu controller), or None.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from potluck.errors import ConfigError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")


def unavailable(root: Path = CPU_ROOT) -> str | None:
    """Why ``CpuQuota`` cannot work on this machine, or None if it can."""
    if os.geteuid() != 0:
        return (f"a CPU quota needs root (a cgroup under {root}), and this is uid "
                f"{os.geteuid()}: run it as root (e.g. sudo, or in a container as root)")
    if not (root / "cpu.cfs_quota_us").is_file():
        return (f"no cgroup v1 cpu controller at {root} (no cpu.cfs_quota_us there): mount "
                f"one (mount -t cgroup -o cpu cgroup {root}); cgroup v2 is not supported")
    if not os.access(root, os.W_OK):
        return f"{root} is not writable (a read-only cgroup mount): remount it read-write"
    return None


class CpuQuota:
    """A cgroup with a CFS quota; ``set(fraction)`` of one core, ``add(pid)``."""

    def __init__(self, name: str, *, period_us: int = 10_000, shares: int | None = None,
                 root: Path = CPU_ROOT) -> None:
        """``shares``: the cgroup's CPU weight against other processes (1024 is one
        ordinary process's; more: they wait while these run)."""
        if not 1000 <= period_us <= 1_000_000:
            raise ConfigError(f"period_us={period_us} is outside the kernel's range: give "
                              "1000 to 1000000 microseconds, e.g. 10000")
        if not name or "/" in name or name in (".", ".."):
            raise ConfigError(f"cgroup name {name!r} must be one path component, e.g. "
                              "'potluck-straggler-123'")
        if shares is not None and not 2 <= shares <= 262_144:
            raise ConfigError(f"shares={shares} is outside the kernel's range: give 2 to "
                              "262144 (1024 is one ordinary process's weight)")
        self.root, self.path, self.period_us, self.shares = root, root / name, period_us, shares
        self.fraction: float | None = None  # None: no quota

    def __enter__(self) -> CpuQuota:
        self.path.mkdir()
        try:
            _write(self.path / "cpu.cfs_period_us", self.period_us)
            self.set(None)
            if self.shares is not None:
                _write(self.path / "cpu.shares", self.shares)
        except BaseException:
            self.path.rmdir()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.remove()

    @property
    def procs(self) -> Path:
        """Write a pid here to move that whole process (every thread) into the cgroup."""
        return self.path / "cgroup.procs"

    def set(self, fraction: float | None) -> None:
        """Allow ``fraction`` of one core from now on (None: no limit)."""
        least = 1000 / self.period_us  # the kernel's smallest quota is 1 ms per period
        if fraction is not None and not (math.isfinite(fraction) and least <= fraction <= 64):
            raise ConfigError(f"CPU quota {fraction!r} is invalid: give a fraction of one "
                              f"core from {least:g} up, e.g. 0.5 (half a core)")
        quota = -1 if fraction is None else round(fraction * self.period_us)
        _write(self.path / "cpu.cfs_quota_us", quota)
        self.fraction = fraction

    def add(self, pid: int) -> None:
        _write(self.procs, pid)

    def pids(self) -> list[int]:
        try:
            return [int(word) for word in self.procs.read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Move any process left back to the root, then delete the cgroup."""
        if not self.path.exists():
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):  # it may have exited meanwhile
                _write(self.root / "cgroup.procs", pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()


class QuotaSchedule:
    """Sets ``quota`` once ``rank`` has recorded given steps, ``[(after_step, fraction)]``;
    fed each new batch of step records (dicts with ``kind``, ``rank``, ``step``), it
    keeps in ``applied`` when (wall clock) it made each change."""

    def __init__(self, quota: CpuQuota, rank: int,
                 changes: list[tuple[int, float]]) -> None:
        self.quota, self.rank, self.pending = quota, rank, list(changes)
        self.applied: list[tuple[float, float]] = []

    def feed(self, new: list[dict[str, Any]]) -> None:
        for record in new:
            if int(record["rank"]) != self.rank or record["kind"] != "step":
                continue
            while self.pending and int(record["step"]) >= self.pending[0][0]:
                fraction = self.pending.pop(0)[1]
                self.quota.set(fraction)
                self.applied.append((time.time(), fraction))


def _write(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")
