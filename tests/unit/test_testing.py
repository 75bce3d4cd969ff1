"""``potluck.testing``'s pure parts: the fault plan and injector, the two checks, the
ledger. The faults on real processes are in tests/distributed/test_faults.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from potluck.errors import ConfigError, PeerLostError
from potluck.group import GroupHandle
from potluck.testing import (
    Faults,
    SampleLedger,
    assert_exactly_once,
    assert_replicas_equal,
    exactly_once_problems,
    read_ledgers,
)
from potluck.testing import faults as faults_module


class _Group:
    """A backend group that counts the collectives issued on it."""

    def __init__(self) -> None:
        self.issued: list[str] = []

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 2

    def allreduce(self, *args: Any, **kwargs: Any) -> str:
        self.issued.append("allreduce")
        return "work"

    def broadcast(self, *args: Any, **kwargs: Any) -> str:
        self.issued.append("broadcast")
        return "work"

    def allgather(self, *args: Any, **kwargs: Any) -> str:
        self.issued.append("allgather")
        return "work"

    def barrier(self, *args: Any, **kwargs: Any) -> str:
        self.issued.append("barrier")
        return "work"


@pytest.mark.timeout(10)
def test_a_plan_pickles_and_names_the_ranks_that_may_die() -> None:
    faults = (Faults().kill(2, 3).freeze(1, 4).freeze(0, 1, seconds=0.5)
              .fail_collective(1, 5).slow(3, 0.01))
    copy = pickle.loads(pickle.dumps(faults))
    assert copy.plan == faults.plan and len(copy.plan) == 5
    assert faults.may_die == {1, 2}  # killed, or frozen for good


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("build", "words"), [
    (lambda f: f.kill(-1, 3), "rank -1: ranks count from 0"),
    (lambda f: f.kill(0, -2), "step -2: steps count from 0"),
    (lambda f: f.freeze(0, 1, seconds=0), "freeze(seconds=0): give a positive number"),
    (lambda f: f.slow(0, 0.0), "slow(seconds_per_step=0.0): give a positive number"),
    (lambda f: f.fail_collective(1, 2).injector(1), "pass injector(rank, group=cohort.group)"),
    (lambda f: f.injector(0, group=_Group()), "pass the cohort's GroupHandle"),
])
def test_a_bad_fault_is_refused_by_name(build: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        build(Faults())


@pytest.mark.timeout(10)
def test_each_fault_fires_once_at_its_rank_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fired: list[tuple[str, Any]] = []
    monkeypatch.setattr(faults_module.os, "kill", lambda pid, sig: fired.append(("signal", sig)))
    monkeypatch.setattr(faults_module, "freeze", lambda seconds: fired.append(("freeze", seconds)))
    faults = Faults().kill(1, 3).freeze(1, 5, seconds=2.0).kill(0, 1)
    inject = faults.injector(1)
    for step in (0, 1, 2, 3, 3, 4, 5, 5):  # step 3 and 5 redone: no second fault
        inject(step)
    assert fired == [("signal", faults_module.signal.SIGKILL), ("freeze", 2.0)]
    assert [f.kind for f in inject.fired] == ["kill", "freeze"]


@pytest.mark.timeout(10)
def test_a_slow_rank_sleeps_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(faults_module.time, "sleep", slept.append)
    inject = Faults().slow(0, 0.25).slow(1, 9.0).injector(0)
    for step in range(4):
        inject(step)
    assert slept == [0.25] * 4


@pytest.mark.timeout(10)
def test_a_failed_collective_is_the_next_one_only_and_a_lost_peer_to_potluck() -> None:
    from potluck.collectives import issued
    from potluck.reducer.hook_failure import is_backend_failure

    backend = _Group()
    handle = GroupHandle(backend, owned=False)
    inject = Faults().fail_collective(0, 2).injector(0, group=handle)
    inject(1)
    handle.allreduce([])
    inject(2)  # the fault is armed here: nothing is issued yet
    with pytest.raises(RuntimeError) as failed:
        handle.broadcast([])
    assert is_backend_failure(failed.value)  # an elastic cohort redoes the step
    assert "rank 0, step 2" in str(failed.value)
    handle.allgather([])  # only the next one fails
    assert backend.issued == ["allreduce", "allgather"]
    handle.fail_next_collective("again")
    with pytest.raises(PeerLostError, match="a failed collective: again"):
        issued(lambda: handle.barrier(), handle, "a barrier")
    handle.fail_next_collective("not for the next generation")
    handle.reconfigure(_Group(), 1)
    handle.barrier()  # a new generation's group starts clean


@pytest.mark.timeout(10)
def test_exactly_once_names_missing_repeated_and_foreign_samples(tmp_path: Path) -> None:
    with SampleLedger(tmp_path / "rank0.jsonl") as ledger:
        for epoch, ids in ((0, [0, 1, 2]), (0, [3, 4, 5]), (1, [5, 4, 3])):
            ledger.record(epoch, ids)
    with SampleLedger(tmp_path / "rank1.jsonl") as ledger:
        ledger.record(1, torch.tensor([0, 1, 2]).tolist())
    assert read_ledgers(tmp_path)[0] == (0, [0, 1, 2])
    assert exactly_once_problems(tmp_path, 6, epochs=2) == []
    assert_exactly_once(tmp_path, 6, epochs=2)
    Path(tmp_path, "rank2.jsonl").write_text(json.dumps([1, [2]]) + "\n")  # twice
    Path(tmp_path, "rank0.jsonl").write_text(json.dumps([0, [0, 1, 2]]) + "\n"
                                             + json.dumps([1, [5, 4, 3]]) + "\n")  # lost
    assert exactly_once_problems(tmp_path, 6, epochs=2) == [
        "epoch 0: missing [3, 4, 5], more than once []",
        "epoch 1: missing [], more than once [2]"]
    with pytest.raises(AssertionError, match="not every sample exactly once: epoch 0"):
        assert_exactly_once(tmp_path, 6, epochs=2)


@pytest.mark.timeout(10)
def test_exactly_once_takes_records_and_an_expected_set() -> None:
    records = [(0, [4, 0]), (0, [2])]
    assert exactly_once_problems(records, {0, 2, 4}) == []  # e.g. drop_last's subset
    assert exactly_once_problems(records, {0, 2}) == [
        "epoch 0: missing [], more than once [], not in the dataset [4]"]
    assert exactly_once_problems([(0, [0]), (3, [0])], 1) == [
        "samples trained in epochs [3], beyond the 1 expected"]


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(3, 2).double()


@pytest.mark.timeout(10)
def test_replicas_equal_bit_for_bit_and_the_reference_within_tolerance() -> None:
    one, two = _net(0), _net(0)
    state = {n: p.detach().clone() for n, p in one.named_parameters()}
    assert_replicas_equal([one, None, state, two])  # None: a rank that died
    near = {n: p * (1 + 1e-12) for n, p in state.items()}
    assert_replicas_equal([one, two], reference=near, rtol=1e-9)
    with pytest.raises(AssertionError, match="differ from the reference in weight"):
        assert_replicas_equal([one, two], reference=near)
    with torch.no_grad():
        two.bias[1] += 1e-15
    with pytest.raises(AssertionError, match=r"rank 1's replica differs from rank 0's in "
                                             r"bias \(largest gap 9.99e-16\)"):
        assert_replicas_equal([one, two])
    with pytest.raises(AssertionError, match="other tensors than rank 0's: \\['bias'\\]"):
        assert_replicas_equal([one, {"weight": state["weight"]}])
    with pytest.raises(AssertionError, match="no replica to compare"):
        assert_replicas_equal([None, None])
