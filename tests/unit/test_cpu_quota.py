"""``machine.cpu_quota``'s pure parts, and its file writes on a fake root (a tmp dir)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from potluck.errors import ConfigError
from potluck_lab.machine.cpu_quota import (
    CgroupError,
    CpuQuota,
    Throttling,
    join,
    parse_cpu_stat,
    quota_us,
    unavailable,
)


@pytest.mark.timeout(10)
def test_cpu_stat_gives_periods_throttled_and_seconds_held_back() -> None:
    stat = "nr_periods 120\nnr_throttled 30\nthrottled_time 1500000000\nnr_bursts 0\n"
    assert parse_cpu_stat(stat) == Throttling(periods=120, throttled=30, throttled_s=1.5)
    assert parse_cpu_stat("") == Throttling(0, 0, 0.0)  # a kernel without the fields


@pytest.mark.timeout(10)
def test_unavailable_says_why_in_the_order_a_user_fixes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    why = unavailable(tmp_path) or ""
    assert why.startswith(f"no cgroup v1 CPU controller at {tmp_path}")
    assert f"mount -t cgroup -o cpu cgroup {tmp_path}" in why  # the fix
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert (unavailable(tmp_path) or "").startswith("not running as root (uid 1000)")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert f"{tmp_path} is not writable" in (unavailable(tmp_path) or "")
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    assert unavailable(tmp_path) is None


@pytest.mark.timeout(10)
def test_a_fraction_of_a_core_is_that_much_of_every_period() -> None:
    assert quota_us(0.4, 10_000) == 4000
    assert quota_us(0.25, 100_000) == 25_000
    assert quota_us(2.0, 10_000) == 20_000  # two cores' worth, for threads
    assert quota_us(None, 10_000) == -1  # no limit
    assert quota_us(0.01, 10_000) == 1000  # the kernel's least: 1 ms per period


@pytest.mark.timeout(10)
@pytest.mark.parametrize("fraction", [0.0, -0.5, math.nan, math.inf, 65.0])
def test_a_bad_fraction_is_refused_with_the_rule_and_an_example(fraction: float) -> None:
    with pytest.raises(ConfigError, match=r"CPU quota .* is invalid: give a fraction of one "
                                          r"core above 0 .* e\.g\. 0\.5"):
        quota_us(fraction, 10_000)


@pytest.mark.timeout(10)
def test_bad_names_periods_and_shares_are_refused_before_anything_is_made(
        tmp_path: Path) -> None:
    for name in ("", "a/b", "..", "."):
        with pytest.raises(ConfigError, match="one path component"):
            CpuQuota(name, root=tmp_path)
    with pytest.raises(ConfigError, match="1000 to 1000000 microseconds"):
        CpuQuota("g", period_us=500, root=tmp_path)
    with pytest.raises(ConfigError, match="2 to 262144"):
        CpuQuota("g", shares=1, root=tmp_path)
    with pytest.raises(ConfigError, match="is invalid"):
        CpuQuota("g", root=tmp_path).create(1e9)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(10)
def test_create_and_set_write_the_group_files(tmp_path: Path) -> None:
    quota = CpuQuota("g", period_us=10_000, shares=16384, root=tmp_path).create(0.4)
    group = tmp_path / "g"
    assert quota.path == group and quota.quota_us == 4000 and quota.fraction == 0.4
    assert (group / "cpu.cfs_period_us").read_text() == "10000\n"
    assert (group / "cpu.cfs_quota_us").read_text() == "4000\n"
    assert (group / "cpu.shares").read_text() == "16384\n"
    quota.set(None)
    assert (group / "cpu.cfs_quota_us").read_text() == "-1\n"
    assert quota.quota_us is None and quota.fraction is None
    quota.set(0.01)  # below 1 ms a period: the kernel's least, and said so
    assert quota.quota_us == 1000 and quota.fraction == 0.1
    assert quota.members() == [] and quota.throttling() is None  # no cgroup.procs, cpu.stat
    (group / "cgroup.procs").write_text("12\n34\n")
    (group / "cpu.stat").write_text("nr_periods 4\nnr_throttled 1\nthrottled_time 0\n")
    assert quota.members() == [12, 34] and quota.throttling() == Throttling(4, 1, 0.0)


@pytest.mark.timeout(10)
def test_failures_to_make_join_or_remove_name_the_group(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match=f"could not make the cgroup {tmp_path}/none/g"):
        CpuQuota("g", root=tmp_path / "none").create()
    CpuQuota("g", root=tmp_path).create()
    with pytest.raises(CgroupError, match=f"could not make the cgroup {tmp_path}/g"):
        CpuQuota("g", root=tmp_path).create()  # someone's group: left alone
    assert (tmp_path / "g" / "cpu.cfs_quota_us").exists()
    with pytest.raises(CgroupError, match=f"could not move pid 7 into the cgroup {tmp_path}/x"):
        join(tmp_path / "x", 7)
    with pytest.raises(CgroupError, match=f"remove it with: rmdir {tmp_path}/g"):
        CpuQuota("g", root=tmp_path).remove(attempts=1)  # a plain dir with files: not empty
    CpuQuota("gone", root=tmp_path).remove()  # nothing there: nothing to do

