"""``potluck bench cohort --quick`` as a user runs it (root, network namespaces, cgroup
v1 CPU quotas): four uneven hosts, an attacker, a worker killed and its machine back, a
link throttled, the store's host lost; potluck trains every sample exactly once, its
replicas end equal, the attacker is out within 3 rounds, no namespace or cgroup is left.
The torchrun contender runs in-process on the same hosts and faults. The schedule and
the figures are checked in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from potluck_lab.bench import cohort_figures as fig
from potluck_lab.bench import cohort_report as report
from potluck_lab.bench.cohort import measure
from potluck_lab.bench.cohort_plan import KINDS, QUICK, attack_rounds, due, schedule
from potluck_lab.browser import chromium_path
from potluck_lab.machine.cpu_quota import unavailable as no_quota
from potluck_lab.machine.netns import unavailable
from tests import browser
from tests.e2e.helpers import kill_leftovers

WHY = unavailable() or no_quota()


@pytest.mark.timeout(200)
@pytest.mark.skipif(WHY is not None, reason=f"bench cohort: {WHY}")
def test_quick_cohort_trains_exactly_once_and_quarantines_the_attacker(tmp_path: Path) -> None:
    out_json = tmp_path / "cohort.json"
    bench = subprocess.Popen([sys.executable, "-m", "potluck", "bench", "cohort", "--quick",
                              "--json", str(out_json), "--logs", str(tmp_path / "logs")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        stdout, stderr = bench.communicate(timeout=190)
    finally:
        kill_leftovers([bench])
    assert bench.returncode == 0, stdout[-4000:] + stderr[-3000:]
    figures = json.loads(out_json.read_text())
    assert figures["time_to_target_vs_torchrun"] is None  # (--quick: potluck alone)
    assert figures["exactly_once"] is True, stdout[-3000:]
    assert figures["replicas_equal"] is True, stdout[-3000:]
    assert figures["samples_lost"] == 0
    assert figures["rounds_to_quarantine"] is not None, stdout[-3000:]
    assert 1 <= figures["rounds_to_quarantine"] <= 3, stdout[-3000:]
    potluck = figures["runs"][0]
    assert potluck["halted_at"] is None, stdout[-3000:]  # (it ended within its limit)
    assert potluck["honest_quarantined"] == [], stdout[-3000:]
    assert {f["kind"] for f in potluck["faults"]} == set(KINDS), potluck["faults"]
    # what each fault and link cost, and what a person watching saw
    assert [c["kind"] for c in potluck["fault_costs"]] == [f["kind"] for f in potluck["faults"]]
    assert all(c["busy_s"] > 0 for c in potluck["link_costs"]), potluck["link_costs"]
    assert {"events.png", "compute_wait.png", "loss.png"} <= \
        {Path(p).name for p in potluck["plots"]}, potluck  # (loss: the job reports it)
    shots = {shot["label"]: shot for shot in potluck["status_shots"]}
    assert set(shots) == {"before-store-loss", "after-store-moved"}, shots
    for shot in shots.values():
        if chromium_path() is None:
            assert "no Chromium" in shot["problem"]
        else:  # (its stderr is kept beside the shots when it fails)
            assert shot["path"] is not None, shot
            assert Path(shot["path"]).stat().st_size > 0, shot
            browser.keep_artifact(Path(shot["path"]), f"cohort-{shot['label']}.png")
    assert "Traceback" not in stderr
    # (this run's namespaces: another cohort bench may run beside it)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"pl-coh-{bench.pid % 10000}-" not in left


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


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.skipif(WHY is not None, reason=f"bench cohort: {WHY}")
def test_a_contender_at_its_limit_is_halted_and_what_it_trained_is_checked(
        tmp_path: Path) -> None:
    """The quick run cut to 30 s (it takes about 40): the bench halts it, no fault falls
    after, every worker that ends ends after the same commit, and its figures hold: no
    sample twice, none lost in its whole epochs, the finishers' replicas equal."""
    config = replace(QUICK, limit_s=30.0)
    run = measure(config, tmp_path)["runs"][0]
    assert run["halted_at"] is not None and run["halt_missed"] is False, run
    assert all(f["at_s"] <= run["halted_s"] for f in run["faults"]), run
    workers = fig.read_workers(Path(run["logs"]))
    ends = {w.of("commit")[-1]["steps"] for w in workers
            if any(r["finished"] for r in w.of("done"))}
    assert ends == {run["halted_at"]}, ends
    assert run["exactly_once"] is True and run["samples_twice"] == 0, run
    assert run["replicas_equal"] is True and run["finishers"] >= 2, run
    assert f"halted after commit {run['halted_at']}" in report.line(run)
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "pl-coh-" + str(os.getpid() % 10000) not in spaces


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(WHY is not None, reason=f"bench cohort: {WHY}")
def test_the_torchrun_contender_meets_every_fault_and_its_replicas_end_equal(
        tmp_path: Path) -> None:
    """torchrun + torch DDP on the four hosts, the quick model. torchrun's last call is
    1 s, so that it fits a test. (With keep-alives of 1 s, 2 missed, the machine back
    was not let in within the limit here; cause not found.) Every fault falls, torchrun
    restarts the group after the kill and for the machine back, the harness starts it
    again after the store's host is lost, and the 3 survivors end with equal replicas;
    nothing is left running."""
    config = replace(QUICK, contenders=("torchrun",), torchrun_limit_s=180.0,
                     torchrun_rdzv_conf=("last_call_timeout=1",))
    run = measure(config, tmp_path)["runs"][0]
    logs = Path(run["logs"])
    assert [f["kind"] for f in run["faults"]] == [f.kind for f in schedule(config.seed)], run
    assert run["time_to_target_s"] is not None, run
    assert run["replicas_equal"] is True and run["finishers"] == 3, run
    # the kill, the machine back and the store's host lost each start the group again
    assert run["restarts"] >= 3, run
    assert run["steps_redone"] == sum(f["steps_redone"] for f in run["faults"]), run
    attacker = next(f.node for f in schedule(config.seed) if f.kind == "attack")
    flipped = {p.name.split("-")[0] for p in logs.glob("node*.log")
               if '"attack"' in p.read_text()}
    assert flipped == {f"node{attacker}"}, flipped
    left = subprocess.run(["pgrep", "-f", str(logs)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "pl-coh-" + str(os.getpid() % 10000) not in spaces
