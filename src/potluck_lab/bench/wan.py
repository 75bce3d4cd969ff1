"""``potluck bench wan``: torch DDP (plain, with torch's fp16 hook, and with its PowerSGD
hook at rank 4, in one bucket: ``wan_job`` says why) vs potluck DiLoCo (plain, and int8
on the wire), Streaming DiLoCo (int8) and Local SGD (int8 at H, int4 at H // 2) over a
rate-limited link between two network namespaces.

    potluck bench wan [--bandwidth 10mbit] [--quota Q] [--seeds K] [--contenders A,B]
                      [--quick] [--json PATH]

The two workers are two hosts (``machine/netns.py``: a veth pair, ``tc ... tbf`` on both
ends), one process per rank and contender (``wan_job.py``). In order:

1. every torch DDP contender on the unlimited link for S global batches: its loss curve
   (DDP's loss after S batches is the target);
2. the link is capped; each DDP contender runs a few steps: its step time and bytes;
3. each potluck contender trains over the capped link until the samples of S batches
   times ``--diloco-factor``: its real wall time to the target;
4. the link is uncapped again; ddp and each potluck contender train S batches on data
   seeds 2 .. K: the loss gap is averaged over the K data orders.

Figures in ``wan_figures.py``; ``--quota Q`` holds worker 1 to Q of a core (cgroup v1),
for the fast worker's busy fraction with adaptive local steps (DiLoCo, and Streaming
DiLoCo with int8, whose syncs overlap the local steps) and with a fixed H.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from potluck.errors import ConfigError
from potluck_lab.bench.wan_figures import (
    loss_at,
    mean_gaps,
    median,
    ratio,
    seed_gaps,
    steps_to_target,
)
from potluck_lab.common import BenchError, at_least, table
from potluck_lab.driver import Bench, drive, given
from potluck_lab.jobs import Processes
from potluck_lab.machine.cpu_quota import join
from potluck_lab.machine.netns import LinkedHosts, NetnsError, unavailable

DDP = ("ddp", "ddp-fp16", "ddp-powersgd")
# Steps a DDP contender's timing leaves out: the first (DDP's bucket rebuild); with
# PowerSGD also its two uncompressed steps and its first compressed one (P and Q made).
_UNTIMED = {"ddp-powersgd": 3}
# AdamW's learning rate for every contender: torch DDP's best on this workload of 7e-4,
# 1e-3, 1.5e-3, 2e-3 and 3e-3 (the held-out loss after 500 batches, data seeds 1-3)
LR = 1.5e-3
# tc's rate units (tc(8), RATES; any case), in bits per second; a bare number is bits too
RATE_UNITS = {"": 1.0, "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "kibit": 2.0**10, "mibit": 2.0**20, "gibit": 2.0**30, "tibit": 2.0**40,
              "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
              "kibps": 8 * 2.0**10, "mibps": 8 * 2.0**20, "gibps": 8 * 2.0**30,
              "tibps": 8 * 2.0**40}
_RATE = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)([a-z]*)", re.IGNORECASE)


@dataclass(frozen=True)
class WanConfig:
    bandwidth: str = "10mbit"
    batches: int = 1000  # S (the loss gap shrinks with it: docs/benchmarks.md)
    global_batch: int = 32
    inner_steps: int = 125  # H
    lr: float = LR  # every contender's AdamW (potluck's inner optimizer)
    diloco_factor: float = 2.0  # potluck trains S * factor batches (to reach the target)
    eval_every: int = 10
    measure_steps: int = 4
    quota: float | None = None
    seeds: int = 3  # data orders the loss gap is averaged over (the first one's run is timed)
    contenders: tuple[str, ...] = ("ddp", "ddp-fp16", "ddp-powersgd", "diloco", "diloco-int8",
                                   "streaming-int8", "localsgd-int8", "localsgd-int4")
    logs: str | None = None

    def validated(self) -> WanConfig:
        for flag, count, example in (("--batches", self.batches, "60"),
                                     ("--inner-steps", self.inner_steps, "20")):
            at_least(flag, count, 1, example)
        if self.batches % self.inner_steps:
            raise ConfigError(f"--batches {self.batches} is not a multiple of --inner-steps "
                              f"{self.inner_steps}: the loss gap compares whole rounds")
        rate_bits(self.bandwidth)
        if not 0 < self.lr < 1:
            raise ConfigError(f"--lr {self.lr}: AdamW's learning rate, in (0, 1), e.g. {LR}")
        if self.seeds < 1:
            raise ConfigError(f"--seeds {self.seeds}: at least one data order")
        if self.quota is not None and not 0 < self.quota <= 1:
            raise ConfigError(f"--quota {self.quota}: a fraction of one core in (0, 1]")
        return self


def rate_bits(rate: str) -> float:
    """``--bandwidth``'s ``rate`` in bits per second, as ``tc ... tbf rate`` reads it;
    ConfigError unless tc would take it: checked before any namespace is built, where
    tc's own "illegal value" would come only after (the WAN demo's and bench's check)."""
    match = _RATE.fullmatch(rate)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in RATE_UNITS:
        raise ConfigError(f"--bandwidth {rate!r} must be a tc rate, e.g. 10mbit: a number "
                          "and an optional unit, one of bit, kbit, mbit, gbit, tbit (bits a "
                          "second) or bps, kbps, mbps, gbps, tbps (bytes a second), in any "
                          "case")
    bits = float(match.group(1)) * RATE_UNITS[unit]
    if not 8 <= bits < math.inf:  # tc caps whole bytes a second: under 8 bits it is 0
        raise ConfigError(f"--bandwidth {rate!r} is {bits:g} bits a second: the link's rate "
                          "must be at least one byte a second (8bit) and finite; use e.g. "
                          "--bandwidth 10mbit")
    return bits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bandwidth", default="10mbit", help="each direction (default 10mbit)")
    parser.add_argument("--workers", type=int, default=2, help="workers (2: two hosts)")
    parser.add_argument("--batches", type=int, default=None, metavar="S",
                        help="DDP's reference run, global batches (default 1000; --quick 60)")
    parser.add_argument("--inner-steps", type=int, default=None, metavar="H",
                        help="DiLoCo's local steps per round (default 125; --quick 20)")
    parser.add_argument("--lr", type=float, default=LR,
                        help=f"every contender's AdamW learning rate (default {LR}: torch "
                             "DDP's best on this workload, docs/benchmarks.md)")
    parser.add_argument("--quota", type=float, default=None, metavar="Q",
                        help="hold worker 1 to Q of a core; adds potluck with a fixed H")
    parser.add_argument("--contenders", metavar="A,B,...",
                        help="which contenders, comma-separated (ddp, the reference, among "
                             "them); default: ddp,ddp-fp16,ddp-powersgd,diloco,diloco-int8,"
                             "streaming-int8,localsgd-int8,localsgd-int4 (with --quota: "
                             "ddp,diloco,streaming-int8,diloco-fixed)")
    parser.add_argument("--seeds", type=int, default=None, metavar="K",
                        help="data orders the loss gap is averaged over (default 3; --quick "
                             "and --quota 1): the first is the timed run; the others train S "
                             "batches on the unlimited link")
    parser.add_argument("--logs", metavar="DIR", help="keep the workers' JSON here")
    parser.add_argument("--quick", action="store_true", help="a short run")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")


