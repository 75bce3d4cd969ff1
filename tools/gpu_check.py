"""potluck on one CUDA GPU: the checks to run whenever a GPU machine is lent (issue 50).

    tools/gpu_check.sh [--quick] [--json PATH]     # .venv's python, or python3 and src/
    tools/gpu_check.sh --cpu --quick               # the rehearsal, on any machine

Each check is one row of the table printed at the end:

1. ``prepare`` (and its reducer) at world size 1 on NCCL trains as plain torch does
   (float32, 1e-6).
2. Two ranks on Gloo with CUDA tensors (sharing the GPU) train as one process on the
   global batch (float64, 1e-9: the project's equivalence standard).
3. potluck.DataParallel vs torch DDP at world size 1 on NCCL: the median step time of
   interleaved blocks (fails above ``--max-ratio``); the two end with the same parameters.
4. Every codec of ``potluck.compress`` round-trips CUDA tensors within its stated bound.
5. The trust kernels on CUDA: CenteredClip and TrimmedMean equal their CPU results,
   ``Fingerprints`` equals the CPU fingerprint, ``keyed_digest`` is deterministic and
   sees one flipped bit.
6. ``potluck run --elastic``: 2 workers on Gloo with CUDA tensors; one is SIGKILLed
   mid-run, restarts and rejoins; the result equals one process (nothing lost).

``--cpu`` runs the same checks on CPU tensors, Gloo instead of NCCL. The exit code is 1
when a check fails, 2 without CUDA (and without ``--cpu``). The script is also the
elastic job's worker (``--elastic-worker``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import potluck
from potluck import DataCursor
from potluck.compress import Bf16, Fp16, Identity, Int4Blockwise, Int8Blockwise, TopK
from potluck.env import WorkerEnv
from potluck.testing import free_port, run_ranks
from potluck.trust.aggregate import Aggregator, CenteredClip, TrimmedMean
from potluck.trust.fingerprint import Fingerprints, fingerprint, keyed_digest
from potluck_lab import models
from potluck_lab.common import check_json_path, interleaved, median, write_json

NO_CUDA = "no CUDA device: run on a GPU machine, or --cpu to rehearse"
SAMPLES, GLOBAL_BATCH, DATA_SEED = 96, 12, 3  # 8 steps an epoch, even for 1, 2, 3, 4


@dataclass
class Row:
    check: str
    device: str
    result: str
    ok: bool
    seconds: float


# ----------------------------------------------------------- the job checks 1, 2, 6 train

def _data(dtype: torch.dtype) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1000)
    return torch.utils.data.TensorDataset(torch.randn(SAMPLES, 8, generator=gen, dtype=dtype),
                                          torch.randn(SAMPLES, 4, generator=gen, dtype=dtype))


def _sgd(net: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


def step(model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()  # type: ignore[no-untyped-call]
    opt.step()


def one_process(device: str, dtype: torch.dtype, epochs: int) -> dict[str, torch.Tensor]:
    """Plain torch, one process, the global batches in the order ``prepare`` takes them."""
    net, data = models.tiny_mlp(dtype=dtype).to(device), _data(dtype)
    opt, cursor = _sgd(net), DataCursor(SAMPLES, GLOBAL_BATCH, seed=DATA_SEED)
    while cursor.epoch < epochs:
        x, y = (t.to(device) for t in data[cursor.global_indices()])
        step(net, opt, x, y)
        cursor.commit()
    return {k: v.detach().cpu() for k, v in net.state_dict().items()}


def max_diff(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k].cpu() - v).abs().max()) for k, v in want.items())


def _prepared_rank(rank: int, world_size: int, port: int, backend: str, device: str,
                   dtype: torch.dtype, epochs: int) -> dict[str, Any]:
    env = WorkerEnv(rank=rank, world_size=world_size, master_addr="127.0.0.1",
                    master_port=port, source="torchrun")
    cohort = potluck.init(env=env, backend=backend, timeout=60, device=device)
    net = models.tiny_mlp(dtype=dtype)
    model, opt, loader = potluck.prepare(net, _sgd(net), _data(dtype), cohort=cohort,
                                         global_batch=GLOBAL_BATCH, seed=DATA_SEED)
    while loader.epoch < epochs:
        for x, y in loader:
            step(model, opt, x, y)
    opt.finish()
    where = {p.device.type for p in net.parameters()} | {x.device.type}
    return {"diff": max_diff(net.state_dict(), one_process(device, dtype, epochs)),
            "steps": opt.steps, "where": sorted(where)}


def check_prepare(device: str, world_size: int, backend: str, dtype: torch.dtype,
                  tolerance: float, epochs: int) -> tuple[str, bool]:
    results = run_ranks(_prepared_rank, world_size, free_port(), backend, device, dtype,
                        epochs, init_group=False, timeout=120)
    diff = max(r["diff"] for r in results)
    where = sorted({w for r in results for w in r["where"]})
    return (f"{results[0]['steps']} steps, max |potluck - one process| {diff:.1e} "
            f"(<= {tolerance:g}), tensors on {','.join(where)}",
            diff <= tolerance and where == [torch.device(device).type])


# --------------------------------------------------------------- 3: potluck vs torch DDP

def _ddp_rank(rank: int, world_size: int, device: str, rounds: int,
              steps: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    cuda = device == "cuda"
    width, batch = (2048, 1024) if cuda else (256, 32)
    module = models.wide_mlp(width=width, depth=4, io=512).to(device)
    twin = models.wide_mlp(width=width, depth=4, io=512).to(device)
    twin.load_state_dict(module.state_dict())
    wrapped: dict[str, nn.Module] = {
        "potluck": potluck.DataParallel(module),
        "torch": TorchDDP(twin, device_ids=[rank] if cuda else None)}
    optims = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
              for k, m in wrapped.items()}
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(batch, 512, generator=gen).to(device),
                torch.randn(batch, 512, generator=gen).to(device)) for _ in range(steps)]
    times: dict[str, list[float]] = {"potluck": [], "torch": []}
    for warmup in (True, False):
        for name in interleaved(list(wrapped), 1 if warmup else rounds):
            model, opt = wrapped[name], optims[name]
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for x, y in batches:  # both see the same batches, so end alike
                step(model, opt, x, y)
            if cuda:
                torch.cuda.synchronize()
            if not warmup:
                times[name].append((time.perf_counter() - start) / steps)
    diff = max_diff(module.state_dict(), {k: v.cpu() for k, v in twin.state_dict().items()})
    return {"potluck": median(times["potluck"]), "torch": median(times["torch"]),
            "diff": diff, "params": models.parameter_count(module)}


def check_ddp(device: str, backend: str, quick: bool, max_ratio: float) -> tuple[str, bool]:
    rounds, steps = (4, 5) if quick else (10, 20)
    result = run_ranks(_ddp_rank, 1, device, rounds, steps, backend=backend, timeout=120)[0]
    ratio = result["potluck"] / result["torch"]
    return (f"ratio potluck/torch {ratio:.3f} (<= {max_ratio:g}): "
            f"{result['potluck'] * 1e3:.2f} vs {result['torch'] * 1e3:.2f} ms a step, "
            f"{result['params'] / 1e6:.1f}M params, {rounds} rounds x {steps} steps; "
            f"params differ by {result['diff']:.1e}",
            ratio <= max_ratio and result["diff"] <= 1e-4)


# ------------------------------------------------------------------ 4 and 5: the kernels

def _bound(name: str, x: torch.Tensor) -> torch.Tensor:
    """The largest error each value may have after a round trip (each codec's doc)."""
    if name == "none":
        return torch.zeros_like(x)
    if name in ("fp16", "bf16"):  # half a unit in the last place; fp16's subnormals
        return x.abs() * 2.0 ** (-11 if name == "fp16" else -8) + 2.0 ** -25
    levels = {"int8": 127, "int4": 7}[name]  # half a step of the value's block of 256
    blockmax = nn.functional.pad(x.abs(), (0, -x.numel() % 256)).view(-1, 256).amax(1)
    return (blockmax / levels / 2 * (1 + 1e-5)).repeat_interleave(256)[:x.numel()]


def check_codecs(device: str) -> tuple[str, bool]:
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(100_003, generator=gen) * torch.rand(100_003, generator=gen) * 10)
    x = x.to(device)
    worst, failed = 0.0, []
    for codec in (Identity(), Fp16(), Bf16(), Int8Blockwise(), Int4Blockwise(), TopK(0.01)):
        payload = codec.encode(x)
        back = codec.decode(payload, x.numel(), x.dtype)
        if isinstance(codec, TopK):  # the k largest magnitudes exactly, zeros elsewhere
            kept = back != 0
            good = (int(kept.sum()) == codec.k(x.numel()) and bool((back[kept] == x[kept]).all())
                    and float(x[kept].abs().min()) >= float(x[~kept].abs().max()))
        else:
            ratio = float(((back - x).abs() / _bound(codec.name, x).clamp_min(1e-30)).max())
            worst, good = max(worst, ratio), ratio <= 1
        sized = payload.numel() * payload.element_size() == codec.nbytes(x.numel())
        if not (good and sized and back.device == x.device and payload.device == x.device):
            failed.append(codec.name)
    return (f"6 codecs on {x.numel()} values, worst error / its bound {worst:.3f} (<= 1)"
            + (f"; FAILED: {', '.join(failed)}" if failed else ""), not failed)


