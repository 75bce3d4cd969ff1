"""When a warm spare may lower its CPU priority: only where it can raise it back."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from potluck.launch.priority import autogroup_nice, can_restore


def _has_autogroup() -> bool:
    try:
        return autogroup_nice(Path("/proc/self/autogroup").read_text()) is not None
    except OSError:
        return False

CAP_SYS_NICE = 1 << 23


def test_with_cap_sys_nice_any_priority_comes_back() -> None:
    assert can_restore(-5, capabilities=CAP_SYS_NICE, rlimit_nice=0)


def test_without_it_rlimit_nice_decides() -> None:
    assert not can_restore(0, capabilities=0, rlimit_nice=0)  # the usual unprivileged user
    assert not can_restore(0, capabilities=0, rlimit_nice=19)
    assert can_restore(0, capabilities=0, rlimit_nice=20)  # 20 - nice 0 is within it
    assert can_restore(10, capabilities=0, rlimit_nice=10)
    assert can_restore(0, capabilities=0, rlimit_nice=resource.RLIM_INFINITY)


def test_other_capabilities_do_not_count() -> None:
    assert not can_restore(0, capabilities=CAP_SYS_NICE - 1, rlimit_nice=0)


def test_the_autogroup_nice_value_is_read_from_its_proc_file() -> None:
    assert autogroup_nice("/autogroup-3012 nice 0\n") == 0
    assert autogroup_nice("/autogroup-7 nice -5") == -5
    assert autogroup_nice("/autogroup-7 nice 19\n") == 19
    assert autogroup_nice("") is None  # in no autogroup (off, or a cgroup rules)


_LOWER = ("from potluck.launch import priority; import os; "
          "print(priority.lower_autogroup(), open('/proc/self/autogroup').read().split()[-1]);"
          "priority.restore_autogroup(0) if os.getsid(0) == os.getpid() else None; "
          "print(open('/proc/self/autogroup').read().split()[-1])")


@pytest.mark.skipif(not _has_autogroup(), reason="this kernel puts processes in no autogroup")
def test_only_a_session_leader_lowers_its_autogroup_and_gets_it_back() -> None:
    alone = subprocess.run([sys.executable, "-c", _LOWER], capture_output=True, text=True,
                           start_new_session=True, timeout=60, check=True)
    assert alone.stdout.split() == ["0", "19", "0"]  # its own session's group: lowered
    shared = subprocess.run([sys.executable, "-c", _LOWER], capture_output=True, text=True,
                            timeout=60, check=True)
    assert shared.stdout.split()[0] == "None"  # the session of whoever started it: left
