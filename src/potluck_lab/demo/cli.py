"""Train a tiny character-level transformer on 2 local workers and report the figures.

Trains on the Python standard library's own source with ``potluck.DataParallel`` on N
local workers started by the launcher, as ``potluck run`` starts a user's script (Gloo,
1 thread each; ``demo/phase.py``), then runs a short 1-worker phase on the same model
and global batch to measure the speedup in the same run, and prints throughput,
speedup, scaling efficiency, sync latency and a sample of generated text.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from potluck.errors import ConfigError
from potluck.metrics.figures import scaling_figures
from potluck_lab.demo.chaos import CHAOS_METRICS
from potluck_lab.demo.phase import PhaseFailed, run_phase
from potluck_lab.demo.presets import FULL, QUICK, Preset, check_seed, sized
from potluck_lab.demo.progress import choose_display
from potluck_lab.demo.report import (
    equivalence_line,
    figures_table,
    loss_summary,
    sample_block,
    sync_latency,
    too_short_to_compare,
)
from potluck_lab.demo.train import TrainConfig, WorkerResult
from potluck_lab.demo.uneven import UNEVEN_METRICS
from potluck_lab.demo.uneven import add_arguments as add_uneven_arguments
from potluck_lab.demo.wan import add_arguments as add_wan_arguments
from potluck_lab.models import ModelConfig
from potluck_lab.text import Vocabulary, load_corpus, stdlib_dir

METRICS = Path("runs/demo/metrics.jsonl")  # the plain demo's; the chaos demo has its own
CHECKPOINTS = Path("runs/demo/checkpoints")  # the plain demo's; the others keep none
CHECKPOINT_EVERY = 100
SEED = 0


@dataclass(frozen=True)
class DemoConfig:
    workers: int
    seed: int
    metrics: Path
    preset: Preset
    baseline: bool
    progress: bool
    checkpoint_dir: Path
    checkpoint_every: int
    resume: bool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (__doc__ or "").replace("``", "")  # reST markup, not help text
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # keep its paragraphs
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (2)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"global steps ({FULL.steps}; {QUICK.steps} with --quick)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"global batch in sequences, split evenly over the workers "
                             f"({FULL.global_batch}; {QUICK.global_batch} with --quick)")
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"seed of corpus, model, data ({SEED})")
    parser.add_argument("--metrics", type=Path, default=None,
                        help="per-step JSON lines (potluck.metrics.journal 'step' records): "
                             "step, loss, step_s, samples_per_s, tokens_per_s, sync_s, lr, "
                             f"workers, shares ({METRICS}; {CHAOS_METRICS} with --chaos, "
                             f"{UNEVEN_METRICS} with --uneven, so that neither overwrites "
                             "the plain demo's)")
    parser.add_argument("--baseline-steps", type=int, default=None,
                        help=f"steps of the 1-worker phase that measures the speedup "
                             f"({FULL.baseline_steps}; {QUICK.baseline_steps} with --quick)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the 1-worker phase (no speedup or efficiency)")
    parser.add_argument("--quick", action="store_true",
                        help="the same model, 40 steps and a 25-step baseline: about 20 s "
                             "(tests)")
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress (a bar on a terminal, a line every tenth of "
                             "the run when output goes to a file or a pipe)")
    # None when not given: the demos that keep no checkpoints refuse them when given
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help=f"where checkpoints go ({CHECKPOINTS})")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="steps between checkpoints; 0 saves only at the end "
                             f"({CHECKPOINT_EVERY})")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest good checkpoint in --checkpoint-dir")
    parser.add_argument("--chaos", action="store_true",
                        help="train elastically under the launcher and SIGKILL worker 1 a "
                             "third of the way through: it is restarted and rejoins, the run "
                             "carries on, every membership change is shown (no baseline, no "
                             "checkpoints; needs --workers 2 or more)")
    parser.add_argument("--uneven", action="store_true",
                        help="train with balancing on (potluck run --balance) while worker 1 "
                             "is slowed to 0.4 of a core (a cgroup v1 CPU quota as root, else "
                             "a sleep per sample, said so on screen): the shares of each step "
                             "move to the faster worker on screen and in the metrics, then "
                             "a few steps on equal shares to compare (no 1-worker baseline, "
                             "no checkpoints; needs --workers 2 or more)")
    parser.add_argument("--wan", action="store_true",
                        help="torch DDP beside potluck DiLoCo, two workers on two hosts joined "
                             "by a rate-limited link (network namespaces and tc tbf: needs "
                             "root), in about a minute")
    add_uneven_arguments(parser)
    add_wan_arguments(parser)


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """Validate the flags; raises ConfigError naming the value, the rule and the fix."""
    preset = sized(args, FULL, QUICK)
    if args.baseline_steps is not None:
        preset = replace(preset, baseline_steps=args.baseline_steps)
    _require(args.workers >= 1,
             f"--workers {args.workers}: need at least 1 worker; use e.g. --workers 2")
    _require(preset.steps >= 1,
             f"--steps {preset.steps}: need at least 1 step; use e.g. --steps {FULL.steps}")
    _require(preset.baseline_steps >= 1,
             f"--baseline-steps {preset.baseline_steps}: need at least 1 step "
             "(use --no-baseline to skip the 1-worker phase)")
    per_worker = max(1, preset.global_batch // max(1, args.workers))
    _require(preset.global_batch >= args.workers and preset.global_batch % args.workers == 0,
             f"global batch {preset.global_batch} (--batch-size) does not split evenly over "
             f"--workers {args.workers}: the global batch must be a positive multiple of the "
             f"worker count; use e.g. --batch-size {args.workers * per_worker}")
    check_seed(args.seed)
    every = CHECKPOINT_EVERY if args.checkpoint_every is None else args.checkpoint_every
    _require(every >= 0, f"--checkpoint-every {every}: must be >= 0 (0: only at the end); "
                         f"use e.g. --checkpoint-every {CHECKPOINT_EVERY}")
    return DemoConfig(
        workers=args.workers,
        seed=args.seed,
        metrics=METRICS if args.metrics is None else args.metrics,
        preset=preset,
        baseline=not args.no_baseline and args.workers > 1,
        progress=not args.no_progress,
        checkpoint_dir=CHECKPOINTS if args.checkpoint_dir is None else args.checkpoint_dir,
        checkpoint_every=every,
        resume=args.resume,
    )


# Per demo, the plain demo's flags it has no use for, and why. (--resume with --chaos or
# --uneven is refused by the demo itself, with its own reason.)
_BASELINE_AND_CHECKPOINTS = ("--baseline-steps", "--no-baseline", "--checkpoint-dir",
                             "--checkpoint-every")
_UNUSED: dict[str, tuple[tuple[str, ...], str]] = {
    "--wan": (
        ("--resume", "--steps", "--batch-size", *_BASELINE_AND_CHECKPOINTS, "--metrics",
         "--seed"),
        "the WAN demo keeps no checkpoints or metrics file and sets its own steps, batch "
        "and seed (only --quick and --bandwidth change it)"),
    "--chaos": (
        _BASELINE_AND_CHECKPOINTS,
        "the chaos demo runs no 1-worker baseline and keeps no checkpoints (a restarted "
        "worker receives the live state from the others)"),
    "--uneven": (
        _BASELINE_AND_CHECKPOINTS,
        "the uneven demo runs no 1-worker baseline (it compares balanced with equal shares "
        "instead) and keeps no checkpoints"),
}


def check_demo_flags(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen demo would silently ignore, before any demo runs:
    two demos at once, ``--bandwidth`` without ``--wan``, and the plain demo's flags
    that the chosen one has no use for (``_UNUSED``)."""
    chosen = [f"--{name}" for name in ("wan", "chaos", "uneven") if getattr(args, name)]
    if len(chosen) > 1:
        raise ConfigError(f"{' with '.join(chosen)}: they are separate demos; run one at a "
                          f"time, e.g. potluck demo {chosen[0]}")
    if args.bandwidth is not None and not args.wan:
        raise ConfigError(f"--bandwidth {args.bandwidth} is the link rate of the --wan demo "
                          "only: add --wan, or drop --bandwidth")
    if not chosen:
        return
    unused, why = _UNUSED[chosen[0]]
    given = _given(args)
    ignored = [flag for flag in unused if given[flag]]
    _require(not ignored, f"{', '.join(ignored)} with {chosen[0]}: {why}; drop "
                          f"{', '.join(ignored)}")


