"""Trust with a codec on 4 Gloo ranks: ``prepare(trust=Trust(), comm_hook=
CompressedSum(Int8Blockwise()))``. Honest ranks stay equal, land near plain trust and
nobody is quarantined; a gross attacker is still out within a few steps; fewer bytes
go on the wire. The lanes' own rules (sizes, error feedback) are checked first, pure."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from potluck.compress import Bf16, ErrorFeedback, Fp16, Int4Blockwise, Int8Blockwise, TopK
from potluck.errors import ConfigError
from potluck.testing import free_port, run_ranks
from potluck.trust.lanes import Coded, laid_out, lanes_for

STEPS = 40


# ------------------------------------------------------------------ the lanes, pure

def _take() -> Any:
    return lambda name, numel: torch.empty(numel)


def test_an_owner_decodes_each_copy_as_its_sender_encoded_it() -> None:
    lanes = Coded(Int8Blockwise(block=16), None)
    flat = torch.randn(50, generator=torch.Generator().manual_seed(1))
    owners, piece = 3, 17
    width = lanes.width(piece, flat.dtype)
    rows = torch.full((owners, width + 2), 7.0)[:, :width]  # (strided, as in the lanes)
    lanes.lay_out(0, flat, rows, piece, _take())
    decoded = lanes.copies(rows, piece)
    codec = Int8Blockwise(block=16)
    expected = laid_out(flat, torch.empty(owners, piece))
    for k in range(owners):
        assert torch.equal(decoded[k], codec.decode(codec.encode(expected[k]), piece,
                                                     torch.float32))
    assert (decoded - expected).abs().max() <= expected.abs().max() / 127  # one step


def test_error_feedback_sends_what_the_codec_dropped_next_time() -> None:
    lanes = Coded(Int8Blockwise(block=8), ErrorFeedback())
    flat = torch.tensor([1.0, 0.004, -0.003] * 4)
    total = torch.zeros(12)
    for _ in range(200):  # the small values travel once their residual adds up
        rows = torch.empty(2, lanes.width(6, flat.dtype))
        lanes.begin()
        lanes.lay_out(0, flat, rows, 6, _take())
        lanes.commit()
        total += lanes.copies(rows, 6).reshape(-1)[:12]
    assert torch.allclose(total / 200, flat, rtol=0.05, atol=1e-5)


def test_a_step_that_never_commits_leaves_the_residual_as_it_was() -> None:
    feedback = ErrorFeedback()
    lanes = Coded(Int8Blockwise(block=8), feedback)
    flat = torch.tensor([1.0, 0.004] * 4)
    lanes.begin()
    lanes.lay_out(0, flat, torch.empty(1, lanes.width(8, flat.dtype)), 8, _take())
    lanes.commit()
    kept = feedback.residual("bucket0")
    assert kept is not None and bool(kept.abs().sum() > 0)
    lanes.begin()  # a pass whose step fails (a lost peer): redone, not committed
    lanes.lay_out(0, flat * 3, torch.empty(1, lanes.width(8, flat.dtype)), 8, _take())
    lanes.rollback()
    assert feedback.residual("bucket0") is kept


def test_a_non_finite_copy_leaves_no_residual_behind() -> None:
    feedback = ErrorFeedback()
    lanes = Coded(Int8Blockwise(block=4), feedback)
    flat = torch.tensor([1.0, float("nan"), 0.5, 0.25])
    rows = torch.empty(1, lanes.width(4, flat.dtype))
    lanes.lay_out(0, flat, rows, 4, _take())
    assert not bool(torch.isfinite(lanes.copies(rows, 4)).all())  # the owner sees it
    assert feedback.residual("bucket0") is None  # and the next step's copy is clean


def test_a_codec_whose_size_depends_on_the_data_is_refused_with_the_rule() -> None:
    class Sparse:
        name, summable, dense = "sparse", False, False

        def encode(self, flat: torch.Tensor) -> torch.Tensor:
            return flat[flat != 0]

        def decode(self, payload: torch.Tensor, numel: int,
                   dtype: torch.dtype) -> torch.Tensor:
            return payload.to(dtype)

        def nbytes(self, numel: int) -> int:
            return 4 * numel

    with pytest.raises(ConfigError, match="depends only on the number of values"):
        lanes_for(Sparse())  # type: ignore[arg-type]
    assert lanes_for(Fp16()).coded and not lanes_for(None).coded


def _refusal(trust: Any, hook: Any) -> str | None:
    from potluck.compose.parts import choose

    try:
        choose(sync=None, balance=False, launcher_balance=False, shares=None, weight=None,
               trust=trust, elastic=False, max_micro_batch=None,
               data_parallel={"comm_hook": hook})
    except ConfigError as refused:
        return str(refused)
    return None


def test_the_table_lets_only_a_compressed_sum_through_and_spot_checks_with_a_rounding_codec(
        ) -> None:
    from potluck import Trust
    from potluck.compress import CompressedSum
    from potluck.trust import SpotCheck

    class Summing:  # a summing hook of the user's own
        prescaled = True

        def __call__(self, state: Any, bucket: Any) -> Any:
            raise AssertionError("never called")

    assert _refusal(Trust(), CompressedSum(Int8Blockwise())) is None
    other = _refusal(Trust(), Summing())
    assert other is not None and "other than CompressedSum(codec)" in other
    check = Trust(spot_check=SpotCheck(lambda model, batch: model(batch).sum()))
    assert _refusal(check, CompressedSum(Int8Blockwise())) is None  # (it rounds each value)
    spot = _refusal(check, CompressedSum(TopK(0.1)))
    assert spot is not None and "top-k bounds no value's" in spot


# ------------------------------------------------------------------ 4 ranks on Gloo

def _run(rank: int, world_size: int, port: int, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec``: codec (bool), attack (a name or "none"), steps, spot (a spot check
    every K steps; 0: none)."""
    import logging

    import potluck
    from potluck.compress import CompressedSum
    from potluck.trust import part as trust_part
    from potluck.trust.fingerprint import fingerprint
    from potluck_lab.attacks import Attack
    from potluck_lab.bench.byzantine_job import (
        ATTACKER,
        GLOBAL_BATCH,
        data,
        join,
        model,
        spot_loss,
    )

    logging.getLogger("potluck").setLevel(logging.ERROR)
    cohort = join(rank, world_size, port)
    train, (hx, hy) = data(spec["steps"])
    net = model(0)
    hook = {"comm_hook": CompressedSum(Int8Blockwise())} if spec["codec"] else {}
    every = spec.get("spot", 0)
    checks: list[float] = []  # this owner's spot checks' differences
    check = trust_part.TrustPart._spot_check

    def counted(self: Any, *args: Any) -> Any:
        result = check(self, *args)
        if result is not None:
            checks.append(result.difference)
        return result

    trust_part.TrustPart._spot_check = counted  # type: ignore[method-assign]
    trust = potluck.Trust(spot_check=potluck.trust.SpotCheck(spot_loss, every=every)
                          if every else None)
    wrapped, opt, loader = potluck.prepare(
        net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9), train,
        global_batch=GLOBAL_BATCH, seed=0, cohort=cohort, trust=trust, **hook)
    part = opt.part(potluck.trust.TrustPart)
    assert part is not None and part.exchange.lanes.coded == spec["codec"]
    attack = Attack(part.exchange, spec["attack"], rank == ATTACKER)
    wrapped.register_comm_hook(None, attack)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(wrapped(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        loss = float(nn.functional.cross_entropy(net(hx), hy))
    out = {"params": [p.detach().clone() for p in net.parameters()],
           "fingerprint": fingerprint([p.data for p in net.parameters()]),
           "events": part.events, "loss": loss, "sent": part.exchange.traffic.sent,
           "strikes": [e.kind for e in part.strikes.evidence], "start": attack.starts_at(),
           "checks": checks}
    opt.finish()
    return out


def _ranks(codec: bool, attack: str = "none", steps: int = STEPS,
           spot: int = 0) -> list[dict[str, Any]]:
    spec = {"codec": codec, "attack": attack, "steps": steps, "spot": spot}
    return run_ranks(_run, 4, free_port(), spec, init_group=False,  # type: ignore[no-any-return]
                     timeout=150)


@pytest.mark.timeout(300)
def test_honest_ranks_through_int8_stay_equal_near_plain_trust_with_fewer_bytes() -> None:
    coded, plain = _ranks(True), _ranks(False)
    assert len({r["fingerprint"] for r in coded}) == 1  # replicas bitwise equal
    assert all(r["events"] == [] for r in coded)  # nobody quarantined, nothing repaired
    # Honest copies carry the codec's noise alike: a far step stays rare.
    assert sum(r["strikes"].count("far from the center") for r in coded[:1]) <= 2
    got = torch.cat([p.reshape(-1) for p in coded[0]["params"]])
    ref = torch.cat([p.reshape(-1) for p in plain[0]["params"]])
    start = torch.cat([p.detach().reshape(-1) for p in _initial()])
    # The codec's error is fed back, so the run lands where plain trust does, up to a
    # small part of how far training moved the parameters.
    assert float((got - ref).norm()) <= 0.01 * float((ref - start).norm())  # (0.0015)
    assert math.isclose(coded[0]["loss"], plain[0]["loss"], rel_tol=0.02)
    # Copies travel as int8, the aggregates as they are, and an audited step (every
    # step but the first, at audit_every=1) carries the audited owner's copies, encoded:
    # per rank, (c + 1 + c) / 3 of plain trust's bytes, c = int8's bytes over float32's.
    c = Int8Blockwise().nbytes(256) / (4 * 256)
    ratio = coded[0]["sent"] / plain[0]["sent"]
    assert abs(ratio - (1 + 2 * c) / 3) < 0.02, (coded[0]["sent"], plain[0]["sent"])


def _initial() -> list[torch.Tensor]:
    from potluck_lab.bench.byzantine_job import model

    return list(model(0).parameters())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("attack", ["sign_flip", "noise"])
def test_a_gross_attacker_through_the_codec_is_quarantined_and_the_model_holds(
        attack: str) -> None:
    from potluck_lab.bench.byzantine_job import ATTACKER

    clean = _ranks(True, steps=20)[0]["loss"]
    results = _ranks(True, attack, steps=20)
    run = results[0]
    caught = [e for e in run["events"] if e["event"] == "quarantine"]
    assert [e["member"] for e in caught] == [f"rank{ATTACKER}"], caught
    assert caught[0]["step"] - run["start"] + 1 <= 3, caught[0]
    assert run["loss"] <= 1.05 * clean, (run["loss"], clean)
    honest = [r["fingerprint"] for i, r in enumerate(results) if i != ATTACKER]
    assert len(set(honest)) == 1


@pytest.mark.timeout(300)
def test_spot_checks_through_int8_clear_honest_copies_and_catch_alie() -> None:
    # Every step checked (a target picked among 4). An honest copy is off from its
    # recomputed gradient by the codec's rounding, this step's and the last step's
    # residual; beyond that allowance only float rounding is left.
    from potluck_lab.bench.byzantine_job import ATTACKER

    clean = _ranks(True, steps=30, spot=1)
    assert all(r["events"] == [] for r in clean)
    checks = [d for r in clean for d in r["checks"]]
    assert len(checks) >= 40, len(checks)  # (3 owners check each step but the first)
    assert max(checks) < 1e-5, max(checks)  # the tolerance is 1e-3
    run = _ranks(True, "alie", steps=30, spot=1)
    caught = [e for e in run[0]["events"] if e["event"] == "quarantine"]
    assert [e["member"] for e in caught] == [f"rank{ATTACKER}"]
    assert caught[0]["evidence"][0]["kind"] == "wrong gradient"


@pytest.mark.parametrize("codec", [Int8Blockwise(16), Int4Blockwise(16), Fp16(), Bf16()],
                         ids=lambda c: c.name)
def test_a_codec_bounds_each_values_rounding_from_the_decoded_values_alone(codec: Any) -> None:
    gen = torch.Generator().manual_seed(3)
    for trial in range(30):
        flat = torch.randn(500, generator=gen) * 10.0 ** (trial % 9 - 6)
        flat[::37] *= 100  # outliers: each costs precision in its own block only
        decoded = codec.decode(codec.encode(flat), 500, torch.float32)
        assert bool(((flat - decoded).abs() <= codec.rounding(decoded)).all()), trial
    assert not isinstance(TopK(0.1), __import__("potluck").compress.Bounded)


def test_a_payload_whose_scale_claims_more_than_its_codes_use_gains_no_allowance() -> None:
    codec = Int8Blockwise(block=4)
    payload = codec.encode(torch.tensor([1.0, 0.5, -0.25, 0.0]))
    payload[:4] = torch.tensor([1000.0]).view(torch.uint8)  # the scale, inflated
    payload[4:] = 0  # every code zero: the copy claims nothing was sent
    decoded = codec.decode(payload, 4, torch.float32)
    assert torch.equal(codec.rounding(decoded), torch.zeros(4))
