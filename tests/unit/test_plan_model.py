"""The planner's cost model: the ring all-reduce, a step, a round (pure)."""

from __future__ import annotations

import pytest

from potluck.errors import ConfigError
from potluck.plan import Distances, Machine, Overheads, Workload, allreduce_s, predict
from potluck.plan.machines import PAYLOAD_FRACTION
from potluck.plan.modes import diloco, every_step, streaming
from potluck.plan.ring import bytes_sent, hop_latency


def _m(name: str, speed: float = 100.0, mbit: float = 100.0, latency_ms: float = 0.0,
       region: str = "") -> Machine:
    return Machine(name, speed, mbit * 1e6, mbit * 1e6, latency_ms / 1e3, region)


@pytest.mark.timeout(10)
def test_ring_cost_follows_the_formula_with_the_slowest_link() -> None:
    members = [_m("a", mbit=1000), _m("b", mbit=100, latency_ms=1), _m("c", mbit=1000)]
    size = 4e6
    rate = 100e6 / 8 * PAYLOAD_FRACTION  # b's link decides
    latency = 0.001  # every hop touches... the longest one has b's 1 ms
    expected = 2 * 2 / 3 * size / rate + 2 * 2 * latency
    assert allreduce_s(size, members) == pytest.approx(expected)
    assert allreduce_s(size, members[:1]) == 0.0
    assert bytes_sent(size, 3) == 4 * size


@pytest.mark.timeout(10)
def test_a_ring_crosses_between_regions_as_few_times_as_it_can() -> None:
    far = Distances({("eu", "us"): 0.040})
    members = [_m("a", region="eu"), _m("b", region="us"), _m("c", region="eu"),
               _m("d", region="us")]
    assert hop_latency(members, far) == pytest.approx(0.040)
    assert hop_latency(members[::2], far) == 0.0


@pytest.mark.timeout(10)
def test_every_step_alone_is_compute_and_together_adds_the_exposed_all_reduce() -> None:
    work = Workload(parameters=1_000_000, global_batch=100, overheads=Overheads(step_s=0.01))
    alone = predict([_m("a")], work, every_step())
    assert alone.period_s == pytest.approx(1.0)
    assert alone.scaling_efficiency == pytest.approx(1.0)
    assert alone.bytes_per_sample == 0
    pair = [_m("a", mbit=8), _m("b", mbit=8)]
    two = predict(pair, work, every_step())
    comm = allreduce_s(4e6, pair)
    assert two.period_s == pytest.approx(0.5 * 0.5 + comm + 0.01)  # half the compute hides
    assert two.bytes_per_sample == pytest.approx(2 * 4e6 / 100)
    assert two.utilization == pytest.approx(0.5 / two.period_s)


@pytest.mark.timeout(10)
def test_balanced_shares_follow_speed_and_equal_ones_wait_for_the_slowest() -> None:
    work = Workload(parameters=10, global_batch=300)
    fast, slow = _m("f", speed=200, mbit=1e5), _m("s", speed=100, mbit=1e5)
    balanced = predict([fast, slow], work, every_step())
    equal = predict([fast, slow], work, every_step(adaptive=False))
    assert balanced.compute_s == pytest.approx(1.0, rel=0.01)  # 200 and 100 samples
    assert equal.compute_s == pytest.approx(1.5)  # 150 samples on the slow one
    assert balanced.samples_per_s > equal.samples_per_s


@pytest.mark.timeout(10)
def test_a_round_is_its_local_steps_then_one_sync_and_streaming_hides_it() -> None:
    work = Workload(parameters=1_000_000, global_batch=100, overheads=Overheads(round_s=0.1))
    pair = [_m("a", mbit=8), _m("b", mbit=8)]
    comm = allreduce_s(4e6, pair)
    plain = predict(pair, work, diloco(50))
    assert plain.period_s == pytest.approx(50 * 100 / 200 + comm + 0.1)
    assert plain.bytes_per_sample == pytest.approx(2 * 4e6 / (50 * 100))
    fragments = predict(pair, work, streaming(50, 4, codec="none"))
    assert fragments.period_s == pytest.approx(max(25 + comm / 4, comm + 25 / 4) + 0.1)
    assert fragments.samples_per_s > plain.samples_per_s


@pytest.mark.timeout(10)
def test_diloco_needs_fewer_bytes_per_sample_by_its_h_and_a_codec_by_its_ratio() -> None:
    work = Workload(parameters=1_000_000, global_batch=64)
    pair = [_m("a"), _m("b")]
    step = predict(pair, work, every_step()).bytes_per_sample
    assert predict(pair, work, diloco(100)).bytes_per_sample == pytest.approx(step / 100)
    int8 = predict(pair, work, every_step("int8")).bytes_per_sample
    assert int8 == pytest.approx(step * (1 + 4 / 256) / 4)


@pytest.mark.timeout(10)
def test_bad_figures_are_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match="up_bps"):
        Machine("x", 10, 0, 1e6)
    with pytest.raises(ConfigError, match="overlap"):
        Overheads(overlap=2)


@pytest.mark.timeout(10)
def test_the_all_reduces_cpu_work_takes_turns_with_compute_on_a_cpu_worker() -> None:
    over = Overheads(cpu_s_per_byte=1e-8, overlap=0.5)
    work = Workload(parameters=1_000_000, global_batch=200, overheads=over)
    fast = 1e5  # a wire of 0.34 ms: the CPU work decides
    on_cpu = [Machine(n, 200.0, fast * 1e6, fast * 1e6, cores=0.5) for n in "ab"]
    on_gpu = [Machine(n, 200.0, fast * 1e6, fast * 1e6) for n in "ab"]
    cpu = 1e-8 * 4e6  # 2 (N - 1) / N of 4 MB is 4 MB a member sends
    # compute 0.5 s; the CPU work at half a core does not hide behind it
    assert predict(on_cpu, work, every_step()).period_s == pytest.approx(0.5 + cpu / 0.5)
    # beside a GPU's compute, a core does it while backward runs
    assert predict(on_gpu, work, every_step()).period_s == pytest.approx(0.5)
    # in a round the all-reduce runs alone: its CPU work and the wire overlap
    h = 4
    rounds = predict(on_cpu, work, diloco(h))
    assert rounds.period_s == pytest.approx(h * 0.5 + cpu / 0.5)


@pytest.mark.timeout(10)
def test_a_slow_link_still_decides_when_the_cpu_work_is_small() -> None:
    over = Overheads(cpu_s_per_byte=1e-9, overlap=0.0)
    work = Workload(parameters=1_000_000, global_batch=200, overheads=over)
    pair = [Machine(n, 200.0, 8e6, 8e6, cores=1.0) for n in "ab"]
    wire = allreduce_s(4e6, pair)
    assert predict(pair, work, every_step()).period_s == pytest.approx(0.5 + wire)


@pytest.mark.timeout(10)
def test_resnet50_on_8_gpus_lands_where_the_ddp_benchmark_does_with_its_own_overhead() -> None:
    """docs/plan.md's first row: 6 ms a step, read off the DDP README's 2-GPU row."""
    gpus = [Machine(f"g{i}", 329.0, 100e9, 100e9) for i in range(8)]
    resnet = Workload(25_557_032, 32 * 8, overheads=Overheads(step_s=0.006))
    assert predict(gpus, resnet, every_step()).scaling_efficiency == pytest.approx(0.94,
                                                                                   abs=0.005)
    bare = Workload(25_557_032, 32 * 8)
    assert predict(gpus, bare, every_step()).scaling_efficiency == pytest.approx(1.0)