def config_from_args(args: argparse.Namespace) -> WanConfig:
    if args.workers != 2:
        raise ConfigError(f"--workers {args.workers}: the WAN bench builds two hosts joined "
                          "by one link; only --workers 2 is built")
    config = WanConfig(bandwidth=args.bandwidth, quota=args.quota, logs=args.logs,
                       lr=getattr(args, "lr", LR))
    if args.quick:
        config = replace(config, batches=60, inner_steps=20, eval_every=10, seeds=1)
    config = given(config, batches=args.batches, inner_steps=args.inner_steps)
    if args.quota is not None:
        # the busy fraction's run: its loss gap is the plain run's figure, one seed here
        config = replace(config, contenders=("ddp", "diloco", "streaming-int8", "diloco-fixed"),
                         seeds=1)
    config = given(config, seeds=getattr(args, "seeds", None))
    if getattr(args, "contenders", None):
        config = replace(config, contenders=_contenders(args.contenders))
    return config.validated()


def _contenders(text: str) -> tuple[str, ...]:
    from potluck_lab.bench.wan_job import CONTENDERS

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown or "ddp" not in names:
        raise ConfigError(f"--contenders {text!r}: " + (
            f"unknown {unknown}; " if unknown else "") + "name ddp (the reference every "
            f"figure is measured against) and any of {', '.join(CONTENDERS)}")
    return names


