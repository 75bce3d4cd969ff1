"""When a warm spare may lower its CPU priority: only where it can raise it back."""

from __future__ import annotations

import resource

from potluck.launch.priority import can_restore

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