def check_trust(device: str) -> tuple[str, bool]:
    gen = torch.Generator().manual_seed(11)
    copies = torch.randn(5, 50_000, generator=gen)
    copies[4] += 3.0  # one copy far off: rejected (or clipped), not averaged
    weights = torch.tensor([1.0, 2.0, 1.0, 1.0, 1.0])
    worst, failed = 0.0, []
    aggregators: dict[str, Aggregator] = {
        "CenteredClip": CenteredClip(), "CenteredClip(clip only)": CenteredClip(reject_at=None),
        "TrimmedMean": TrimmedMean(trim=1)}
    for label, agg in aggregators.items():
        here = agg.aggregate(copies.to(device), weights.to(device))
        there = agg.aggregate(copies, weights)
        diff = float((here.cpu() - there).abs().max())
        worst = max(worst, diff)
        if here.device.type != device or diff > 1e-5:
            failed.append(label)
    params = [copies[0].to(device), copies[1, :777].to(device).double()]
    if not Fingerprints()(params) == Fingerprints()(params) == fingerprint(
            [p.cpu() for p in params]):
        failed.append("Fingerprints (differs from the CPU's)")
    key = secrets.randbits(63)
    flipped = [params[0].clone(), params[1]]
    flipped[0].view(torch.int32)[123] ^= 1  # one bit of one value
    if not keyed_digest(params, key) == keyed_digest(params, key) != keyed_digest(flipped, key):
        failed.append("keyed_digest")
    return (f"CenteredClip x2, TrimmedMean: max |device - CPU| {worst:.1e} (<= 1e-5); "
            f"Fingerprints, keyed_digest" + (f"; FAILED: {', '.join(failed)}" if failed else ""),
            not failed)


