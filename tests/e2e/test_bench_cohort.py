"""``potluck bench cohort --quick`` as a user runs it (root, network namespaces, cgroup
v1 CPU quotas): four uneven hosts, an attacker, a worker killed and its machine back, a
link throttled, the store's host lost; potluck trains every sample exactly once, its
replicas end equal, the attacker is out within 3 rounds, no namespace or cgroup is left.
The schedule and the figures are checked in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from potluck_lab.bench.cohort_plan import KINDS, attack_rounds, due, schedule
from potluck_lab.machine.cpu_quota import unavailable as no_quota
from potluck_lab.machine.netns import unavailable

WHY = unavailable() or no_quota()


@pytest.mark.timeout(200)
@pytest.mark.skipif(WHY is not None, reason=f"bench cohort: {WHY}")
def test_quick_cohort_trains_exactly_once_and_quarantines_the_attacker(tmp_path: Path) -> None:
    out_json = tmp_path / "cohort.json"
    run = subprocess.run([sys.executable, "-m", "potluck", "bench", "cohort", "--quick",
                          "--json", str(out_json), "--logs", str(tmp_path / "logs")],
                         capture_output=True, text=True, timeout=190, cwd=tmp_path,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    figures = json.loads(out_json.read_text())
    assert figures["time_to_target_vs_torchrun"] is None  # (--quick: potluck alone)
    assert figures["exactly_once"] is True, run.stdout[-3000:]
    assert figures["replicas_equal"] is True, run.stdout[-3000:]
    assert figures["samples_lost"] == 0
    assert figures["rounds_to_quarantine"] is not None, run.stdout[-3000:]
    assert 1 <= figures["rounds_to_quarantine"] <= 3, run.stdout[-3000:]
    potluck = figures["runs"][0]
    assert potluck["honest_quarantined"] == [], run.stdout[-3000:]
    assert {f["kind"] for f in potluck["faults"]} == set(KINDS), potluck["faults"]
    assert "Traceback" not in run.stderr
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "pl-coh-" not in left


def test_the_faults_fall_in_order_on_three_different_nodes_and_never_on_node_0() -> None:
    for seed in range(50):
        faults = schedule(seed)
        assert [f.at for f in faults] == sorted(f.at for f in faults)
        assert {f.kind for f in faults} == set(KINDS)
        nodes = {f.kind: f.node for f in faults}
        assert nodes["store_host"] == 0
        assert len({nodes["attack"], nodes["kill"], nodes["throttle"]}) == 3
        assert 0 not in (nodes["attack"], nodes["kill"], nodes["throttle"])
        assert nodes["restart"] == nodes["kill"]
        assert all(0 < f.at < 1 for f in faults)
    faults = schedule(0)
    assert due(faults, 0, 0.0) == []
    assert due(faults, 0, 1.0) == faults and due(faults, 2, 1.0) == faults[2:]
    attack = next(f for f in faults if f.kind == "attack")
    first, last = attack_rounds(attack, 60)
    assert 1 <= first < last <= 61 and last - first >= int(0.2 * 60) - 1
