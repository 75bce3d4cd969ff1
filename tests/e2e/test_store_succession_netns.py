"""The job's store outlives its host, on hosts in network namespaces.

Three hosts on a switch (``BridgedHosts``), one ``potluck run --elastic`` agent and one
worker each, the store on host 0. Mid-run host 0 is lost:

- its link is cut (its port on the switch down): host 0's side is one of three, not a
  majority, so it stops with ``NoQuorumError`` and commits no step the others did not;
- its processes are killed (agent, store and worker).

Either way hosts 1 and 2 move the store to node 1, redo the step in flight and finish:
every sample of every epoch trained exactly once, and the final parameters equal one
process on the same global batches (float64). Each test prints the survivors' recovery,
from the failed step seen to the next committed step. Needs root and ``ip netns``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from potluck.testing import exactly_once_problems, free_port
from potluck_lab.machine.netns import BridgedHosts
from potluck_lab.store_host_job import (
    SAMPLES,
    read_traces,
    recovery_s,
    steps_before_failure,
    trained,
)
from tests.e2e.helpers import assert_equal_to_one_process
from tests.e2e.store_hosts import Job, bridged_hosts

EPOCHS = 8
STEPS = SAMPLES // 12  # steps an epoch


@pytest.fixture
def hosts() -> Iterator[BridgedHosts]:
    """Three hosts on a switch; the namespaces are deleted whatever happens."""
    yield from bridged_hosts(3)


def _run_and_lose_host_0(hosts: BridgedHosts, tmp_path: Path, how: str) -> tuple[Job, float]:
    """The job, and when host 0 was lost (wall clock)."""
    job = Job(hosts, tmp_path, free_port(), EPOCHS)
    try:
        job.start()
        job.wait_for(lambda: "epoch 1 done" in job.text(0) + job.text(1) + job.text(2))
        lost_at = time.time()
        if how == "cut":
            hosts.cut(0)
        else:
            job.kill(0)
        for n in (1, 2):
            assert job.wait(n, 120) == 0, job.text(n)[-3000:]
        if how == "cut":
            job.wait(0, 60)
    finally:
        job.close()
    return job, lost_at


def _check_survivors(job: Job, lost_at: float) -> None:
    for n in (1, 2):
        text = job.text(n)
        assert "it moved to node 1 at " in text, text[-3000:]
        for noise in ("frame #", "Exception raised from", "Traceback"):
            assert noise not in text, f"{noise!r} on node {n}:\n{text[-3000:]}"
    traces = read_traces(job.trace)
    finished = [t for t in traces if t.node in (1, 2)]
    assert [t.last_step for t in finished] == [EPOCHS * STEPS] * 2
    assert exactly_once_problems(trained(job.trace), SAMPLES, EPOCHS) == []
    for trace in finished:
        assert trace.params is not None, f"node {trace.node} saved no parameters"
        assert_equal_to_one_process(trace.params, EPOCHS)
    first, second = (torch.load(t.params) for t in finished if t.params is not None)
    assert all(torch.equal(first[k], second[k]) for k in first)  # the replicas, bit for bit
    for trace in finished:
        resumed = min(at for _, at in trace.commits if at > trace.failures[0][1])
        print(f"node {trace.node}: step {trace.failures[0][0]} failed "
              f"{trace.failures[0][1] - lost_at:.2f} s after host 0 was lost; "
              f"{recovery_s(trace):.2f} s from there to the next committed step "
              f"({resumed - lost_at:.2f} s after the loss)")


@pytest.mark.timeout(300)
def test_host_0_cut_off_stops_and_the_others_move_the_store_and_finish(
        hosts: BridgedHosts, tmp_path: Path) -> None:
    job, lost_at = _run_and_lose_host_0(hosts, tmp_path, "cut")
    _check_survivors(job, lost_at)
    text = job.text(0)
    assert job.nodes[0].returncode != 0, text[-3000:]
    assert "NoQuorumError" in text, text[-3000:]
    traces = read_traces(job.trace)
    cut_off = [t for t in traces if t.node == 0]
    together = min(steps_before_failure(t) for t in traces if t.node != 0)
    # host 0 commits no step the other two did not commit with it before the cut
    assert cut_off and all(t.last_step <= together for t in cut_off), (together, text[-3000:])
    last = max(at for t in cut_off for _, at in t.commits)
    print(f"host 0: last committed step {cut_off[0].last_step} at {last - lost_at:+.2f} s "
          f"from the cut; the others committed {together} together before their failure")


@pytest.mark.timeout(300)
def test_host_0_killed_the_others_move_the_store_and_finish(
        hosts: BridgedHosts, tmp_path: Path) -> None:
    job, lost_at = _run_and_lose_host_0(hosts, tmp_path, "kill")
    _check_survivors(job, lost_at)