class Jobs:
    """Runs one contender on the two hosts and collects what its ranks wrote."""

    def __init__(self, hosts: LinkedHosts, config: WanConfig, logs: Path,
                 quota_group: str | None) -> None:
        self.hosts, self.config, self.logs, self.quota_group = hosts, config, logs, quota_group
        self.port = 29600

    def run(self, contender: str, *, batches: int, measure: int = 0,
            seed: int = 1) -> dict[str, Any]:
        self.port += 1
        out = self.logs / f"{contender}-{self.port}.json"
        self.logs.mkdir(parents=True, exist_ok=True)
        before = [self.hosts.tx_bytes(h) for h in (0, 1)]
        workers = Processes()
        for rank in (0, 1):
            env = {**os.environ, "MASTER_ADDR": self.hosts.addresses[0],
                   "MASTER_PORT": str(self.port), "RANK": str(rank), "LOCAL_RANK": "0",
                   "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": self.hosts.devices[rank],
                   "OMP_NUM_THREADS": "1"}
            argv = [sys.executable, "-m", "potluck_lab.bench.wan_job", "--contender", contender,
                    "--batches", str(batches), "--global-batch", str(self.config.global_batch),
                    "--inner-steps", str(self.config.inner_steps),
                    "--eval-every", str(self.config.eval_every), "--out", str(out),
                    "--measure-steps", str(measure), "--seed", str(seed),
                    "--lr", str(self.config.lr)]
            proc = workers.start(self.hosts.command(rank, argv),
                                 out.with_name(f"{out.stem}-rank{rank}.log"), env=env,
                                 session=False)
            if rank == 1 and self.quota_group:  # from out here: `ip netns exec` remounts
                # /sys, and cgroup.procs moves every thread, those started later too
                join(Path(self.quota_group), proc.pid)
        try:
            workers.wait(timeout=1800)
        finally:
            workers.stop()  # a peer failed: one still running would wait for it for ever
        outputs = [out.with_name(f"{out.stem}-rank{r}.log").read_text() for r in (0, 1)]
        if any(p.returncode for p in workers.procs):
            raise BenchError(f"{contender}: a worker failed:\n" + "\n".join(
                o[-3000:] for o in outputs))
        after = [self.hosts.tx_bytes(h) for h in (0, 1)]
        ranks = [json.loads(out.with_name(f"{out.stem}-rank{r}.json").read_text())
                 for r in (0, 1)]
        return {"ranks": ranks, "veth_bytes": sum(after) - sum(before)}


