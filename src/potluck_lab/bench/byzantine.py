"""``potluck bench byzantine``: 4 workers, 1 attacker; plain mean vs potluck with trust.

Each attack runs with each of ``SEEDS`` seeds (model, data, and so the hash that picks
audits and spot checks), twice, interleaved: the plain mean (torch DDP's semantics) and
``prepare(trust=Trust(spot_check=SpotCheck(loss, every=2)))``. Reported per attack: the
final held-out loss of an honest replica over the same seed's clean run (plain mean, no
attacker), median over the seeds (and the worst seed); the steps from the attack's
start to the attacker's quarantine, the most over the seeds; quarantines over clean runs
with trust (false ones), and the step time with trust over without on a clean run
(interleaved rounds: the median over them of each run's mean per step), with and
without spot checks, without audits either, and without spot checks on a model of
1.1M parameters (the default one has 84k), and
the floor: the same step in raw torch with one all-reduce, and with trust's two
all-to-alls, and trust's design in raw torch (its checks' work, none of potluck's
bookkeeping: ``byzantine_floor``). One
seed made the figures for the attacks that only a spot check catches a lottery: its
target is one rank of four every second step, so the time to catch one ranged from 2
to 25 steps between runs.

``--sync diloco`` runs the rounds variant instead (``byzantine_rounds.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.errors import ConfigError
from potluck.testing import free_port, run_ranks
from potluck_lab.attacks import ATTACKS, GROSS
from potluck_lab.bench import byzantine_lm, byzantine_rounds
from potluck_lab.bench.byzantine_floor import run_floor
from potluck_lab.bench.byzantine_job import ATTACKER, SPOT_EVERY, WIDE, run_rank
from potluck_lab.common import interleaved, median, table
from potluck_lab.driver import Bench, drive
from potluck_lab.round_attacks import ROUND_ATTACKS

WORKERS = 4
SYNCS = ("every-step", "diloco")  # --sync diloco: byzantine_rounds.py
ATTACK_CHOICES = tuple(dict.fromkeys((*ATTACKS, *ROUND_ATTACKS)))
SEEDS = 3  # per attack (1 with --quick)
# byzantine_floor's modes: the raw step (one all-reduce; trust's two all-to-alls), and
# trust's design in raw torch: Trust(audit_every=0)'s checks, Trust()'s, the trust
# contender's (spot checks by three checkers), and those by one checker
DESIGNS = {"floor_robust": "robust", "floor_robust_audit": "audit",
           "floor_robust_spot3": "spot3", "floor_robust_spot1": "spot1"}
FLOORS = ("floor_allreduce", "floor_alltoall", *DESIGNS)
LM_RUNS = 8  # clean runs (seeds) of the small-batch transformer (2 with --quick)
GOALS = {"worst_loss_ratio": 1.05, "max_steps_to_quarantine": 3, "false_quarantines": 0,
         "clean_overhead": 0.10}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--attack", choices=ATTACK_CHOICES, action="append",
                        help="an attack to run (repeatable; default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps, clean runs and timing rounds (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    parser.add_argument("--sync", choices=SYNCS, default="every-step",
                        help="every-step (default): gradients averaged each step; diloco: "
                             "rounds of local steps, attacks on a round's pseudo-gradient "
                             "(adds ipm, free_rider, free_rider_scaled, copy, replay, "
                             "other_data; drops stale, bit_flip)")
    parser.add_argument("--inner-steps", type=int, metavar="H",
                        help="with --sync diloco: local steps a round (default 16, 8 "
                             "with --quick); trust's cost is per round, so its overhead "
                             "falls as H grows")
    parser.add_argument("--rounds", type=int, metavar="R",
                        help="with --sync diloco: rounds a run (default 16, 10 with "
                             "--quick; at least 12 for the full figures)")
    parser.add_argument("--seeds", type=int, metavar="S",
                        help="with --sync diloco: seeds per attack (default 3, 1 with "
                             "--quick)")


@dataclass(frozen=True)
class ByzantineConfig:
    attacks: tuple[str, ...]
    steps: int
    clean_runs: int  # the MLP's clean runs with trust (false quarantines)
    rounds: int  # of the overhead's timing
    seeds: int  # per attack
    lm_runs: int  # the small-batch transformer's clean runs
    quick: bool


def config_from_args(args: argparse.Namespace) -> ByzantineConfig:
    wrong = [a for a in args.attack or () if a not in ATTACKS]
    if wrong:
        raise ConfigError(f"--attack {wrong[0]} attacks a round's pseudo-gradient: add "
                          f"--sync diloco, or choose from {', '.join(ATTACKS)}")
    for flag in ("inner_steps", "rounds", "seeds"):
        if getattr(args, flag, None) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} sets the rounds bench: add "
                              "--sync diloco")
    steps, clean_runs, rounds = (30, 4, 2) if args.quick else (60, 20, 4)
    return ByzantineConfig(tuple(args.attack or ATTACKS), steps, clean_runs, rounds,
                           1 if args.quick else SEEDS, 2 if args.quick else LM_RUNS,
                           bool(args.quick))


def main(args: argparse.Namespace) -> int:
    if getattr(args, "sync", "every-step") == "diloco":
        return drive(byzantine_rounds.BENCH, args)
    return drive(BENCH, args)


def measure(config: ByzantineConfig, logs: Path) -> dict[str, Any]:
    """Each attack's runs, the clean runs, the overheads; a line per attack as it ends."""
    steps, seeds = config.steps, range(config.seeds)
    started = time.monotonic()
    baselines = [_run("none", False, seed, steps)["loss"] for seed in seeds]
    print(f"clean runs (plain mean, no attacker): held-out loss "
          f"{', '.join(f'{b:.4f}' for b in baselines)} (seeds {', '.join(map(str, seeds))})")
    results: dict[str, dict[str, Any]] = {}
    for attack in config.attacks:
        ratios: dict[str, list[float]] = {"plain": [], "trust": []}
        caught: list[int | None] = []
        for seed in seeds:
            for contender in interleaved(("plain", "trust"), 1):
                run = _run(attack, contender == "trust", seed, steps, spot=SPOT_EVERY)
                ratios[contender].append(_ratio(run["loss"], baselines[seed]))
                if contender == "trust":
                    caught.append(_steps_to_quarantine(run))
        row: dict[str, Any] = {
            "plain": median(ratios["plain"]), "trust": median(ratios["trust"]),
            "trust_worst_seed": max(ratios["trust"]), "trust_by_seed": ratios["trust"],
            "steps_to_quarantine": (None if None in caught
                                    else max(c for c in caught if c is not None)),
            "steps_to_quarantine_by_seed": caught}
        results[attack] = row
        print(f"  {attack}: plain {row['plain']:.4g}x, trust {row['trust']:.4g}x (worst seed "
              f"{row['trust_worst_seed']:.4g}x), quarantined after {caught} step(s)",
              flush=True)
    false = 0
    for seed in range(config.clean_runs):
        run = _run("none", True, seed, steps, spot=SPOT_EVERY)
        false += any(e["event"] == "quarantine" for e in run["events"])
    lm_false, lm_far = 0, 0
    for seed in range(config.lm_runs):  # the transformer's honest copies are now and then far
        lm = run_ranks(byzantine_lm.run_rank, WORKERS, free_port(), seed, init_group=False,
                       timeout=600)[0]
        lm_false += bool(lm["quarantined"])
        lm_far += len(lm["far"])
    return {"baselines": baselines, "attacks": results, "false": false, "lm_false": lm_false,
            "lm_far": lm_far, "overhead": _overhead(config.rounds, steps),
            "seconds": time.monotonic() - started}


