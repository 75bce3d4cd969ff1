"""A CPU quota for some processes: a cgroup (v1 ``cpu`` controller) of their own.

    with CpuQuota("potluck-straggler-123", period_us=10_000, shares=16384) as quota:
        quota.set(0.5)  # half of one core, whatever the number of threads
        ...             # a process moves itself in: join(quota.path)

``create`` makes ``/sys/fs/cgroup/cpu/<name>`` (``cpu.cfs_period_us``, ``cpu.cfs_quota_us``
and, if given, ``cpu.shares``); ``remove`` moves whatever is still inside back to the
parent and deletes the group; the context manager does both, also after an error or
Ctrl-C. A short period (10 ms) throttles smoothly: the processes run ``fraction *
period`` of every period, so a step of tens of milliseconds sees its fraction, not a
burst and a stall. ``shares`` weighs the group against the machine's other processes
(one ordinary process weighs 1024). ``join`` moves a whole process (every thread, and
those it starts later) into a group, ``leave`` back out; ``throttling`` reads what the
quota held back (``cpu.stat``); ``remove_stale`` deletes groups a killed owner left
behind. ``unavailable()`` says why no quota can be had here, or None.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from potluck.errors import ConfigError, PotluckError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # where cgroup v1 mounts its CPU controller
MIN_QUOTA_US = 1000  # the kernel's smallest quota (and period): 1 ms
MAX_FRACTION = 64.0  # cores; a sanity bound, far above any machine these run on

logger = logging.getLogger(__name__)


class CgroupError(PotluckError):
    """A cgroup could not be made, joined, set or removed; the message says which and why."""


@dataclass(frozen=True)
class Throttling:
    """A group's ``cpu.stat``: scheduler periods run, those held back, time held back."""

    periods: int
    throttled: int
    throttled_s: float


def unavailable(root: Path = CPU_ROOT) -> str | None:
    """Why no CPU quota can be set here (one line, with the fix), or None if it can."""
    if not (root / "cpu.cfs_quota_us").is_file():
        return (f"no cgroup v1 CPU controller at {root} (no cpu.cfs_quota_us there: cgroup "
                f"v2 only, or no cpu controller mounted); mount one with: mount -t cgroup "
                f"-o cpu cgroup {root}")
    if os.geteuid() != 0:
        return (f"not running as root (uid {os.geteuid()}): making a cgroup under {root} "
                "needs root; run it as root (e.g. sudo, or in a container as root)")
    if not os.access(root, os.W_OK):
        return (f"{root} is not writable (a read-only cgroup mount, or a container without "
                "write access to its cgroups): remount it read-write")
    return None


def quota_us(fraction: float | None, period_us: int) -> int:
    """``cpu.cfs_quota_us`` for ``fraction`` of one core (None: -1, no limit); at least
    the kernel's 1 ms. ConfigError for a fraction that is not a positive number."""
    if fraction is None:
        return -1
    if not (math.isfinite(fraction) and 0 < fraction <= MAX_FRACTION):
        raise ConfigError(f"CPU quota {fraction!r} is invalid: give a fraction of one core "
                          f"above 0 (at most {MAX_FRACTION:g}), e.g. 0.5 (half a core)")
    return max(MIN_QUOTA_US, round(fraction * period_us))


def parse_cpu_stat(text: str) -> Throttling:
    """``cpu.stat``'s ``nr_periods``, ``nr_throttled`` and ``throttled_time`` (ns)."""
    fields = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
    return Throttling(periods=int(fields.get("nr_periods", 0)),
                      throttled=int(fields.get("nr_throttled", 0)),
                      throttled_s=int(fields.get("throttled_time", 0)) / 1e9)


def join(group: Path, pid: int = 0) -> None:
    """Move process ``pid`` (0: this one), all its threads, into ``group``."""
    pid = pid or os.getpid()
    try:
        _write(group / "cgroup.procs", pid)
    except OSError as exc:
        raise CgroupError(f"could not move pid {pid} into the cgroup {group}: {exc}; is the "
                          "process that made the group still running?") from exc


def leave(group: Path, pid: int = 0) -> None:
    """Move process ``pid`` (0: this one) back into ``group``'s parent."""
    join(group.parent, pid)


