"""A cohort split in two by the network: at most one side goes on.

Four hosts on a switch (``BridgedHosts``), one agent and one worker each, the store on
host 0. Mid-run the switch splits them into two islands:

- 2-2, hosts 0 and 1 | 2 and 3: each side is half of the four; the half holding the
  first member (host 0's worker) goes on with the store it has, the other moves the
  store to host 2, finds no quorum and stops (``NoQuorumError``);
- 1-3, host 0 | hosts 1, 2 and 3: the three are a majority and go on, with the store
  moved to host 1; host 0 alone stops.

From the traces: the side that goes on finishes, every sample of every epoch trained
exactly once and the result equals one process; the side that stops commits no step
beyond those the two sides committed together. Needs root and ``ip netns``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from potluck.testing import exactly_once_problems, free_port
from potluck_lab.machine.netns import BridgedHosts
from potluck_lab.store_host_job import SAMPLES, read_traces, steps_before_failure, trained
from tests.e2e.helpers import assert_equal_to_one_process
from tests.e2e.store_hosts import Job, bridged_hosts

EPOCHS = 8
STEPS = SAMPLES // 12  # steps an epoch


@pytest.fixture
def hosts() -> Iterator[BridgedHosts]:
    """Four hosts on a switch; the namespaces are deleted whatever happens."""
    yield from bridged_hosts(4)


@pytest.mark.timeout(360)
@pytest.mark.parametrize(("island", "going_on"), [((2, 3), (0, 1)), ((0,), (1, 2, 3))],
                         ids=["2-2", "1-3"])
def test_of_a_split_cohort_one_side_goes_on_and_the_other_stops(
        hosts: BridgedHosts, tmp_path: Path, island: tuple[int, ...],
        going_on: tuple[int, ...]) -> None:
    job = Job(hosts, tmp_path, free_port(), EPOCHS)
    stopping = [n for n in range(4) if n not in going_on]
    try:
        job.start()
        job.wait_for(lambda: any("epoch 1 done" in job.text(n) for n in range(4)))
        hosts.split(island)
        for n in going_on:
            assert job.wait(n, 150) == 0, job.text(n)[-3000:]
        for n in stopping:
            job.wait(n, 90)
    finally:
        job.close()
    for n in stopping:
        assert job.nodes[n].returncode != 0, job.text(n)[-3000:]
        assert "NoQuorumError" in job.text(n), job.text(n)[-3000:]
    traces = read_traces(job.trace)
    assert sorted(t.node for t in traces) == [0, 1, 2, 3]
    on, off = ([t for t in traces if (t.node in going_on) == side] for side in (True, False))
    assert [t.last_step for t in on] == [EPOCHS * STEPS] * len(on)
    together = min(steps_before_failure(t) for t in on)
    assert all(t.last_step <= together for t in off), (
        together, [(t.node, t.last_step) for t in off])
    assert exactly_once_problems(trained(job.trace), SAMPLES, EPOCHS) == []
    for trace in on:
        assert trace.params is not None, f"node {trace.node} saved no parameters"
        assert_equal_to_one_process(trace.params, EPOCHS)
    print(f"split {island} off: nodes {going_on} went on from step {together}, nodes "
          f"{stopping} stopped at steps {[t.last_step for t in off]}")