# ------------------------------------------------------------------ 6: an elastic job

FAIL_AT = 4


def elastic_worker(device: str, epochs: int, out: str) -> None:
    """A worker of check 6, under ``potluck run --elastic``: worker 1's first attempt
    SIGKILLs itself at step ``FAIL_AT``; worker 0 saves the result."""
    # Gloo: NCCL takes one rank a GPU, and the two workers share one.
    cohort = potluck.init(backend="gloo", timeout=30, device=device)
    net = models.tiny_mlp(dtype=torch.float64)
    model, opt, loader = potluck.prepare(net, _sgd(net), _data(torch.float64), cohort=cohort,
                                         global_batch=GLOBAL_BATCH, seed=DATA_SEED)
    first = (os.environ.get("RANK"), os.environ.get("TORCHELASTIC_RESTART_COUNT")) == ("1", "0")
    while loader.epoch < epochs and not opt.left:
        for x, y in loader:
            if first and opt.steps == FAIL_AT:
                os.kill(os.getpid(), signal.SIGKILL)  # as a preempted GPU: no warning
            step(model, opt, x, y)
    if opt.finish() and opt.cohort.rank == 0:
        torch.save({k: v.cpu() for k, v in net.state_dict().items()}, out)


def check_elastic(device: str, epochs: int) -> tuple[str, bool]:
    with tempfile.TemporaryDirectory(prefix="potluck-gpu-check-") as tmp:
        out = Path(tmp, "final.pt")
        env = {**os.environ, "POTLUCK_TOKEN": secrets.token_hex(16)}
        done = subprocess.run(
            [sys.executable, "-m", "potluck", "run", "--nproc-per-node", "2", "--elastic",
             "--max-restarts", "1", "--min-workers", "2", "--min-workers-timeout", "100",
             str(Path(__file__).resolve()), "--elastic-worker", str(out), "--device", device,
             "--epochs", str(epochs)],
            capture_output=True, text=True, timeout=180, env=env, check=False)
        if done.returncode != 0 or not out.exists():
            tail = done.stderr.strip().splitlines()[-3:]
            return f"potluck run exited {done.returncode}: {' | '.join(tail)}", False
        diff = max_diff(torch.load(out), one_process(device, torch.float64, epochs))
    rejoined = f"joined at step {FAIL_AT} with the cohort's live state" in done.stderr
    return (f"worker 1 killed at step {FAIL_AT}, {'rejoined' if rejoined else 'NOT rejoined'}; "
            f"{epochs * SAMPLES // GLOBAL_BATCH} steps, max |job - one process| {diff:.1e} "
            "(<= 1e-9)", rejoined and diff <= 1e-9)


