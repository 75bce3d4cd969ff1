"""Spares: joiners beyond the wanted size wait, and one comes in when a member leaves;
``potluck run``'s population flags refuse bad values; the bench's figures (pure)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from torch.distributed import HashStore

from potluck.errors import ConfigError
from potluck.launch.config import LaunchConfig
from potluck.rendezvous.membership import Membership, RendezvousConfig
from potluck.rendezvous.store_rendezvous import StoreRendezvous
from potluck_lab.bench.plan_swap import Commit, compute_figures, swap_figures

CONFIG = RendezvousConfig(token="t", expected=2, max_size=2, heartbeat_interval=0.1,
                          heartbeat_timeout=1.0, join_timeout=15.0, admission_timeout=5.0,
                          poll_interval=0.01)


def _in_threads(*calls: Callable[[], Membership]) -> list[Any]:
    got: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        got[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return got


@pytest.mark.timeout(60)
def test_a_joiner_beyond_the_wanted_size_waits_until_a_member_leaves() -> None:
    store = HashStore()
    a, b, c = (StoreRendezvous(store, name, CONFIG) for name in "abc")
    try:
        first = _in_threads(a.join, b.join)
        assert [m.generation for m in first] == [0, 0]
        spare: list[Membership] = []
        waiting = threading.Thread(target=lambda: spare.append(c.join()))
        waiting.start()
        deadline = time.monotonic() + 10
        while a.pending_joiners() != ["c"]:
            assert time.monotonic() < deadline, "the spare never queued"
            time.sleep(0.02)
        assert a.room() == 0
        same = _in_threads(a.admit, b.admit)  # full: the spare is not admitted
        assert [m.generation for m in same] == [0, 0] and not spare
        b.announce_leave()
        after = a.admit()
        waiting.join(10)
        assert after.generation == 1 and after.members == ("a", "c")
        assert spare and spare[0].members == ("a", "c")
    finally:
        for r in (a, b, c):
            r.close()


@pytest.mark.timeout(5)
def test_a_wanted_size_below_the_founders_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_size=1 must be >= expected=2"):
        RendezvousConfig(token="t", expected=2, max_size=1)


@pytest.mark.timeout(5)
@pytest.mark.parametrize(("fields", "says"), [
    ({"cohort_size": 3}, "only applies to --elastic"),
    ({"elastic": True, "nproc_per_node": 4, "cohort_size": 3}, "below the 4 workers"),
    ({"elastic": True, "nproc_per_node": 2, "swap_drag": 0.3}, "needs --cohort-size"),
    ({"elastic": True, "nproc_per_node": 2, "cohort_size": 2, "swap_drag": 1.5},
     "fraction between 0 and 1"),
    ({"elastic": True, "nproc_per_node": 2, "cohort_size": 2, "swap_drag": 0.3,
      "swap_window": 2}, "at least 4 steps"),
])
def test_bad_population_flags_are_refused_with_the_value_and_a_fix(
        fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        LaunchConfig("t.py", token="t", **fields).validated()


@pytest.mark.timeout(5)
def test_the_bench_figures_read_the_swap_and_the_throughput_from_the_commits() -> None:
    commits = []
    at = 0.0
    for step in range(1, 41):
        at += 0.1 if step <= 20 or step > 26 else 1.0  # throttled after 20, swapped at 26
        for node in (0, 2, 1 if step <= 26 else 3):
            commits.append(Commit(node, step, at + node * 1e-3, 3))
    got = swap_figures(commits, victim_node=1, throttled_after=20, global_batch=100)
    assert got["swap_step"] == 26 and got["swap_after_steps"] == 6
    assert got["healthy_samples_per_s"] == pytest.approx(1000)
    assert got["after_samples_per_s"] == pytest.approx(1000)
    assert got["throughput_ratio_after_vs_healthy"] == pytest.approx(1.0)
    assert got["throttled_samples_per_s"] == pytest.approx(100)


@pytest.mark.timeout(5)
def test_the_bench_reads_the_members_compute_healthy_and_after_the_swap() -> None:
    computes = [(step, 0.002 if step <= 20 else 0.01) for step in range(1, 41)
                for _ in range(3)]
    got = compute_figures(computes, throttled_after=20, swap_step=26)
    assert got == {"compute_ms_healthy": pytest.approx(2.0),
                   "compute_ms_after": pytest.approx(10.0)}
    assert compute_figures(computes, 20, None)["compute_ms_after"] is None
