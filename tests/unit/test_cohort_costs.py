"""What a fault and a link cost a cohort bench run, from made-up worker records."""

from __future__ import annotations

from typing import Any

from potluck_lab.bench.cohort_costs import Fired, cost_lines, fault_costs, link_costs, timeline
from potluck_lab.bench.cohort_figures import Worker
from potluck_lab.bench.cohort_plan import Fault

T0 = 1000.0


def _worker(node: int, commits: list[tuple[int, float]], *, joined: float = 0.0,
            failed: tuple[float, ...] = ()) -> Worker:
    records: list[dict[str, Any]] = [{"kind": "member", "at": T0 + joined}]
    records += [{"kind": "commit", "steps": s, "at": T0 + at} for s, at in commits]
    records += [{"kind": "failed", "round": 0, "at": T0 + at} for at in failed]
    return Worker(node, records)


def test_a_kill_costs_the_interval_it_stretched_and_the_round_it_redid() -> None:
    # a commit a second; the kill at 4.5 s stretches the next to 8.0 s, one round redone
    steady = [(10 * i, float(i)) for i in range(1, 5)] + [(50, 8.0), (60, 9.0), (70, 10.0)]
    a = _worker(1, steady, failed=(5.0,))
    b = _worker(2, [(s, at + 0.01) for s, at in steady])
    rows = fault_costs([a, b], [Fired(Fault("kill", 3, 0.3), 4.5)], T0)
    assert rows == [{"kind": "kill", "node": 3, "at_s": 4.5, "stall_s": 3.5, "cost_s": 3.0,
                     "redone": 1}]
    assert [at for _, at in timeline([a, b], T0)][:2] == [1.0, 2.0]  # the first to log


def test_a_throttle_reads_the_commits_apart_after_it_and_a_comeback_its_join() -> None:
    before = [(i, float(i)) for i in range(1, 7)]  # one a second
    after = [(6 + i, 6.0 + 2 * i) for i in range(1, 7)]  # one every two seconds
    a = _worker(1, before + after)
    back = _worker(4, [(9, 12.0), (10, 14.0)], joined=10.5)
    rows = fault_costs([a, back], [Fired(Fault("throttle", 2, 0.5, mbit=5), 6.5),
                                   Fired(Fault("restart", 3, 0.6), 9.0)], T0)
    assert rows[0]["slower"] == 2.0
    assert rows[1]["joined_s"] == 3.0
    lines = cost_lines(rows, link_costs([(2_000_000, 500_000)], [10.0], 16.0))
    assert "commits 2.00x apart after it" in lines[0]
    assert "committed 3.0 s after it came back" in lines[1]
    assert lines[2] == ("  link of host 0 (10 Mbit/s): 2.0 MB out, 0.5 MB in, busy 1.6 s "
                        "at least (10% of the run)")


def test_a_fault_after_the_last_commit_has_no_stall() -> None:
    a = _worker(1, [(1, 1.0), (2, 2.0)])
    assert fault_costs([a], [Fired(Fault("store_host", 0, 0.7), 5.0)], T0) == [
        {"kind": "store_host", "node": 0, "at_s": 5.0}]