# ---------------------------------------------------------------------------- the table

def table(rows: list[Row]) -> str:
    cells = [["check", "device", "ok", "s", "result"]] + [
        [r.check, r.device, "pass" if r.ok else "FAIL", f"{r.seconds:.1f}", r.result]
        for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def timed(check: str, device: str, run: Callable[[], tuple[str, bool]]) -> Row:
    print(f"gpu_check: {check} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        result, ok = run()
    except Exception as exc:  # a check that raised is a failed row, and the rest still run
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0]
        result, ok = f"{type(exc).__name__}: {first[:160]}", False
    return Row(check, device, result, ok, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="potluck's checks on one CUDA GPU")
    parser.add_argument("--cpu", action="store_true",
                        help="rehearse: every check on CPU tensors, Gloo for NCCL")
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--max-ratio", type=float, default=2.0,
                        help="check 3 fails above this potluck/torch step-time ratio")
    parser.add_argument("--json", metavar="PATH", help="also write the rows here")
    parser.add_argument("--elastic-worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.elastic_worker:
        elastic_worker(args.device, args.epochs, args.elastic_worker)
        return 0
    if not args.cpu and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    check_json_path(args.json)
    device, nccl = ("cpu", "gloo") if args.cpu else ("cuda", "nccl")
    name = "cpu (rehearsal)" if args.cpu else torch.cuda.get_device_name(0)
    epochs = 1 if args.quick else 2
    f32, f64 = torch.float32, torch.float64
    checks: list[tuple[str, str, Callable[[], tuple[str, bool]]]] = [
        ("reducer + prepare, 1 rank", nccl,
         lambda: check_prepare(device, 1, nccl, f32, 1e-6, epochs)),
        ("reducer + prepare, 2 ranks", "gloo",
         lambda: check_prepare(device, 2, "gloo", f64, 1e-9, epochs)),
        ("potluck vs torch DDP, 1 rank", nccl,
         lambda: check_ddp(device, nccl, args.quick, args.max_ratio)),
        ("codecs", "", lambda: check_codecs(device)),
        ("trust kernels", "", lambda: check_trust(device)),
        ("elastic run, 2 workers, 1 killed", "gloo", lambda: check_elastic(device, epochs + 1)),
    ]
    rows = [timed(check, f"{device} {backend}".strip(), run)
            for check, backend, run in checks]
    print(f"potluck gpu check: {name}, torch {torch.__version__}"
          + (f", CUDA {torch.version.cuda}" if not args.cpu else "")
          + f"; {sum(r.ok for r in rows)} of {len(rows)} checks passed in "
          f"{sum(r.seconds for r in rows):.0f} s")
    print(table(rows))
    if args.json:
        write_json(args.json, {"device": name, "torch": torch.__version__,
                               "rows": [asdict(r) for r in rows]})
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
