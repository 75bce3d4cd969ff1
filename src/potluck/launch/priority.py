"""A warm spare's CPU priority: the lowest while it waits, its own again once it works.

A spare imports torch while the job trains; on a machine whose cores the workers keep
busy that import would slow them, so it runs at nice 19 and takes only idle time. An
unprivileged process may lower its priority but not raise it back, so it is lowered only
where it can be restored: with ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` that allows it
(``can_restore`` is that rule, pure), and only after a throwaway thread proved it (in a
user namespace ``CapEff`` may list the capability while the kernel refuses). Linux keeps
a nice value per thread, so restoring walks every thread of the process.

A nice value only ranks a process against others of its scheduling group. With the
kernel's autogroups (``/proc/sys/kernel/sched_autogroup_enabled``, on in most
distributions) every session is a group of its own, and the groups share the CPU as
equals: the agent starts each worker and the spare in a session of its own, so at nice
19 alone the spare still takes a quarter of two cores from three busy workers (their
steps 30-50% slower for the 2 s of its import, measured on a 2-core VM). The spare
therefore also sets the autogroup of its Unix session (``setsid``) to nice 19
(``/proc/self/autogroup``), only when it leads that session (the group is then itself
alone), and sets it back when it is taken. The
kernel lets anyone raise an autogroup's nice value and lower it back to 0 or more, but
refuses (``EAGAIN``) a second write within 100 ms of any other on the machine to a
process without ``CAP_SYS_ADMIN``: such a write is tried again after that interval.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import sys
import threading
import time

LOWEST = 19
_CAP_SYS_NICE = 23
_AUTOGROUP = "/proc/self/autogroup"
_AUTOGROUP_LINE = re.compile(r"^/autogroup-\d+ nice (-?\d+)$")
_AUTOGROUP_INTERVAL = 0.1  # s: the kernel's HZ / 10 between two writes, machine-wide
_AUTOGROUP_TRIES = 20


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


def autogroup_nice(text: str) -> int | None:
    """The nice value in ``/proc/PID/autogroup``'s text; None when the process is in no
    autogroup (the file is empty: autogroups off, or a cgroup's CPU controller rules)."""
    match = _AUTOGROUP_LINE.match(text.strip())
    return int(match.group(1)) if match else None


def lower_autogroup() -> int | None:
    """The autogroup of this process's Unix session to nice 19, if this process leads
    the session and the group's value is one it may come back to (0 or more); returns
    the value to restore (None: left as it was)."""
    if not sys.platform.startswith("linux") or os.getsid(0) != os.getpid():
        return None
    try:
        with open(_AUTOGROUP) as file:
            nice = autogroup_nice(file.read())
    except OSError:  # a kernel without autogroups
        return None
    if nice is None or nice < 0 or nice >= LOWEST:
        return None
    try:
        _write_autogroup(LOWEST)
    except OSError:
        return None
    return nice


def restore_autogroup(nice: int) -> None:
    """The autogroup of this process's Unix session back to ``nice`` (raises OSError if
    the kernel refuses)."""
    _write_autogroup(nice)


def _write_autogroup(nice: int) -> None:
    for attempt in range(_AUTOGROUP_TRIES):
        try:
            with open(_AUTOGROUP, "w") as file:
                file.write(str(nice))
            return
        except OSError as exc:
            if exc.errno != errno.EAGAIN or attempt + 1 == _AUTOGROUP_TRIES:
                raise
            time.sleep(_AUTOGROUP_INTERVAL)  # another write on the machine within 100 ms


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