def figures(config: ByzantineConfig, results: dict[str, Any]) -> dict[str, Any]:
    """The four figures the goals are for."""
    attacks = results["attacks"]
    gross = [r["steps_to_quarantine"] for a, r in attacks.items() if a in GROSS]
    return {"worst_loss_ratio": max((r["trust"] for r in attacks.values()), default=math.nan),
            "max_steps_to_quarantine": max((math.inf if s is None else s for s in gross),
                                           default=math.nan),
            "false_quarantines": results["false"] + results["lm_false"],
            "clean_overhead": results["overhead"]["overhead"]}


def report_lines(config: ByzantineConfig, results: dict[str, Any]) -> list[str]:
    """The attacks' table, the figures against their goals, the overheads."""
    attacks, overhead = results["attacks"], results["overhead"]
    worst, max_steps = (figures(config, results)[k]
                        for k in ("worst_loss_ratio", "max_steps_to_quarantine"))
    false, lm_false = results["false"], results["lm_false"]
    design = {k: f"{overhead[f'design_{k}_ms']:.2f} ms ({overhead[f'design_{k}']:+.3f})"
              for k in ("spot3", "audit", "robust", "spot1")}
    return [
        "",
        table(["attack", "plain mean loss / clean", "trust loss / clean",
               "trust, worst seed", "steps to quarantine (most)"],
              [[a, r["plain"], r["trust"], r["trust_worst_seed"],
                "-" if r["steps_to_quarantine"] is None else r["steps_to_quarantine"]]
               for a, r in attacks.items()]),
        "",
        f"worst_loss_ratio {worst:.4f} (goal <= {GOALS['worst_loss_ratio']}; the worst "
        f"attack's median over {config.seeds} seed(s))",
        f"max_steps_to_quarantine {max_steps} (goal <= {GOALS['max_steps_to_quarantine']}"
        f", over {', '.join(a for a in config.attacks if a in GROSS) or 'no gross attack'})",
        f"false_quarantines {false + lm_false} of {config.clean_runs + config.lm_runs} clean "
        f"runs (goal 0): the MLP {false} of {config.clean_runs}; a char transformer, one "
        f"sample a worker a step, {lm_false} of {config.lm_runs} ({results['lm_far']} honest "
        "far steps in all)",
        f"clean_overhead {overhead['overhead']:+.3f} (step {overhead['trust_ms']:.2f} ms "
        f"with trust vs {overhead['plain_ms']:.2f} ms without; goal <= "
        f"{GOALS['clean_overhead']})",
        f"  without spot checks (Trust()): {overhead['overhead_no_spot']:+.3f} (step "
        f"{overhead['no_spot_ms']:.2f} ms)",
        f"  without audits either (Trust(audit_every=0)): "
        f"{overhead['overhead_no_audit']:+.3f} (step {overhead['no_audit_ms']:.2f} ms)",
        f"  a model {WIDE} wide (1.1M parameters), without spot checks: "
        f"{overhead['overhead_wide']:+.3f} (step {overhead['wide_trust_ms']:.2f} ms vs "
        f"{overhead['wide_plain_ms']:.2f} ms)",
        f"  the same step in raw torch (byzantine_floor.py: no potluck code), with one "
        f"all-reduce {overhead['floor_allreduce_ms']:.2f} ms, with trust's two all-to-alls "
        f"{overhead['floor_alltoall_ms']:.2f} ms "
        f"({overhead['floor_alltoall_ms'] / overhead['floor_allreduce_ms'] - 1:+.3f})",
        f"  trust's design in raw torch (byzantine_floor.py: its checks' work, none of "
        f"potluck's bookkeeping), added to that all-reduce's step (and over potluck's "
        f"plain step): with the spot checks above {design['spot3']}, Trust()'s checks "
        f"{design['audit']}, without audits {design['robust']}; spot checks by one "
        f"checker instead of three {design['spot1']}",
        f"({results['seconds']:.0f} s)",
    ]