class CpuQuota:
    """A cgroup whose processes get ``fraction`` of one core: ``quota_us`` of CPU time in
    every ``period_us`` (``quota_us`` None: no limit)."""

    def __init__(self, name: str, *, period_us: int = 10_000, shares: int | None = None,
                 root: Path = CPU_ROOT) -> None:
        """Nothing is made until ``create`` (or ``with``). ``shares``: the group's CPU
        weight against other processes (1024 is one ordinary process's; more: they wait
        while these run)."""
        if not MIN_QUOTA_US <= period_us <= 1_000_000:
            raise ConfigError(f"period_us={period_us} is outside the kernel's range: give "
                              "1000 to 1000000 microseconds, e.g. 10000")
        if not name or "/" in name or name in (".", ".."):
            raise ConfigError(f"cgroup name {name!r} must be one path component, e.g. "
                              "'potluck-straggler-123'")
        if shares is not None and not 2 <= shares <= 262_144:
            raise ConfigError(f"shares={shares} is outside the kernel's range: give 2 to "
                              "262144 (1024 is one ordinary process's weight)")
        self.path, self.period_us, self.shares = root / name, period_us, shares
        self.quota_us: int | None = None

    @property
    def fraction(self) -> float | None:
        """Of one core, as set (after the 1 ms floor); None: no limit."""
        return None if self.quota_us is None else self.quota_us / self.period_us

    def create(self, fraction: float | None = None) -> CpuQuota:
        """Make the group with ``fraction`` of one core (None: no limit); raises
        ConfigError for a bad fraction, CgroupError (leaving nothing behind) if the
        group cannot be made."""
        quota = quota_us(fraction, self.period_us)  # refused before anything is made
        try:
            self.path.mkdir()
        except OSError as exc:  # not ours to delete, if it exists
            raise CgroupError(f"could not make the cgroup {self.path}: {exc}") from exc
        try:
            _write(self.path / "cpu.cfs_period_us", self.period_us)
            _write(self.path / "cpu.cfs_quota_us", quota)
            if self.shares is not None:
                _write(self.path / "cpu.shares", self.shares)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                self.path.rmdir()
            if isinstance(exc, OSError):
                raise CgroupError(f"could not make the cgroup {self.path} with a quota of "
                                  f"{quota} us per {self.period_us} us: {exc}") from exc
            raise
        self.quota_us = None if quota < 0 else quota
        return self

    def __enter__(self) -> CpuQuota:
        return self.create()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            self.remove()
        except CgroupError as exc:
            if kind is None:
                raise
            # The error in flight says more; raising this one would hide it.
            logger.warning("%s", exc)

    def set(self, fraction: float | None) -> None:
        """Allow ``fraction`` of one core from now on (None: no limit)."""
        quota = quota_us(fraction, self.period_us)
        try:
            _write(self.path / "cpu.cfs_quota_us", quota)
        except OSError as exc:
            raise CgroupError(f"could not set the quota of the cgroup {self.path} to {quota} "
                              f"us per {self.period_us} us: {exc}") from exc
        self.quota_us = None if quota < 0 else quota

    def members(self) -> list[int]:
        """The pids inside (none once the group is gone)."""
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def throttling(self) -> Throttling | None:
        """What the quota held back so far; None if the group cannot be read."""
        try:
            return parse_cpu_stat((self.path / "cpu.stat").read_text())
        except OSError:
            return None

    def remove(self, attempts: int = 20) -> None:
        """Move any process still inside back to the parent, then delete the group."""
        error: OSError | None = None
        for _ in range(attempts):
            for pid in self.members():  # a worker not reaped yet, or still exiting
                with contextlib.suppress(OSError):  # it may have exited meanwhile
                    _write(self.path.parent / "cgroup.procs", pid)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:  # EBUSY: a process was still leaving
                error = exc
                time.sleep(0.05)
        raise CgroupError(f"could not remove the cgroup {self.path}: {error}; remove it "
                          f"with: rmdir {self.path}")


def remove_stale(prefix: str, root: Path = CPU_ROOT) -> list[Path]:
    """Remove groups named ``prefix`` + a pid that an earlier run left behind (killed
    before it could clean up): those whose pid is gone and that hold no process.
    Returns what was removed."""
    removed = []
    for group in root.glob(prefix + "*"):
        pid = group.name.removeprefix(prefix)
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if not (group / "cgroup.procs").read_text().split():
                group.rmdir()
                removed.append(group)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")
