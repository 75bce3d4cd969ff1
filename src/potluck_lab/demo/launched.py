"""What the demos that run their workers under the launcher's agent share.

The chaos and uneven demos build a ``LaunchConfig``, run the agent in this process while
a follower shows the workers' records (``run_workers``), then tell an interrupted or
failed run apart from a finished one (``ended_badly``) before they report.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from potluck.errors import PotluckError
from potluck.launch.config import LaunchConfig
from potluck_lab.demo.presets import Preset
from potluck_lab.jobs import Follower, run_agent
from potluck_lab.text import Vocabulary, load_corpus, stdlib_dir


@dataclass(frozen=True)
class LaunchedConfig:
    """The settings every launched demo has; each demo's config adds its own."""

    workers: int
    seed: int
    preset: Preset
    metrics: Path  # the per-step records the demo writes
    progress: bool


def run_workers(launch: LaunchConfig, log: Path, follower: Follower) -> tuple[int, list[str]]:
    """Run the agent, the workers' output in ``log``; its exit code (130: Ctrl-C) and
    the lines it printed."""
    emitted: list[str] = []
    try:
        return run_agent(launch, log, follower, emitted, append=False), emitted
    except PotluckError as exc:
        print(f"potluck demo: the launcher failed: {exc}", file=sys.stderr)
        return 1, emitted
    except KeyboardInterrupt:  # before the agent took over the signals, or after
        return 130, emitted


def ended_badly(code: int, emitted: list[str], done: int, total: int, demo: str,
                log: Path) -> int | None:
    """The exit code of a run that was interrupted or failed (having said so), or None
    for one whose ``done`` steps reached ``total``."""
    if code >= 128:
        print(f"\npotluck demo: interrupted; every worker was stopped (worker output in "
              f"{log})", file=sys.stderr)
        return code
    if code == 0 and done >= total:
        return None
    for line in emitted[-40:]:
        print(line, file=sys.stderr)
    print(f"potluck demo: the {demo} run failed after {done} of {total} steps; worker "
          f"output is in {log}", file=sys.stderr)
    return 1


def model_line(command: str, preset: Preset, seed: int) -> str:
    """The header's first line: the model and the text it trains on."""
    text = load_corpus(preset.corpus_chars, seed)
    vocab = Vocabulary.from_text(text)
    return (f"{command}: a {preset.n_layers}-layer character transformer (d_model "
            f"{preset.d_model}, context {preset.context}) on {len(text):,} characters of "
            f"Python stdlib source from {stdlib_dir()} ({vocab.size} distinct characters)")
