"""The demo's pure pieces: vocabulary, batching shares, the report table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from potluck.errors import ConfigError
from potluck.metrics.figures import scaling_figures
from potluck_lab.demo import cli
from potluck_lab.demo.report import (
    MIN_TIMED_STEPS,
    SyncLatency,
    equivalence_line,
    figures_table,
    format_table,
    loss_summary,
    too_short_to_compare,
)
from potluck_lab.demo.train import learning_rate
from potluck_lab.text import Vocabulary, batch_offsets, load_corpus, make_batch, rank_share


def test_vocabulary_round_trip_and_unknown_characters() -> None:
    vocab = Vocabulary.from_text("def f(x):\n    return x\n")
    ids = vocab.encode("return f(x)")
    assert vocab.decode(ids) == "return f(x)"
    with pytest.raises(ConfigError, match="not in the vocabulary"):
        vocab.encode("import z")


def test_corpus_is_deterministic_per_seed(tmp_path: Path) -> None:
    for name in "abcd":
        (tmp_path / f"{name}.py").write_text(name * 10)
    assert load_corpus(25, seed=1, root=tmp_path) == load_corpus(25, seed=1, root=tmp_path)
    assert len(load_corpus(25, seed=1, root=tmp_path)) == 25
    with pytest.raises(ConfigError, match=r"no \*\.py files"):
        load_corpus(25, seed=1, root=tmp_path / "missing")


def test_rank_shares_tile_the_global_batch() -> None:
    offsets = batch_offsets(step=3, seed=0, n_tokens=1000, context=8, global_batch=6)
    assert torch.equal(offsets, batch_offsets(3, 0, 1000, 8, 6))  # same on every rank
    shares = [rank_share(offsets, rank, 3) for rank in range(3)]
    assert torch.equal(torch.cat(shares), offsets)
    with pytest.raises(ConfigError, match="multiple of the worker count"):
        rank_share(offsets, 0, 4)


def test_make_batch_targets_are_inputs_shifted_by_one() -> None:
    tokens = torch.arange(100)
    inputs, targets = make_batch(tokens, torch.tensor([0, 50]), context=4)
    assert inputs.tolist() == [[0, 1, 2, 3], [50, 51, 52, 53]]
    assert targets.tolist() == [[1, 2, 3, 4], [51, 52, 53, 54]]


def test_learning_rate_warms_up_then_decays_to_a_tenth() -> None:
    assert learning_rate(0, 100, 1.0, warmup=10) == pytest.approx(0.1)
    assert learning_rate(9, 100, 1.0, warmup=10) == pytest.approx(1.0)
    assert learning_rate(100, 100, 1.0, warmup=10) == pytest.approx(0.1)


def test_report_formatting() -> None:
    table = format_table(["a", "b"], [["x", "long value"]])
    assert table.splitlines()[1] == "-  ----------"
    assert loss_summary([4.0, 3.0, 2.0], tail=2).startswith("loss: 4.000 at step 0 -> 2.000")
    line = equivalence_line([4.0, 3.0, 2.0], [4.0, 3.001], world_size=2)
    assert "first 2 steps" in line and "1.0e-03" in line and "2 workers" in line


def _table(steps: int, baseline_steps: int, warmup: int) -> str:
    """The figures table of a 2-worker run that was 0.8x as fast as 1 worker."""
    figures = scaling_figures([0.1] * steps, [0.08] * baseline_steps, world_size=2,
                              global_batch=32, tokens_per_sample=64, warmup=warmup)
    return figures_table(figures, SyncLatency(None, None, 0, None), "",
                         too_short=too_short_to_compare(steps, baseline_steps, warmup))


def test_a_run_too_short_to_time_says_so_instead_of_a_speedup() -> None:
    short = _table(steps=40, baseline_steps=6, warmup=4)
    assert "0.80x" not in short and "40%" not in short
    assert "too short to measure: 2 step(s) after the 4-step warm-up" in short
    assert "--baseline-steps of 14 or more" in short
    timed = _table(steps=40, baseline_steps=4 + MIN_TIMED_STEPS, warmup=4)
    assert "0.80x" in timed and "40%" in timed and "too short" not in timed


def test_the_quick_demo_times_the_full_demos_model_long_enough_to_compare() -> None:
    """--quick once ran a model so small that its step was mostly the all-reduce and
    fixed costs: 2 workers came out slower than 1 (0.80x)."""
    quick, full = cli.QUICK, cli.FULL
    assert (quick.global_batch, quick.context, quick.d_model, quick.n_layers) == (
        full.global_batch, full.context, full.d_model, full.n_layers)
    assert too_short_to_compare(quick.steps, quick.baseline_steps, quick.warmup_steps) is None
