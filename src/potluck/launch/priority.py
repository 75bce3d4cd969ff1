"""A warm spare's CPU priority: the lowest while it waits, its own again once it works.

A spare imports torch while the job trains; on a machine whose cores the workers keep
busy that import would slow them, so it runs at nice 19 and takes only idle time. An
unprivileged process may lower its priority but not raise it back, so it is lowered only
where it can be restored: with ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows it
(``can_restore`` is that rule, pure), and only after a throwaway thread proved it (in a
user namespace ``CapEff`` may list the capability while the kernel refuses). Linux keeps
a nice value per thread, so restoring walks every thread of the process.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading

LOWEST = 19
_CAP_SYS_NICE = 23


def can_restore(nice: int, *, capabilities: int, rlimit_nice: int) -> bool:
    """Whether a process back from nice 19 may return to ``nice``: the kernel allows it
    with CAP_SYS_NICE, or when ``20 - nice`` is within the soft RLIMIT_NICE."""
    if capabilities >> _CAP_SYS_NICE & 1:
        return True
    return rlimit_nice == resource.RLIM_INFINITY or 20 - nice <= rlimit_nice


def lower() -> int | None:
    """Nice 19 if this process can come back; returns the nice value to restore (None:
    left as it was)."""
    if not sys.platform.startswith("linux"):
        return None
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if nice >= LOWEST or not can_restore(nice, capabilities=_effective_capabilities(),
                                         rlimit_nice=soft) or not _proven(nice):
        return None
    os.setpriority(os.PRIO_PROCESS, 0, LOWEST)
    return nice


def restore(nice: int) -> None:
    """Every thread of this process back to ``nice``."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _proven(nice: int) -> bool:
    """A thread of its own goes to nice 19 and back to ``nice``: whether it could."""
    result: list[bool] = []

    def probe() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, name="potluck-nice-probe")
    thread.start()
    thread.join()
    return result == [True]


def _effective_capabilities() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0
