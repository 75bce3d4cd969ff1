"""A pytest plugin that starts the longest tests first, on every xdist worker.

pytest-xdist's ``worksteal`` hands worker *i* the *i*-th contiguous slice of the
collection, and an idle worker then steals from the end of another's queue. A long test
late in the order ends the run alone on one worker while the other idles. So the tests
``LONG`` names (a measured duration each, on the 2-core CI machine) go first, dealt to
the slices so that each worker's known seconds are about even; the rest keep their
collection order behind them. Without xdist the long ones just go first.

A prefix of a test id matches every test below it (a module, a parametrized test).
Refresh the figures from ``pytest --durations=60`` when a long test changes.
"""

from __future__ import annotations

import pytest

# Seconds on CI (2 cores, 2 workers), longest first. The first six are from a CI run;
# the others scaled from a run on a loaded machine (its seconds / 7).
LONG: dict[str, float] = {
    "tests/e2e/test_partition_netns.py::": 55,
    "tests/e2e/test_store_succession_netns.py::test_host_0_cut": 50,
    "tests/e2e/test_elastic_etcd.py::test_losing_node_0": 50,
    "tests/e2e/test_elastic_lost_node.py::test_a_half": 43,
    "tests/e2e/test_bench_byzantine_rounds.py::": 40,
    "tests/e2e/test_resume.py::test_sigkilled_job_resumes_bitwise": 35,
    "tests/e2e/test_store_succession_netns.py::test_host_0_killed": 35,
    "tests/e2e/test_demo.py::test_quick_demo_trains_reports_and_resumes_exactly": 34,
    "tests/e2e/test_bench_faults.py::test_quick_run": 24,
    "tests/e2e/test_demo_chaos.py::test_chaos_demo_kills": 23,
    "tests/e2e/test_bench_chaos_store_host.py::": 21,
    "tests/e2e/test_gpu_check.py::test_the_rehearsal": 20,
    "tests/e2e/test_demo_wan.py::test_wan_demo": 20,
    "tests/distributed/test_link_down.py::test_link_down_survivors": 20,
    "tests/e2e/test_elastic_etcd.py::test_two_nodes": 15,
    "tests/e2e/test_example_cohort.py::test_the_cohort_example_trains_with_every_mode_on": 12,
    "tests/e2e/test_elastic_lost_node.py::test_the_end": 10,
}


def estimate(nodeid: str) -> float:
    """The measured seconds of the longest prefix of ``nodeid`` in ``LONG`` (0: short)."""
    found = [prefix for prefix in LONG if nodeid.startswith(prefix)]
    return LONG[max(found, key=len)] if found else 0.0


def slices(sizes: list[int], weights: list[float]) -> list[list[int]]:
    """Indices into ``weights`` (a collection order) cut into slices of ``sizes``: the
    weighed ones first, heaviest first, each to the slice with the least weight so far
    that still has room; the rest fill the slices in their order."""
    heavy = sorted((i for i, w in enumerate(weights) if w > 0), key=lambda i: -weights[i])
    cut: list[list[int]] = [[] for _ in sizes]
    load = [0.0] * len(sizes)
    for i in heavy:
        room = [s for s in range(len(sizes)) if len(cut[s]) < sizes[s]]
        best = min(room, key=lambda s: load[s])
        cut[best].append(i)
        load[best] += weights[i]
    rest = iter(i for i, w in enumerate(weights) if w <= 0)
    for s, size in enumerate(sizes):
        cut[s].extend(next(rest) for _ in range(size - len(cut[s])))
    return cut


def worksteal_sizes(count: int, workers: int) -> list[int]:
    """How many of ``count`` tests xdist first hands each of ``workers`` (in order)."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    weights = [estimate(item.nodeid) for item in items]
    order = slices(worksteal_sizes(len(items), workers), weights)
    items[:] = [items[i] for part in order for i in part]
