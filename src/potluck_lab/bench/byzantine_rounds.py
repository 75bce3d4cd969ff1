"""``potluck bench byzantine --sync diloco``: 4 workers under DiLoCo, 1 attacker; plain
DiLoCo (the mean of the pseudo-gradients) vs DiLoCo with trust (its work check of every
member every round included).

The task is the every-step bench's MLP, ``ROUNDS`` rounds of ``INNER_STEPS`` local steps.
Rank 3 attacks its pseudo-gradient (``potluck_lab.round_attacks``). Each attack runs with
each of ``SEEDS`` seeds, the two contenders interleaved. Reported per attack: an honest
replica's final held-out loss over the same seed's clean run (plain DiLoCo, no
attacker), per contender; the rounds from the attack's first corrupted round to the
attacker's quarantine. Then quarantines over clean runs with trust (false ones), and a
round's wall time with trust over without (interleaved clean runs, with a third
contender: plain DiLoCo with one all-gather of the pseudo-gradient more a round, the
raw cost of a collective on this machine).

Where ``prepare`` refuses trust with rounds, the trust contender is reported "not
available" and its figures are None. The first clean run with trust finds that out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from potluck.errors import ConfigError
from potluck.testing import free_port, run_ranks
from potluck_lab.bench import byzantine_rounds_figures as fig
from potluck_lab.bench.byzantine_job import ATTACKER
from potluck_lab.bench.byzantine_rounds_job import run_rank
from potluck_lab.common import interleaved, median, table
from potluck_lab.driver import Bench
from potluck_lab.round_attacks import ROUND_ATTACKS

WORKERS = 4
# H: a round is 16 global batches of 256. Trust's cost is per round, so a user takes H
# as large as the checks allow: at H = 32 and 64 the work check caught ALIE and a
# copier only at rounds 5 and 6; at 16 it still does so by round 3.
INNER_STEPS = 16  # (8 with --quick: a run that checks the bench works, not its figures)
ROUNDS = 16  # per run (10 with --quick)
SEEDS = 3  # per attack (1 with --quick)
CLEAN_RUNS = 20  # with trust, for false quarantines (4 with --quick)
TIMING = 4  # interleaved rounds of clean runs that time a round (2 with --quick)


@dataclass(frozen=True)
class RoundsConfig:
    attacks: tuple[str, ...]
    rounds: int
    inner_steps: int
    seeds: int
    clean_runs: int
    timing: int
    quick: bool


def config_from_args(args: Any) -> RoundsConfig:
    wrong = [a for a in args.attack or () if a not in ROUND_ATTACKS]
    if wrong:
        raise ConfigError(f"--attack {wrong[0]} attacks each step's gradient, not a round's "
                          f"pseudo-gradient; with --sync diloco choose from "
                          f"{', '.join(ROUND_ATTACKS)}")
    quick = bool(args.quick)
    inner_steps = _positive(args, "inner_steps", 8 if quick else INNER_STEPS)
    rounds = _positive(args, "rounds", 10 if quick else ROUNDS)
    if rounds < 3:
        raise ConfigError(f"--rounds {rounds}: the timing reads rounds past the first, and "
                          "a quarantine takes up to 3; pass at least 3 (12 for the "
                          "full figures)")
    return RoundsConfig(tuple(dict.fromkeys(args.attack or ROUND_ATTACKS)), rounds,
                        inner_steps, _positive(args, "seeds", 1 if quick else SEEDS),
                        4 if quick else CLEAN_RUNS, 2 if quick else TIMING, quick)


def _positive(args: Any, name: str, default: int) -> int:
    value = getattr(args, name, None)
    if value is None:
        return default
    if value < 1:
        raise ConfigError(f"--{name.replace('_', '-')} {value}: pass a whole number of at "
                          f"least 1 (default {default})")
    return int(value)


def measure(config: RoundsConfig, logs: Path) -> dict[str, Any]:
    """The clean runs, each attack's runs, the false quarantines, the overhead; a line
    per attack as it ends."""
    started, seeds = time.monotonic(), range(config.seeds)
    probe = _run(config, "none", True, 0)  # also the first clean run with trust
    unavailable = probe["unavailable"]
    if unavailable:
        print(f"trust: not available under rounds ({unavailable})", flush=True)
    contenders = ("plain",) if unavailable else ("plain", "trust")
    baselines = [_run(config, "none", False, seed)["loss"] for seed in seeds]
    honest = [_run(config, "none", False, seed, workers=WORKERS - 1)["loss"] for seed in seeds]
    print(f"clean runs (plain DiLoCo, no attacker): held-out loss "
          f"{', '.join(f'{b:.4f}' for b in baselines)} (seeds {', '.join(map(str, seeds))}); "
          f"the {WORKERS - 1} honest members alone: {', '.join(f'{h:.4f}' for h in honest)}",
          flush=True)
    attacks = {attack: _attack(config, attack, contenders, baselines, honest)
               for attack in config.attacks}
    false: int | None = None
    overhead: float | None = None
    round_ms: dict[str, float] = {}
    if not unavailable:
        runs = [probe] + [_run(config, "none", True, seed)
                          for seed in range(1, config.clean_runs)]
        false = sum(fig.any_quarantine(r["events"]) for r in runs)
        overhead, round_ms = _overhead(config)
    return {"baselines": baselines, "honest": honest, "attacks": attacks, "false": false,
            "overhead": overhead, "round_ms": round_ms, "unavailable": unavailable,
            "seconds": time.monotonic() - started}


def _attack(config: RoundsConfig, attack: str, contenders: tuple[str, ...],
            baselines: list[float], honest: list[float]) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {c: [] for c in contenders}
    vs_honest: list[float] = []
    caught: list[int | None] = []
    quarantined = 0  # honest members quarantined
    for seed in range(config.seeds):
        for contender in interleaved(contenders, 1):
            run = _run(config, attack, contender == "trust", seed)
            ratios[contender].append(fig.ratio(run["loss"], baselines[seed]))
            if contender == "trust":
                vs_honest.append(fig.ratio(run["loss"], honest[seed]))
                rounds, others = fig.quarantines(run["events"], ATTACKER)
                caught.append(fig.rounds_to_quarantine(rounds, run["start"]))
                quarantined += others
    trust = "trust" in contenders
    row = fig.attack_row(ratios["plain"], ratios["trust"] if trust else None,
                         caught if trust else None, quarantined,
                         vs_honest if trust else None)
    said = (f"trust {row['trust']:.4g}x (worst seed {row['trust_worst_seed']:.4g}x; "
            f"{row['trust_vs_honest']:.4g}x the honest members alone), quarantined after "
            f"{caught} round(s), {quarantined} honest member(s) quarantined"
            if trust else "trust not available")
    print(f"  {attack}: plain DiLoCo {row['plain']:.4g}x, {said}", flush=True)
    return row


def _overhead(config: RoundsConfig) -> tuple[float, dict[str, float]]:
    """Clean runs without the attack wrapper, plain, trust and the floor (plain with
    one all-gather of the pseudo-gradient more a round) interleaved: each run's mean
    round past its first; the median over timing rounds of trust's ratio to plain.
    ``round_ms`` also holds the floor's, so the report says what one collective more
    costs on this machine, in the same run."""
    times: dict[str, list[float]] = {"plain": [], "trust": [], "floor": []}
    for contender in interleaved(("plain", "trust", "floor"), config.timing):
        run = _run(config, "none", contender == "trust", 0, wrap=False,
                   floor=contender == "floor")
        times[contender].append(fig.mean_round(run["round_times"]))
    return (fig.overhead(times["trust"], times["plain"]),
            {**{k: median(v) * 1e3 for k, v in times.items()},
             "floor_overhead": fig.overhead(times["floor"], times["plain"])})


def report_lines(config: RoundsConfig, results: dict[str, Any]) -> list[str]:
    """The attacks' table, the figures beside their goals."""
    attacks, unavailable = results["attacks"], results["unavailable"]
    f = fig.figures(attacks, results["false"], results["overhead"], not unavailable)
    hurt = ", ".join(f["hurt_attacks"]) or "none"
    lines = ["", table(
        ["attack", "plain DiLoCo loss / clean", "trust loss / clean", "trust, worst seed",
         "rounds to quarantine (most)"],
        [[a, r["plain"], *(_cell(r[k], unavailable) for k in
                           ("trust", "trust_worst_seed", "rounds_to_quarantine"))]
         for a, r in attacks.items()]),
        "", f"attacks that hurt plain DiLoCo (loss ratio > {fig.HURT}): {hurt}"]
    goals = fig.GOALS
    if unavailable:
        return [*lines, f"trust contender: not available ({unavailable})",
                f"worst_loss_ratio, max_rounds_to_quarantine, false_quarantines, "
                f"clean_overhead: not measured (goals <= {goals['worst_loss_ratio']} where "
                f"plain DiLoCo is hurt, <= {goals['max_rounds_to_quarantine']} rounds, 0, "
                f"<= {goals['clean_overhead']})", f"({results['seconds']:.0f} s)"]
    ms = results["round_ms"]
    return [*lines,
            f"worst_loss_ratio {f['worst_loss_ratio']:.4f}, where plain DiLoCo is hurt "
            f"{f['worst_loss_ratio_where_hurt']:.4f} (goal <= {goals['worst_loss_ratio']} "
            f"there; the worst attack's median over {config.seeds} seed(s))",
            f"  against a clean run of the {WORKERS - 1} honest members alone, where plain "
            f"DiLoCo is hurt: {f['worst_loss_ratio_where_hurt_vs_honest']:.4f}",
            f"max_rounds_to_quarantine {f['max_rounds_to_quarantine']} (goal <= "
            f"{goals['max_rounds_to_quarantine']}, over every attack)",
            f"false_quarantines {f['false_quarantines']} of {config.clean_runs} clean runs "
            f"(goal 0)",
            f"clean_overhead {f['clean_overhead']:+.3f} (round {ms['trust']:.1f} ms with "
            f"trust vs {ms['plain']:.1f} ms without, H = {config.inner_steps}; goal <= "
            f"{goals['clean_overhead']})",
            *([f"  the floor: one all-gather of the pseudo-gradient more a round costs "
               f"{ms['floor_overhead']:+.3f} ({ms['floor']:.1f} ms a round), the same run"]
              if "floor" in ms else []),
            f"({results['seconds']:.0f} s)"]