def _given(args: argparse.Namespace) -> dict[str, bool]:
    """Which of the plain demo's flags were given: not left at their defaults."""
    return {
        "--resume": args.resume, "--steps": args.steps is not None,
        "--batch-size": args.batch_size is not None,
        "--baseline-steps": args.baseline_steps is not None,
        "--no-baseline": args.no_baseline, "--metrics": args.metrics is not None,
        "--checkpoint-dir": args.checkpoint_dir is not None,
        "--checkpoint-every": args.checkpoint_every is not None,
        # the chaos and uneven demos read --seed, so its default stays 0 (not None):
        # --seed 0 asks for nothing the WAN demo would leave out
        "--seed": args.seed != SEED,
    }


def metrics_path(args: argparse.Namespace) -> Path:
    """Where the chosen demo writes its per-step metrics."""
    if args.metrics is not None:
        return Path(args.metrics)
    return CHAOS_METRICS if args.chaos else UNEVEN_METRICS if args.uneven else METRICS


def check_metrics_path(path: Path) -> None:
    """The metrics file must be writable: refused now, not after the workers started.
    Its directory is created if missing (the demo would create it anyway)."""
    if path.is_dir():
        raise ConfigError(f"--metrics {path} is a directory: name a file in it, e.g. "
                          f"--metrics {path / 'metrics.jsonl'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".potluck-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--metrics {path}: cannot write in {path.parent} "
                          f"({exc.strerror or exc}); name a file in a directory this user "
                          f"can write, e.g. --metrics {METRICS}") from exc


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# The other demos, each a module with ``main(args) -> int``.
_DEMOS = {"uneven": "potluck_lab.demo.uneven", "chaos": "potluck_lab.demo.chaos",
          "wan": "potluck_lab.demo.wan"}


