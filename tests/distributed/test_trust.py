"""Trust on 4 Gloo ranks: the clean aggregate is the mean, attacks are survived, a
diverged replica is repaired (the elastic quarantine is in tests/e2e/test_trust_elastic.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from potluck.bench.byzantine_job import ATTACKER, run_rank
from potluck.harness.attacks import ATTACKS, GROSS
from potluck.harness.ranks import free_port, run_ranks

STEPS = 20


def _run(attack: str, trust: bool, steps: int = STEPS, wrap: bool = True,
         spot: int = 0) -> dict[str, Any]:
    spec = {"attack": attack, "trust": trust, "seed": 0, "steps": steps, "wrap": wrap,
            "spot": spot}
    return run_ranks(run_rank, 4, free_port(), spec, init_group=False,  # type: ignore[no-any-return]
                     timeout=120)[0]


def _params(rank: int, world_size: int, port: int, trust: bool,
            flip_after: int | None, batchnorm: bool = False) -> dict[str, Any]:
    import potluck
    from potluck.bench.byzantine_job import GLOBAL_BATCH, data, model
    from potluck.env import WorkerEnv
    from potluck.harness.attacks import flip_bit
    from potluck.trust.fingerprint import fingerprint

    cohort = potluck.init(env=WorkerEnv(rank=rank, world_size=world_size,
                                        master_addr="127.0.0.1", master_port=port,
                                        source="torchrun"), timeout=60.0)
    train, _ = data(8)
    net = model(0)
    if batchnorm:  # each rank's statistics differ until rank 0's are broadcast
        net = torch.nn.Sequential(net[0], torch.nn.BatchNorm1d(net[0].out_features), *net[1:])
    wrapped, opt, loader = potluck.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), train,
        global_batch=GLOBAL_BATCH, cohort=cohort, trust=potluck.Trust() if trust else None)
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(wrapped(xb), yb).backward()
        opt.step()
        if rank == 2 and opt.steps == flip_after:
            flip_bit(net, opt.steps)
    part = opt.part(potluck.trust.TrustPart)
    out = {"params": [p.detach().clone() for p in net.parameters()],
           "fingerprint": fingerprint([p.data for p in net.parameters()]),
           "events": part.events if part is not None else []}
    opt.finish()
    return out


@pytest.mark.timeout(120)
def test_with_no_attacker_the_robust_aggregate_is_the_mean_and_nobody_is_out() -> None:
    plain = run_ranks(_params, 4, free_port(), False, None, init_group=False, timeout=100)
    trusted = run_ranks(_params, 4, free_port(), True, None, init_group=False, timeout=100)
    for got, expected in zip(trusted[0]["params"], plain[0]["params"], strict=True):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert all(r["events"] == [] for r in trusted)
    assert len({r["fingerprint"] for r in trusted}) == 1  # replicas bitwise equal


@pytest.mark.timeout(120)
@pytest.mark.parametrize("batchnorm", [False, True])
def test_a_diverged_replica_is_detected_and_repaired_not_quarantined(batchnorm: bool) -> None:
    results = run_ranks(_params, 4, free_port(), True, 3, batchnorm, init_group=False,
                        timeout=100)
    for r in results:  # every rank saw the same thing
        assert [(e["event"], e["step"], e["members"]) for e in r["events"]] == [
            ("repair", 4, ["rank2"])]
    assert len({r["fingerprint"] for r in results}) == 1  # rank 2 equals the others again


@pytest.mark.timeout(240)
def test_each_attack_is_survived_and_the_gross_ones_quarantined_at_once() -> None:
    clean = _run("none", False)["loss"]
    assert _run("sign_flip", False)["loss"] > 2 * clean  # the plain mean does fail
    for attack in ATTACKS:
        run = _run(attack, True)
        assert run["loss"] <= 1.05 * clean, (attack, run["loss"], clean)
        caught = [e for e in run["events"] if e["event"] == "quarantine"]
        assert all(e["member"] == f"rank{ATTACKER}" for e in caught), (attack, caught)
        if attack in GROSS:
            assert caught, f"{attack}: the attacker was never quarantined"
            assert caught[0]["step"] - run["start"] + 1 <= 3, (attack, caught[0])
            assert caught[0]["evidence"], attack  # quarantine comes with its evidence


@pytest.mark.timeout(120)
def test_spot_checks_catch_a_stale_replay_and_accuse_no_honest_rank() -> None:
    # Every step is checked (a target picked at random among 4): an honest copy
    # recomputes exactly, the stale one (from step 11) is caught within a few checks.
    clean = _run("none", True, steps=40, spot=1)
    assert clean["events"] == []
    run = _run("stale", True, steps=40, spot=1)
    caught = [e for e in run["events"] if e["event"] == "quarantine"]
    assert [e["member"] for e in caught] == [f"rank{ATTACKER}"]
    assert caught[0]["evidence"][0]["kind"] == "wrong gradient"
    assert caught[0]["step"] >= run["start"]