def report_json(config: RoundsConfig, results: dict[str, Any]) -> dict[str, Any]:
    unavailable = results["unavailable"]
    return {**fig.figures(results["attacks"], results["false"], results["overhead"],
                          not unavailable),
            "goals": fig.GOALS,
            "trust_contender": "not available" if unavailable else "available",
            "trust_unavailable": unavailable, "attacks": results["attacks"],
            "clean_loss": results["baselines"],
            "clean_loss_honest_members": results.get("honest"), "seeds": config.seeds,
            "clean_runs": config.clean_runs, "rounds": config.rounds,
            "inner_steps": config.inner_steps, "workers": WORKERS,
            "attacker_rank": ATTACKER, "round_ms": results["round_ms"] or None,
            "sync": "diloco", "quick": config.quick}


BENCH = Bench("byzantine", config_from_args, measure, report_lines, report_json)


def _run(config: RoundsConfig, attack: str, trust: bool, seed: int,
         wrap: bool = True, floor: bool = False, workers: int = WORKERS) -> dict[str, Any]:
    spec = {"attack": attack, "trust": trust, "seed": seed, "rounds": config.rounds,
            "inner_steps": config.inner_steps, "wrap": wrap, "floor": floor}
    results = run_ranks(run_rank, workers, free_port(), spec, init_group=False, timeout=300)
    return results[0]  # type: ignore[no-any-return]


def _cell(value: Any, unavailable: str | None) -> Any:
    """A trust cell: "n/a" where trust was not available, "-" for never caught."""
    if unavailable:
        return "n/a"
    return "-" if value is None else value