def main(args: argparse.Namespace) -> int:
    """Run the chosen demo; 0 on success, 2 on a bad flag (a ``ConfigError`` from any
    demo), 1 if a worker failed, 130 on Ctrl-C."""
    try:
        check_demo_flags(args)
        if not args.wan:
            check_metrics_path(metrics_path(args))
        chosen = next((module for name, module in _DEMOS.items() if getattr(args, name)),
                      None)
        if chosen is not None:
            result: int = importlib.import_module(chosen).main(args)
            return result
        return _plain(config_from_args(args))
    except ConfigError as exc:
        print(f"potluck demo: error: {exc}", file=sys.stderr)
        return 2


def _plain(config: DemoConfig) -> int:
    """The plain demo: N workers, then the 1-worker baseline, then the report."""
    started = time.perf_counter()
    preset = config.preset
    text = load_corpus(preset.corpus_chars, config.seed)
    vocab = Vocabulary.from_text(text)
    train = TrainConfig(
        model=ModelConfig(vocab.size, preset.context, preset.d_model, preset.n_layers),
        steps=preset.steps,
        global_batch=preset.global_batch,
        seed=config.seed,
        label=f"{config.workers} workers",
        metrics_path=str(config.metrics),
        progress=config.progress,
        sample_chars=preset.sample_chars,
        checkpoint_dir=str(config.checkpoint_dir),
        checkpoint_every=config.checkpoint_every,
        resume=config.resume,
    )
    _print_header(config, train, len(text), vocab.size)
    run_dir = config.metrics.parent
    display = choose_display(config.progress, sys.stdout, sys.stderr)
    try:
        result = run_phase(train, config.workers, preset.corpus_chars, run_dir,
                           display=display)
        if not result.losses:
            print(f"potluck demo: nothing to train: the newest checkpoint in "
                  f"{config.checkpoint_dir} is already at step {result.first_step} of "
                  f"--steps {preset.steps}; pass a larger --steps to train on, or drop "
                  "--resume to start afresh")
            return 0
        baseline = None
        if config.baseline:
            print(f"measuring the 1-worker baseline ({preset.baseline_steps} steps, "
                  "same model and global batch)", flush=True)
            # Same schedule as the N-worker run, cut short: its losses must match.
            one = replace(train, stop_after=min(preset.baseline_steps, preset.steps),
                          label="1 worker", metrics_path=None, sample_chars=0,
                          checkpoint_dir=None, resume=False)
            baseline = run_phase(one, 1, preset.corpus_chars, run_dir, display=display)
    except PhaseFailed as exc:
        print(f"potluck demo: a worker failed:\n{exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the launcher has already stopped the workers
        print("\npotluck demo: interrupted", file=sys.stderr)
        return 130
    _print_report(config, train, result, baseline)
    _print_plots(run_dir)
    print(f"done in {time.perf_counter() - started:.1f} s; per-step metrics in "
          f"{config.metrics}")
    return 0


def _print_plots(run_dir: Path) -> None:
    """Write the run's plots (``potluck plot``) and say where they are."""
    from potluck.metrics.plots import load_run, write_plots

    try:
        written = write_plots(load_run(run_dir), run_dir / "plots")
    except (ConfigError, OSError) as exc:
        print(f"no plots: {exc}")
        return
    print(f"plots in {run_dir / 'plots'}: {', '.join(p.name for p in written)} "
          f"(again any time: potluck plot {run_dir})")


def _print_header(config: DemoConfig, train: TrainConfig, chars: int, vocab: int) -> None:
    model = train.model
    local = train.global_batch // config.workers
    print(f"potluck demo: a {model.n_layers}-layer character transformer (d_model "
          f"{model.d_model}, context {model.context}) on {chars:,} characters of Python "
          f"stdlib source from {stdlib_dir()} ({vocab} distinct characters)")
    print(f"{config.workers} workers x 1 thread on Gloo, global batch {train.global_batch} "
          f"({local} per worker) x {model.context} characters, {train.steps} steps, "
          f"seed {config.seed}")
    cores = os.cpu_count() or 1
    if config.workers > cores:
        print(f"note: {config.workers} workers share {cores} CPU cores: at most {cores} run "
              f"at once, so the speedup cannot exceed about {cores}x")
    load = os.getloadavg()[0]
    if load > 0.5 * cores:
        print(f"note: this machine was already busy (load average {load:.1f} on {cores} "
              "cores); the timings below carry that noise")
    sys.stdout.flush()


def _print_report(
    config: DemoConfig, train: TrainConfig, result: WorkerResult, baseline: WorkerResult | None
) -> None:
    preset = config.preset
    figures = scaling_figures(
        result.step_s,
        baseline.step_s if baseline is not None else None,
        world_size=config.workers,
        global_batch=preset.global_batch,
        tokens_per_sample=preset.context,
        warmup=preset.warmup_steps,
    )
    sync = sync_latency(result.round_trips, result.sync_s, preset.warmup_steps)
    note = "one worker: nothing to compare" if config.workers == 1 else "skipped (--no-baseline)"
    short = None if baseline is None else too_short_to_compare(
        len(result.step_s), len(baseline.step_s), preset.warmup_steps)
    print()
    print(f"model: {result.n_params:,} parameters; "
          f"{loss_summary(result.losses, first_step=result.first_step)}")
    if result.first_step > 0:
        print(f"resumed from the checkpoint of step {result.first_step} in "
              f"{config.checkpoint_dir}")
    if baseline is not None and result.first_step == 0:
        print(equivalence_line(result.losses, baseline.losses, config.workers))
    print()
    print(figures_table(figures, sync, note, too_short=short))
    if result.sample is not None:
        print()
        print(sample_block(result.sample, train.sample_prompt))
    print()
