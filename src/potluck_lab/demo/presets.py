"""The demos' sizes and the checks their flags share.

Every demo trains the same character transformer on stdlib source. A ``Preset`` holds
one demo's sizes: the model and corpus, the run's length and batch. ``FULL`` and
``QUICK`` are the plain demo's; the chaos and uneven demos derive theirs from them.
``worker_argv`` and ``worker_parser`` carry a preset to a worker process and back, so
the demo and its workers name the same flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from potluck.errors import ConfigError


@dataclass(frozen=True)
class Preset:
    """Sizes that fit a time budget on 2 CPU cores."""

    steps: int
    global_batch: int
    corpus_chars: int
    context: int
    d_model: int
    n_layers: int
    warmup_steps: int  # left out of the timing medians
    sample_chars: int = 0  # generated text at the end (0: none)
    baseline_steps: int = 0  # the plain demo's 1-worker phase
    equal_steps: int = 0  # the uneven demo's steps on equal shares, after the balanced ones


FULL = Preset(steps=600, global_batch=32, corpus_chars=2_000_000, context=64, d_model=128,
              n_layers=2, warmup_steps=10, sample_chars=300, baseline_steps=40)
# The full demo's model and batch, cut short. A smaller model is quicker, but its step
# is mostly the all-reduce and the step's fixed costs: 2 workers ran slower than 1.
QUICK = replace(FULL, steps=40, baseline_steps=25, warmup_steps=4, corpus_chars=200_000,
                sample_chars=80)
# Enough steps after the kill for a restarted worker (a fresh Python importing torch:
# several seconds) to rejoin before the end; a smaller model keeps the quick run short.
CHAOS_FULL = replace(FULL, baseline_steps=0)
CHAOS_QUICK = replace(QUICK, steps=360, global_batch=16, d_model=64, warmup_steps=10,
                      baseline_steps=0)
UNEVEN_FULL = replace(FULL, steps=240, sample_chars=0, baseline_steps=0, equal_steps=30)
UNEVEN_QUICK = replace(QUICK, steps=40, warmup_steps=5, sample_chars=0, baseline_steps=0,
                       equal_steps=16)


def sized(args: argparse.Namespace, full: Preset, quick: Preset) -> Preset:
    """The preset ``--quick`` picks, with ``--steps`` and ``--batch-size`` applied."""
    preset = quick if args.quick else full
    return replace(preset,
                   steps=preset.steps if args.steps is None else args.steps,
                   global_batch=(preset.global_batch if args.batch_size is None
                                 else args.batch_size))


def check_seed(seed: int) -> None:
    if seed < 0:
        raise ConfigError(f"--seed {seed}: seeds must be >= 0; use e.g. --seed 0")


def check_several_workers(demo: str, workers: int, why: str) -> None:
    """A demo that slows or kills one worker needs another one to carry on."""
    if workers < 2:
        raise ConfigError(f"--{demo} with --workers {workers}: {why}, so it needs at least "
                          f"2 workers; use --{demo} --workers 2")


def refuse_resume(resume: bool, demo: str, why: str) -> None:
    if resume:
        raise ConfigError(f"--resume with --{demo}: the {demo} demo keeps no checkpoints"
                          f"{why}; drop --resume or --{demo}")


def worker_argv(preset: Preset, seed: int) -> list[str]:
    """The flags that give a worker process the demo's model, corpus and run."""
    return ["--steps", str(preset.steps), "--batch-size", str(preset.global_batch),
            "--seed", str(seed), "--corpus-chars", str(preset.corpus_chars),
            "--context", str(preset.context), "--d-model", str(preset.d_model),
            "--n-layers", str(preset.n_layers)]


def worker_parser(prog: str) -> argparse.ArgumentParser:
    """A worker script's parser, with the flags ``worker_argv`` writes."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True, help="global batch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-chars", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--d-model", type=int, required=True)
    parser.add_argument("--n-layers", type=int, required=True)
    return parser

