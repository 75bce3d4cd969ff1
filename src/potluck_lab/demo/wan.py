"""``potluck demo --wan``: torch DDP beside potluck DiLoCo over a rate-limited link.

Two hosts on this machine (network namespaces joined by a veth pair, ``tc ... tbf`` on
both ends: ``machine/netns.py``), one worker each, the demo's character transformer on
stdlib source, the same data and global batch for both:

1. torch DDP averages gradients every step over the link: a few steps, timed;
2. potluck DiLoCo (``prepare(sync=DiLoCo(inner_steps=H))``) trains many more global
   batches over the same link and syncs once a round.

Then one table: global batches, samples per second, loss, bytes on the link per sample
(the veth's counters) and how busy each worker was. The losses are compared at the same
time: the shorter run's training time, each contender's last evaluation by then (DDP
evaluates after every batch, DiLoCo after every round). The processes are the WAN bench's
(``bench/wan.py``, ``bench/wan_job.py``); ``potluck bench wan`` is the full comparison.
Needs root (namespaces, tc); without it the demo says so and exits 2.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.errors import ConfigError
from potluck_lab.bench.wan import Jobs, WanConfig, rate_bits
from potluck_lab.common import table
from potluck_lab.machine.netns import LinkedHosts, NetnsError, unavailable


@dataclass(frozen=True)
class WanDemo:
    bandwidth: str
    ddp_batches: int  # torch DDP's global batches over the capped link
    diloco_batches: int  # potluck DiLoCo's
    inner_steps: int  # H


FULL = WanDemo("10mbit", ddp_batches=12, diloco_batches=200, inner_steps=50)
# DDP's 4 batches take about as long as DiLoCo's 40 (two rounds): their losses are
# compared at the same time
QUICK = WanDemo("10mbit", ddp_batches=4, diloco_batches=40, inner_steps=20)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bandwidth", default=None, metavar="RATE",
                        help="with --wan: the link's rate each way, a tc rate (10mbit)")


def config_from_args(args: argparse.Namespace) -> WanDemo:
    """Validate the flags for a WAN run; ConfigError names the value, the rule, the fix.
    (``cli.check_demo_flags`` has refused the plain demo's flags already.)"""
    demo = QUICK if args.quick else FULL
    if args.bandwidth is not None:
        rate_bits(args.bandwidth)  # tc's own refusal would come after the hosts are built
        demo = WanDemo(args.bandwidth, demo.ddp_batches, demo.diloco_batches,
                       demo.inner_steps)
    if args.workers != 2:
        raise ConfigError(f"--workers {args.workers} with --wan: the demo builds two hosts "
                          "joined by one link, one worker each; drop --workers")
    return demo


def main(args: argparse.Namespace) -> int:
    """Run the WAN demo: 0 on success, 1 if ip or tc failed, 2 without root; a bad flag
    raises ``ConfigError`` (``cli.main`` exits 2)."""
    demo = config_from_args(args)
    problem = unavailable()
    if problem is not None:
        print(f"potluck demo --wan: {problem}: it builds two hosts (network namespaces "
              "joined by a rate-limited veth pair); run it as root, or see "
              "docs/benchmarks.md for the figures", file=sys.stderr)
        return 2
    started = time.perf_counter()
    config = WanConfig(bandwidth=demo.bandwidth, global_batch=32,
                       inner_steps=demo.inner_steps, eval_every=1)  # DDP: every batch
    print(f"potluck demo --wan: 2 workers on two hosts joined by a {demo.bandwidth} link "
          f"(each way), the demo's character transformer, global batch "
          f"{config.global_batch}", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="potluck-demo-wan-"))
    try:
        ddp, diloco = _train(demo, config, logs)
    except NetnsError as exc:  # ip's or tc's words (its first line), not a traceback
        print(f"potluck demo --wan: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(report(ddp, diloco))
    print(f"done in {time.perf_counter() - started:.1f} s; the workers' logs are in {logs}")
    return 0


def _train(demo: WanDemo, config: WanConfig,
           logs: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build the two hosts, run torch DDP then potluck DiLoCo over the capped link, and
    take the hosts down again; each contender's figures."""
    with LinkedHosts("pl-demo") as hosts:
        hosts.limit(demo.bandwidth)
        jobs = Jobs(hosts, config, logs, None)
        print(f"torch DDP: all-reduces the gradients of every step over the link "
              f"({demo.ddp_batches} global batches)...", flush=True)
        ddp = _figures(jobs.run("ddp", batches=demo.ddp_batches), config)
        print(f"potluck DiLoCo: {demo.inner_steps} local steps a round, then one sync "
              f"({demo.diloco_batches} global batches)...", flush=True)
        diloco = _figures(jobs.run("diloco", batches=demo.diloco_batches), config)
    return ddp, diloco


def _figures(run: dict[str, Any], config: WanConfig) -> dict[str, Any]:
    """What a contender's two ranks did: batches, wall time, loss, link bytes, how busy
    the less busy worker was (DiLoCo's local work over its wall time; DDP's is not
    measured here: ``potluck bench wan`` has its utilization), and rank 0's evaluations
    (``curve``: [global batches, seconds of training, loss])."""
    first = run["ranks"][0]
    samples = first["curve"][-1][0]  # [samples trained, seconds, loss] at the end
    batches = samples // config.global_batch
    wall = max(r["wall_s"] for r in run["ranks"])
    busy = [r["compute_s"] / r["wall_s"] for r in run["ranks"] if "compute_s" in r]
    curve = [[done // config.global_batch, seconds, loss]
             for done, seconds, loss in first["curve"]]
    return {"batches": batches, "wall_s": wall, "samples_per_s": samples / wall,
            "loss": first["curve"][-1][2], "bytes_per_sample": run["veth_bytes"] / samples,
            "busy": min(busy) if busy else float("nan"), "curve": curve}


def same_time_line(ddp_curve: list[list[float]], diloco_curve: list[list[float]]) -> str:
    """The two losses at the same time: the end of the shorter run's training, each
    contender's last evaluation by then (curves of [global batches, seconds, loss])."""
    if not ddp_curve or not diloco_curve:
        return "no evaluations to compare"
    until = min(ddp_curve[-1][1], diloco_curve[-1][1])
    ddp = [point for point in ddp_curve if point[1] <= until]
    diloco = [point for point in diloco_curve if point[1] <= until]
    if not ddp or not diloco:
        shorter, other = (("DDP", "DiLoCo's first sync") if not diloco
                          else ("DiLoCo", "DDP's first batch"))
        return (f"too short to compare the losses: {shorter}'s run ended after {until:.1f} s "
                f"of training, before {other}; run potluck demo --wan (without --quick)")
    (ddp_batches, _, ddp_loss), (diloco_batches, _, diloco_loss) = ddp[-1], diloco[-1]
    return (f"in the same {until:.1f} s of training, DiLoCo reached loss {diloco_loss:.3f} "
            f"({diloco_batches:.0f} global batches) where torch DDP reached "
            f"{ddp_loss:.3f} ({ddp_batches:.0f})")


def report(ddp: dict[str, Any], diloco: dict[str, Any]) -> str:
    rows = [[name, f"{f['batches']:.0f}", f"{f['wall_s']:.1f}", f"{f['samples_per_s']:.0f}",
             f"{f['loss']:.3f}", f"{f['bytes_per_sample']:,.0f}",
             "-" if f["busy"] != f["busy"] else f"{f['busy']:.2f}"]
            for name, f in (("torch DDP", ddp), ("potluck DiLoCo", diloco))]
    lines = [table(["", "global batches", "wall s", "samples/s", "loss",
                    "link bytes/sample", "busy"], rows)]
    speed = diloco["samples_per_s"] / ddp["samples_per_s"]
    fewer = ddp["bytes_per_sample"] / diloco["bytes_per_sample"]
    lines.append(f"over the same link DiLoCo trained {speed:.0f}x the samples per second "
                 f"with {fewer:.0f}x fewer bytes per sample")
    lines.append(same_time_line(ddp["curve"], diloco["curve"]))
    return "\n".join(lines)
