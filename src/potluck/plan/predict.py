"""The predicted step or round of a cohort in one sync mode (pure).

Every step: each member computes its share of the global batch (by speed when the
mode is adaptive, else equal), and the gradients' all-reduce starts during backward.
The all-reduce has a wire time ``w`` (``ring.allreduce_s``) and CPU work ``u`` on each
member: ``cpu_s_per_byte`` times the bytes it sends, over its cores. A member whose
compute runs on its CPU (``cores`` given) cannot hide that work behind compute:

    step_i = max(c_i + u_i, (1 - overlap) * c_i + w)     (compute on the CPU)
    step_i = max(c_i, (1 - overlap) * c_i + max(w, u_i))  (compute on a GPU)
    step = max_i step_i + codec + step overhead

Rounds (DiLoCo): a round is H global batches split into local steps by speed
(``sync.round_plan.plan_round``, the plan potluck runs), then one all-reduce of the
pseudo-gradients, its CPU work and the wire overlapping (``a = max(w, max_i u_i)``):

    round = c + a + codec + round overhead                    (P = 1)
    round = max(c + a / P, a + c / P) + ...                   (Streaming, P fragments)

since each fragment's sync hides behind the next stretch of local steps, unless the
link is the slower of the two. Figures: samples a second, scaling efficiency (over
the members' summed solo speeds), compute utilization (the members' mean busy
fraction) and payload bytes on the wire per sample, all members together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from potluck.balance.planner import plan_shares
from potluck.plan.machines import Machine, Workload
from potluck.plan.modes import SyncMode
from potluck.plan.ring import NEAR, Distances, allreduce_s, bytes_sent, ring_bytes
from potluck.sync.round_plan import plan_round


@dataclass(frozen=True)
class Prediction:
    """One cohort in one mode. ``period_s`` is a step's (every step) or a round's."""

    mode: str
    world_size: int
    period_s: float
    samples_per_s: float
    scaling_efficiency: float
    utilization: float
    bytes_per_sample: float
    compute_s: float  # the slowest member's compute in a period
    comm_s: float  # the all-reduce's, whether hidden or not


def predict(members: Sequence[Machine], workload: Workload, mode: SyncMode,
            distances: Distances = NEAR) -> Prediction:
    """The cohort ``members`` running ``workload`` in ``mode``."""
    if not members:
        raise ValueError("predict: a cohort has at least one member")
    speeds = [m.speed for m in members]
    n, batch, over = len(members), workload.global_batch, workload.overheads
    samples = batch * mode.inner_steps
    computes = _computes(speeds, batch, mode)
    c = max(computes)
    wire = workload.model_bytes * mode.wire_fraction
    link = allreduce_s(wire, members, distances)
    cpu = [over.cpu_s_per_byte * ring_bytes(wire, n) / (m.cores or 1.0) for m in members]
    comm = max(link, *cpu)
    codec = (over.codec_s_per_param * workload.parameters
             if n > 1 and mode.codec != "none" else 0.0)
    if not mode.rounds:
        steps = [_step(ci, ui, link, over.overlap, m.cores is not None)
                 for ci, ui, m in zip(computes, cpu, members, strict=True)]
        period = (max(steps) if n > 1 else c) + codec
        period += over.step_s if n > 1 else 0.0
    else:
        p = mode.fragments
        period = max(c + comm / p, comm + c / p) if p > 1 else c + comm
        period += codec + (over.round_s if n > 1 else 0.0)
    rate = samples / period
    return Prediction(
        mode=mode.name, world_size=n, period_s=period, samples_per_s=rate,
        scaling_efficiency=rate / sum(speeds),
        utilization=sum(computes) / (n * period),
        bytes_per_sample=bytes_sent(wire, n) / samples, compute_s=c, comm_s=comm)


def _step(compute: float, cpu: float, wire: float, overlap: float, on_cpu: bool) -> float:
    """One member's step: its compute, the all-reduce's CPU work and the wire."""
    if on_cpu:  # the all-reduce's CPU work takes turns with compute on the same cores
        return max(compute + cpu, (1 - overlap) * compute + wire)
    return max(compute, (1 - overlap) * compute + max(wire, cpu))


def _computes(speeds: Sequence[float], batch: int, mode: SyncMode) -> list[float]:
    """Each member's seconds of compute in one period of ``mode``."""
    n = len(speeds)
    if not mode.rounds:
        counts = (plan_shares(list(speeds), batch).counts if mode.adaptive
                  else _equal(batch, n))
        return [count / speed for count, speed in zip(counts, speeds, strict=True)]
    steps = (plan_round(list(speeds), mode.inner_steps) if mode.adaptive
             else (mode.inner_steps,) * n)
    # each local step is about global_batch / N samples (round_plan's rule)
    return [h * batch / n / speed for h, speed in zip(steps, speeds, strict=True)]


def _equal(batch: int, n: int) -> tuple[int, ...]:
    return tuple(batch // n + (1 if r < batch % n else 0) for r in range(n))
