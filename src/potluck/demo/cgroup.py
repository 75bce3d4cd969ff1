"""A CPU quota for one demo worker: a cgroup v1 ``cpu`` group of its own.

``potluck demo --uneven`` slows one worker to a fraction of a core, so that the balancer
has something to balance on a machine whose cores are alike. ``CpuQuota.create`` makes
``/sys/fs/cgroup/cpu/<name>`` with ``cpu.cfs_quota_us / cpu.cfs_period_us`` equal to
that fraction; the worker moves its whole process in (``join``: ``cgroup.procs`` takes
every thread) before it trains, and back out (``leave``) after; ``remove`` moves
whatever is still inside back to the parent group and deletes the group.
``unavailable`` says why it cannot be done here (no cgroup v1 CPU controller, not root,
not writable), or None. The bench has its own helper (``bench/``); the two are to be
merged.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from potluck.errors import PotluckError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # where cgroup v1 mounts its CPU controller
PREFIX = "potluck-demo-uneven-"  # + the demo's pid: a stale group is found by its pid


class CgroupError(PotluckError):
    """A cgroup could not be made, joined or removed; the message says which and why."""


@dataclass(frozen=True)
class Throttling:
    """A group's ``cpu.stat``: scheduler periods run, those held back, time held back."""

    periods: int
    throttled: int
    throttled_s: float


def unavailable(root: Path = CPU_ROOT) -> str | None:
    """Why no CPU quota can be set here (one line), or None if it can."""
    if not (root / "cpu.cfs_quota_us").exists():
        return (f"no cgroup v1 CPU controller at {root} (cgroup v2 only, or no cpu "
                "controller mounted)")
    if os.geteuid() != 0:
        return f"not running as root (uid {os.geteuid()}): making a cgroup needs root"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable (a container without write access to its cgroups?)"
    return None


def parse_cpu_stat(text: str) -> Throttling:
    """``cpu.stat``'s ``nr_periods``, ``nr_throttled`` and ``throttled_time`` (ns)."""
    fields = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
    return Throttling(periods=int(fields.get("nr_periods", 0)),
                      throttled=int(fields.get("nr_throttled", 0)),
                      throttled_s=int(fields.get("throttled_time", 0)) / 1e9)


def join(group: Path, pid: int = 0) -> None:
    """Move process ``pid`` (0: this one), all its threads, into ``group``."""
    try:
        (group / "cgroup.procs").write_text(f"{pid or os.getpid()}\n")
    except OSError as exc:
        raise CgroupError(f"could not move pid {pid or os.getpid()} into the cgroup {group}: "
                          f"{exc}; is the demo that made it still running?") from exc


def leave(group: Path, pid: int = 0) -> None:
    """Move process ``pid`` (0: this one) back into ``group``'s parent."""
    join(group.parent, pid)


@dataclass(frozen=True)
class CpuQuota:
    """A cgroup whose processes get ``fraction`` of one core: ``quota_us`` of CPU time
    in every ``period_us``."""

    path: Path
    quota_us: int
    period_us: int

    @property
    def fraction(self) -> float:
        return self.quota_us / self.period_us

    @classmethod
    def create(cls, name: str, fraction: float, period_us: int = 10_000,
               root: Path = CPU_ROOT) -> CpuQuota:
        """Make the group ``root/name``; raises CgroupError (and leaves nothing behind)."""
        if not 0.0 < fraction < 1.0:
            raise CgroupError(f"a CPU quota of {fraction!r} of a core is invalid: give a "
                              "fraction between 0 and 1, e.g. 0.4")
        quota = cls(root / name, max(1000, round(fraction * period_us)), period_us)
        try:
            quota.path.mkdir()
            (quota.path / "cpu.cfs_period_us").write_text(f"{period_us}\n")
            (quota.path / "cpu.cfs_quota_us").write_text(f"{quota.quota_us}\n")
        except OSError as exc:
            with contextlib.suppress(OSError):
                quota.path.rmdir()
            raise CgroupError(f"could not make the cgroup {quota.path} with a quota of "
                              f"{quota.quota_us} us per {period_us} us: {exc}") from exc
        return quota

    def members(self) -> list[int]:
        """The pids inside (none once the group is gone)."""
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def throttling(self) -> Throttling | None:
        try:
            return parse_cpu_stat((self.path / "cpu.stat").read_text())
        except OSError:
            return None

    def remove(self, attempts: int = 20) -> None:
        """Move any process still inside back to the parent, then delete the group."""
        error: OSError | None = None
        for _ in range(attempts):
            for pid in self.members():  # a worker the launcher has not reaped yet
                with contextlib.suppress(OSError):
                    (self.path.parent / "cgroup.procs").write_text(f"{pid}\n")
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


def remove_stale(root: Path = CPU_ROOT) -> list[Path]:
    """Remove groups an earlier demo left behind (killed before it could clean up):
    those whose demo pid is gone and that hold no process. Returns what was removed."""
    removed = []
    for group in root.glob(PREFIX + "*"):
        pid = group.name.removeprefix(PREFIX)
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
