"""Nodes with different ``--nproc-per-node``: ranks follow every node's worker count
(the agents tell each other at their meeting), so the job just works; what cannot work
fails at once naming both values. Two agents on this machine, on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from potluck.testing import free_port
from tests.e2e.helpers import ROOT, SCRIPTS, kill_leftovers


def _nodes(*per_node: tuple[int, int], extra: tuple[str, ...] = (),
           script: str = str(SCRIPTS / "torchrun_style.py"), args: tuple[str, ...] = (),
           ) -> list[tuple[int, str, str]]:
    """Start one agent per (node rank, nproc); their exit codes and outputs."""
    port = str(free_port())
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nnodes", "2", "--node-rank",
             str(node), "--nproc-per-node", str(nproc), "--master-port", port,
             "--join-timeout", "30", *extra, script, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for node, nproc in per_node
    ]
    try:
        outputs = [agent.communicate(timeout=60) for agent in agents]
    finally:
        kill_leftovers(agents)
    return [(agent.returncode, out, err)
            for agent, (out, err) in zip(agents, outputs, strict=True)]


@pytest.mark.timeout(90)
def test_two_workers_and_one_make_a_world_of_three_and_a_duplicate_node_is_refused() -> None:
    # node 1 is started twice: one of the two is refused at once, the other joins in
    (code0, out0, err0), *second = _nodes((0, 2), (1, 1), (1, 1))
    refused = [err for code, _, err in second
               if code == 2 and "already started with --node-rank 1" in err]
    joined = [(code, out, err) for code, out, err in second if code != 2]
    assert len(refused) == 1 and len(joined) == 1, second
    (code1, out1, err1), = joined
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    # ranks 0, 1, 2 each add rank + 1: 6 on every rank, in a world of 3
    assert sorted(out0.splitlines()) == ["[rank0]: sum 6 world 3", "[rank1]: sum 6 world 3"]
    assert out1.splitlines() == ["[rank2]: sum 6 world 3"]


@pytest.mark.timeout(90)
def test_founding_elastic_nodes_with_different_counts_fail_naming_both(
        tmp_path: Path) -> None:
    release = tmp_path / "release"  # node 0's workers wait for it: its store stays up
    port = str(free_port())

    def agent(node: int, nproc: int, *script: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "potluck", "run", "--nnodes", "2", "--node-rank",
             str(node), "--nproc-per-node", str(nproc), "--master-port", port,
             "--join-timeout", "30", "--elastic", "--token", "s3cret-token", *script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)

    first = agent(0, 2, str(SCRIPTS / "wait_for_file.py"), str(release))
    started = [first]
    try:
        second = agent(1, 1, str(SCRIPTS / "say_rank.py"))
        started.append(second)
        _, err1 = second.communicate(timeout=60)
        release.touch()
        first.communicate(timeout=60)
    finally:
        kill_leftovers(started)
    assert second.returncode == 2, err1
    assert "--nproc-per-node 1 on node 1, but node 0 runs 2" in err1


@pytest.mark.timeout(90)
def test_a_late_elastic_node_may_run_any_count_and_numbers_after_node_0(
        tmp_path: Path) -> None:
    token = ("--elastic", "--token", "s3cret-token")
    (code0, out0, err0), (code1, out1, err1) = _nodes(
        (0, 2), (1, 1), extra=("--nnodes", "1:2", *token),
        script=str(SCRIPTS / "meet_in_dir.py"), args=(str(tmp_path), "3"))
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert sorted(out0.splitlines()) == [
        f"[worker{r}]: out from local rank {r} (RANK {r} of WORLD_SIZE 4)" for r in (0, 1)]
    # after node 0's two: rank 2, and a world size that holds it (torch checks RANK < it)
    assert out1.splitlines() == ["[worker2]: out from local rank 0 (RANK 2 of WORLD_SIZE 3)"]
