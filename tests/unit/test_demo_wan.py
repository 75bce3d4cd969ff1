"""What ``potluck demo --wan`` prints: the two contenders' losses at the same time."""

from __future__ import annotations

from typing import Any

from potluck_lab.demo.wan import report, same_time_line


def _figures(curve: list[list[float]], samples_per_s: float,
             bytes_per_sample: float) -> dict[str, Any]:
    batches, wall, loss = curve[-1]
    return {"batches": batches, "wall_s": wall, "samples_per_s": samples_per_s,
            "loss": loss, "bytes_per_sample": bytes_per_sample, "busy": float("nan"),
            "curve": curve}


# [global batches, seconds of training, loss]: DDP evaluates after every batch (1.9 s
# each over the capped link), DiLoCo after each round of 20 batches
DDP = [[1, 1.9, 4.1], [2, 3.8, 3.9], [3, 5.6, 3.62], [4, 7.5, 3.5]]
DILOCO = [[20, 2.9, 3.2], [40, 5.8, 2.96]]


def test_the_losses_are_compared_at_the_same_time_not_at_each_ones_end() -> None:
    """DiLoCo's 40 batches took 5.8 s: by then DDP had done 3 batches, not its 4."""
    text = report(_figures(DDP, 17.0, 125_000.0), _figures(DILOCO, 221.0, 5_400.0))
    assert "DiLoCo trained 13x the samples per second with 23x fewer bytes per sample" in text
    assert ("in the same 5.8 s of training, DiLoCo reached loss 2.960 (40 global batches) "
            "where torch DDP reached 3.620 (3)") in text
    assert "3.500" not in text.splitlines()[-1]  # DDP's loss after 7.5 s


def test_the_shorter_run_decides_the_time() -> None:
    line = same_time_line(DDP[:3], DILOCO)  # DDP stopped at 5.6 s: DiLoCo's first round
    assert line.startswith("in the same 5.6 s of training, DiLoCo reached loss 3.200 (20 "
                           "global batches) where torch DDP reached 3.620 (3)")


def test_a_run_over_before_the_first_sync_says_it_is_too_short() -> None:
    line = same_time_line(DDP[:2], [[20, 4.5, 3.2], [40, 9.0, 2.9]])
    assert line == ("too short to compare the losses: DDP's run ended after 3.8 s of "
                    "training, before DiLoCo's first sync; run potluck demo --wan (without "
                    "--quick)")
    assert "loss" not in same_time_line([[1, 6.0, 4.1]], DILOCO).split(":")[1]