def report_json(config: ByzantineConfig, results: dict[str, Any]) -> dict[str, Any]:
    overhead = results["overhead"]
    return {**figures(config, results), "goals": GOALS, "attacks": results["attacks"],
            "clean_loss": results["baselines"], "seeds": config.seeds,
            "clean_runs": config.clean_runs,
            "false_quarantines_by_workload": {
                "mlp": [results["false"], config.clean_runs],
                "char_transformer": [results["lm_false"], config.lm_runs]},
            "honest_far_steps_char_transformer": results["lm_far"],
            "steps": config.steps, "workers": WORKERS, "attacker_rank": ATTACKER,
            "clean_overhead_without_spot_checks": overhead["overhead_no_spot"],
            "spot_every": SPOT_EVERY,
            "clean_overhead_wide_model": overhead["overhead_wide"],
            "clean_overhead_without_audits": overhead["overhead_no_audit"],
            "design_floor": {k.removeprefix("design_"): overhead[k]
                             for k in overhead if k.startswith("design_")},
            "step_ms": {k: overhead[k] for k in
                        ("plain_ms", "trust_ms", "no_spot_ms", "no_audit_ms",
                         "wide_plain_ms", "wide_trust_ms", "floor_allreduce_ms",
                         "floor_alltoall_ms")},
            "quick": config.quick}


BENCH = Bench("byzantine", config_from_args, measure, report_lines, report_json)