def measure(config: WanConfig, hosts: LinkedHosts, jobs: Jobs) -> dict[str, Any]:
    S, G = config.batches, config.global_batch
    ddp = [c for c in config.contenders if c in DDP]
    mine = [c for c in config.contenders if c not in DDP]
    hosts.limit(None)
    # DDP's bytes per sample: over these S batches (the link's cap does not change the
    # bytes), so one-off traffic (the start's parameter broadcast, PowerSGD's two
    # uncompressed first steps) counts as in a run, not as a sixth of a short one.
    reference = {c: jobs.run(c, batches=S) for c in ddp}
    curves = {c: run["ranks"][0]["curve"] for c, run in reference.items()}
    target = curves["ddp"][-1][2]
    unlimited_step = {}
    figures: dict[str, Any] = {}
    for c in ddp:  # compute alone: the unlimited link's step time
        unlimited_step[c] = _timed_steps(jobs, c, S, config.measure_steps)[0]
    hosts.limit(config.bandwidth)
    for c in ddp:
        step, run, taken = _timed_steps(jobs, c, S, config.measure_steps)
        steps = steps_to_target(curves[c], target, G)
        figures[c] = {
            "time_to_target_s": None if steps is None else steps * step,
            "step_s": step, "steps_to_target": steps,
            "bytes_per_sample": reference[c]["veth_bytes"] / (S * G),
            "bytes_per_sample_capped_steps": run["veth_bytes"] / (taken * G),
            "utilization": unlimited_step[c] / step,
            "loss_at_S": loss_at(curves[c], S * G), "measured": "extrapolated"}
    for c in mine:
        batches = round(S * config.diloco_factor)
        run = jobs.run(c, batches=batches)
        curve, ranks = run["ranks"][0]["curve"], run["ranks"]
        reached = next((p for p in curve if p[2] <= target), None)
        busy = [r["compute_s"] / r["wall_s"] for r in ranks]
        figures[c] = {
            "time_to_target_s": None if reached is None else reached[1],
            "bytes_per_sample": run["veth_bytes"] / (batches * G),
            "counted_bytes_per_sample": sum(r["sent"] for r in ranks) / (batches * G),
            "utilization": busy[0], "busy": busy,
            "loss_at_S": loss_at(curve, S * G), "measured": "run",
            "local_steps": [[rd["inner_steps"] for rd in r["rounds"]] for r in ranks]}
    fastest = min((c for c in mine if figures[c]["time_to_target_s"] is not None),
                  key=lambda c: figures[c]["time_to_target_s"], default=None)
    lightest = min(mine, key=lambda c: figures[c]["bytes_per_sample"], default=None)
    # The loss at S batches over more data orders (the algorithm does not depend on
    # the link, so these run on the unlimited one): a gap is averaged over the seeds.
    losses = {c: [figures[c]["loss_at_S"]] for c in ("ddp", *mine)}
    if config.seeds > 1:
        hosts.limit(None)
    for seed in range(2, config.seeds + 1):
        for c in losses:
            run = jobs.run(c, batches=S, seed=seed)
            losses[c].append(loss_at(run["ranks"][0]["curve"], S * G))
    gaps, by_seed = mean_gaps(losses), seed_gaps(losses)
    for c in mine:
        figures[c]["losses_by_seed"], figures[c]["loss_gap"] = losses[c], gaps.get(c)
    figures["ddp"]["losses_by_seed"] = losses["ddp"]
    smallest = min(gaps, key=lambda c: gaps[c], default=None)
    # Each figure is the best contender's for that figure, named beside it (one
    # contender need not have all three: each contender's own are under "contenders").
    return {
        "time_to_target_vs_ddp": ratio(figures["ddp"]["time_to_target_s"], None if fastest
                                       is None else figures[fastest]["time_to_target_s"]),
        "time_to_target_contender": fastest,
        "bytes_vs_ddp": ratio(figures["ddp"]["bytes_per_sample"], None if lightest is None
                              else figures[lightest]["bytes_per_sample"]),
        "bytes_contender": lightest,
        "loss_gap": None if smallest is None else gaps[smallest],
        "loss_gap_contender": smallest, "seeds": config.seeds,
        "loss_gap_by_seed": [] if smallest is None else by_seed[smallest],
        "target_loss": target, "contenders": figures, "curves": curves}


def _timed_steps(jobs: Jobs, contender: str, batches: int, measure: int
                 ) -> tuple[float, dict[str, Any], int]:
    """A DDP contender's median step time over ``measure`` steps past the ones its
    timing leaves out (``_UNTIMED``), its run, and the steps the run took."""
    skip = _UNTIMED.get(contender, 1)
    run = jobs.run(contender, batches=batches, measure=measure + skip)
    return median(run["ranks"][0]["step_times"][skip:]), run, measure + skip