def _run(attack: str, trust: bool, seed: int, steps: int, wrap: bool = True,
         spot: int = 0, **extra: Any) -> dict[str, Any]:
    spec = {"attack": attack, "trust": trust, "seed": seed, "steps": steps, "wrap": wrap,
            "spot": spot, **extra}
    results = run_ranks(run_rank, WORKERS, free_port(), spec, init_group=False, timeout=300)
    return results[0]  # type: ignore[no-any-return]


def _ratio(loss: float, clean: float) -> float:
    return loss / clean if math.isfinite(loss) else math.inf


def _steps_to_quarantine(run: dict[str, Any]) -> int | None:
    caught = [e for e in run["events"] if e["event"] == "quarantine"
              and e["member"] == f"rank{ATTACKER}"]
    return caught[0]["step"] - run["start"] + 1 if caught else None


def _mean_step(times: list[float]) -> float:
    """A run's time per step past its first 5 (the buckets are rebuilt after the first
    pass): the mean, not the median, so that the steps with a spot check or an audit,
    one in K, count for what they cost."""
    tail = times[5:] or times
    return sum(tail) / len(tail)


def _over(contender: list[float], base: list[float]) -> float:
    """The median over rounds of the contender's step over the base's in the same
    round (the rounds interleave them), minus 1."""
    return median([c / b for c, b in zip(contender, base, strict=True)]) - 1


def _overhead(rounds: int, steps: int) -> dict[str, float]:
    """Step times on a clean run (each round's mean per step, ``_mean_step``; the
    median over the rounds, and of the rounds' ratios for the overheads, ``_over``):
    plain mean, trust with spot checks, trust without; and plain against trust without
    spot checks on a model ``WIDE`` wide (1.1M parameters: trust's work grows with the
    gradient, the step's compute with the samples too); and the floor: the same step
    in raw torch, its gradient synchronized by one all-reduce or by trust's two
    all-to-alls, and trust's design in raw torch (``byzantine_floor``'s robust modes:
    ``design_*`` is what each adds to the raw all-reduce's step of its round, over
    potluck's plain step of that round, the base of the other overheads; ``_ms`` in
    milliseconds)."""
    contenders = ("plain", "trust", "no_spot", "no_audit", "wide_plain", "wide_trust",
                  *FLOORS)
    times: dict[str, list[float]] = {k: [] for k in contenders}
    for contender in interleaved(contenders, rounds):
        if contender.startswith("floor_"):
            spec = {"mode": contender.removeprefix("floor_"), "steps": steps}
            times[contender].append(_mean_step(
                run_ranks(run_floor, WORKERS, spec, timeout=300)[0]["times"]))
            continue
        extra: dict[str, Any] = {"hidden": WIDE} if contender.startswith("wide_") else {}
        if contender == "no_audit":
            extra["audit_every"] = 0
        run = _run("none", contender not in ("plain", "wide_plain"), 0, steps, wrap=False,
                   spot=SPOT_EVERY if contender == "trust" else 0, **extra)
        times[contender].append(_mean_step(run["times"]))
    plain, trust, no_spot, no_audit, wide_plain, wide_trust, floor_ar, floor_a2a = (
        median(times[k]) for k in ("plain", "trust", "no_spot", "no_audit", "wide_plain",
                                   "wide_trust", "floor_allreduce", "floor_alltoall"))
    designs: dict[str, float] = {}
    for name, short in DESIGNS.items():  # what each adds to the raw step, over the plain
        key = f"design_{short}"
        added = [d - a for d, a in zip(times[name], times["floor_allreduce"], strict=True)]
        designs[key] = median([x / p for x, p in zip(added, times["plain"], strict=True)])
        designs[f"{key}_ms"] = median(added) * 1e3
    return {**designs, "plain_ms": plain * 1e3, "trust_ms": trust * 1e3,
            "no_spot_ms": no_spot * 1e3, "no_audit_ms": no_audit * 1e3,
            "overhead": _over(times["trust"], times["plain"]),
            "overhead_no_spot": _over(times["no_spot"], times["plain"]),
            "overhead_no_audit": _over(times["no_audit"], times["plain"]),
            "wide_plain_ms": wide_plain * 1e3, "wide_trust_ms": wide_trust * 1e3,
            "overhead_wide": _over(times["wide_trust"], times["wide_plain"]),
            "floor_allreduce_ms": floor_ar * 1e3, "floor_alltoall_ms": floor_a2a * 1e3}