def report(config: WanConfig, results: dict[str, Any]) -> str:
    rows = []
    for name, f in results["contenders"].items():
        ttt = f["time_to_target_s"]
        rows.append([name, f["measured"], "never" if ttt is None else f"{ttt:.1f}",
                     f"{f['bytes_per_sample']:.0f}", f"{f['utilization']:.2f}",
                     "-" if f["loss_at_S"] is None else f"{f['loss_at_S']:.4f}"])
    lines = [table(["contender", "how", "s to target", "bytes/sample (veth)", "compute util",
                    f"loss at {config.batches} batches"], rows)]
    for name, f in results["contenders"].items():
        if "local_steps" in f:
            busy = ", ".join(f"{b:.2f}" for b in f["busy"])
            lines.append(f"{name}: local steps per round, worker 0 {f['local_steps'][0]}, "
                         f"worker 1 {f['local_steps'][1]}; busy (compute / wall) {busy}")
    if results["seeds"] > 1:
        for name, f in results["contenders"].items():
            if "losses_by_seed" not in f:  # ddp-fp16 and the like: timed, not re-seeded
                continue
            gap = f.get("loss_gap")
            by_seed = ", ".join("-" if v is None else f"{v:.4f}" for v in f["losses_by_seed"])
            lines.append(f"{name}: loss at {config.batches} batches by data seed [{by_seed}]"
                         + ("" if gap is None else f"; gap to ddp, mean over the seeds "
                            f"{gap:+.4f}"))
    for key in ("time_to_target_vs_ddp", "bytes_vs_ddp", "loss_gap"):
        value = results[key]
        lines.append(f"{key}: {'-' if value is None else f'{value:.4g}'}"
                     + ("" if value is None else f" ({_whose(key, results)})"))
    return "\n".join(lines)


def _whose(key: str, results: dict[str, Any]) -> str:
    """The contender a top-level figure comes from (and, for the loss, its seeds)."""
    if key == "loss_gap":
        seeds = results["seeds"]
        each = ", ".join(f"{g:+.4f}" for g in results.get("loss_gap_by_seed", []))
        return (f"{results['loss_gap_contender']}, "
                + ("data seed 1 only" if seeds == 1 else f"mean over {seeds} data seeds"
                   + (f": {each}" if each else "")))
    return str(results.get(key.replace("_vs_ddp", "_contender")))


def main(args: argparse.Namespace) -> int:
    return drive(BENCH, args)


def _header(config: WanConfig) -> str:
    return (f"potluck bench wan: 2 workers on two hosts, {config.bandwidth} each way, "
            f"global batch {config.global_batch}, S={config.batches}, "
            f"H={config.inner_steps}, AdamW lr {config.lr}")


def _measure_on_hosts(config: WanConfig, logs: Path) -> dict[str, Any]:
    """Build the two hosts (and worker 1's quota), measure, and take them down again."""
    try:
        with LinkedHosts("pl-wan") as hosts:
            quota = None
            if config.quota is not None:
                from potluck_lab.machine.cpu_quota import CpuQuota
                quota = CpuQuota(f"potluck-wan-{os.getpid()}").create(config.quota)
            try:
                jobs = Jobs(hosts, config, logs, str(quota.path) if quota else None)
                return measure(config, hosts, jobs)
            finally:
                if quota is not None:
                    quota.remove()
    except NetnsError as exc:  # ip's or tc's words (their first line), not a traceback
        raise BenchError(str(exc).splitlines()[0]) from None


BENCH = Bench("wan", config_from_args, _measure_on_hosts,
              lambda config, results: [report(config, results)],
              lambda config, results: {**results, "config": config.__dict__},
              header=_header, unavailable=unavailable, logs=lambda config: config.logs)
