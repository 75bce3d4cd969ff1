"""The round plan (pure): local steps by speed, each rank at least one, hysteresis, a
user's fixed split, and the weight of a pseudo-gradient."""

from __future__ import annotations

import pytest

from potluck.errors import ConfigError
from potluck.sync import local_steps, lost_ranges, plan_round, weight
from potluck.sync.fragments import deal


def test_local_steps_in_proportion_to_speed_each_at_least_one() -> None:
    assert plan_round([None, None], 4) == (4, 4)  # nobody measured: equal
    assert plan_round([300.0, 100.0], 4) == (6, 2)
    assert plan_round([1000.0, 1.0, 1.0], 2) == (4, 1, 1)  # never below one
    assert plan_round([0.0, 0.0], 3) == (3, 3)  # zero speeds: equal, not a division by 0
    assert plan_round([5.0], 10) == (10,)


def test_hysteresis_keeps_a_plan_close_enough() -> None:
    assert plan_round([310.0, 100.0], 4, current=(6, 2), min_gain=0.05) == (6, 2)
    assert plan_round([100.0, 100.0], 4, current=(6, 2), min_gain=0.05) == (4, 4)
    assert plan_round([310.0, 100.0], 4, current=(5, 5), min_gain=0.05) == (6, 2)  # stale


def test_a_fixed_split_is_checked_against_the_cohort() -> None:
    assert plan_round([1.0, 9.0], 2, split=(3, 1)) == (3, 1)
    with pytest.raises(ConfigError, match="summing to 2 x 2 = 4"):
        plan_round([1.0, 9.0], 2, split=(3, 2))
    with pytest.raises(ConfigError, match="one count per rank"):
        plan_round([1.0, 9.0, 1.0], 2, split=(3, 1))


def test_local_steps_of_a_part_and_its_weight() -> None:
    # global batch 12 on 2 ranks: about 6 samples a local step
    assert local_steps(42, 12, 2) == 7 and local_steps(6, 12, 2) == 1
    assert local_steps(2, 12, 2) == 1 and local_steps(1, 120, 2) == 1  # a short last round
    assert local_steps(5, 2, 2) == 5  # never more steps than samples
    assert weight(6, 48) == 0.125
    with pytest.raises(ConfigError, match="within the round"):
        weight(49, 48)


def test_fragments_are_sent_spread_over_a_part_and_dealt_in_turn() -> None:
    from potluck.sync.round_plan import fragment_points

    assert fragment_points(4, 3) == (2, 3)  # the third goes with the round's sync
    assert fragment_points(12, 4) == (3, 6, 9) and fragment_points(1, 4) == (1, 1, 1)
    assert fragment_points(7, 1) == ()
    assert deal(5, 2) == [[0, 2, 4], [1, 3]]
    with pytest.raises(ConfigError, match="fragments <= 3"):
        deal(3, 4)


def test_lost_ranges_are_the_block_less_the_parts() -> None:
    assert lost_ranges((24, 48), [(24, 32), (32, 40), (40, 48)]) == ()
    assert lost_ranges((24, 48), [(40, 48), (24, 32)]) == ((32, 40),)
    assert lost_ranges((0, 10), [(3, 5)]) == ((0, 3), (5, 10))
    with pytest.raises(ConfigError, match="disagree"):
        lost_ranges((0, 10), [(0, 6), (5, 10)])


def test_an_unmeasured_round_starts_even_then_the_rest() -> None:
    """Nobody measured: the first ``measure`` of the round's global batches (at least
    one), then the rest; measured, or a block too short for a rest, stays whole."""
    from potluck.sync.round_plan import segments

    kw = {"inner_steps": 125, "global_batch": 32, "world_size": 2, "measure": 0.0625}
    assert segments((0, 4000), measured=False, **kw) == ((0, 256), (256, 4000))
    assert segments((4000, 8000), measured=True, **kw) == ((4000, 8000),)
    assert segments((0, 4000), measured=False, **{**kw, "measure": 0.0}) == ((0, 4000),)
    # a tenth of 4 global batches rounds to none: one global batch, then the rest
    assert segments((12, 60), measured=False, inner_steps=4, global_batch=12, world_size=2,
                    measure=0.1) == ((12, 24), (24, 60))
    # every rank gets a sample of each part: 5 ranks, global batches of 2: the start is
    # 3 global batches (6 samples), the rest at least 5
    assert segments((0, 40), measured=False, inner_steps=20, global_batch=2, world_size=5,
                    measure=0.05) == ((0, 6), (6, 40))
    assert segments((0, 10), measured=False, inner_steps=20, global_batch=2, world_size=5,
                    measure=0.05) == ((0, 10),)
    # an owed range or a short last round with less than a global batch after the start
    assert segments((0, 287), measured=False, **kw) == ((0, 287),)
    assert segments((0, 288), measured=False, **kw) == ((0, 256), (256, 288))


def test_parts_that_overlap_mean_the_members_disagree() -> None:
    """Two ranks that split the rest of a round differently trained a sample twice: no
    lost ranges but None (the round starts again); gaps are lost ranges as ever."""
    from potluck.sync.round_plan import agreed_lost

    assert agreed_lost((0, 48), [(0, 6), (6, 12), (12, 30), (30, 48)]) == ()
    assert agreed_lost((0, 48), [(0, 6), (6, 12), (12, 30), (0, 0), (36, 48)]) == ((30, 36),)
    assert agreed_lost((0, 48), [(0, 6), (6, 12), (12, 30), (28, 48)]) is None
    with pytest.raises(ConfigError, match="outside the round's block"):
        agreed_lost((0, 48), [(0, 6), (40, 50)])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"fragments": 0}, "fragments=0"), ({"mixing": 1.0}, "mixing=1.0"),
    ({"fragments": True}, "fragments=True"), ({"measure": 1.0}, "measure=1.0"),
    ({"measure": -0.1}, r"measure=-0.1\) must be in \[0, 1\)"),
    ({"measure": float("nan")}, "measure=nan"), ({"measure": True}, "measure=True"),
    ({"min_gain": 1.5}, r"DiLoCo\(min_gain=1.5\) must be in \[0, 1\)"),
    ({"codec": "Int8Blockwise"}, "pass a codec object"),
    ({"codec": "class"}, r"Int8Blockwise\(\) \(with the parentheses\)")])
def test_bad_fragments_and_measures_are_refused(kwargs: dict[str, object], message: str) -> None:
    from potluck import DiLoCo
    from potluck.compress import Int8Blockwise

    if kwargs.get("codec") == "class":  # the class, not a codec: crashed a round later
        kwargs = {"codec": Int8Blockwise}
    with pytest.raises(ConfigError, match=message):
        DiLoCo(**kwargs)  # type: ignore[arg-type]


def test_streaming_diloco_is_diloco_with_fragments() -> None:
    from potluck import StreamingDiLoCo

    config = StreamingDiLoCo(30, 4)
    assert (config.fragments, config.mixing, config.strategy) == (4, 0.5, "streaming-diloco")
    with pytest.raises(ConfigError, match="at least 2 fragments"):
        StreamingDiLoCo(30, 1)


def test_outer_step_of_one_fragment_and_the_merge() -> None:
    """Only the summed fragment moves (the others' gradient is None); the replica keeps
    ``mixing`` of its own value; a non-finite sum skips the step but still merges."""
    import torch

    from potluck.sync.fragments import outer_step

    global_ = [torch.zeros(2), torch.zeros(3)]
    local = [torch.ones(2), torch.ones(3)]
    outer = torch.optim.SGD(global_, lr=1.0)
    assert outer_step(global_, local, outer, [([0], torch.tensor([-2.0, -4.0]))], 0.5)
    assert global_[0].tolist() == [2.0, 4.0] and global_[1].tolist() == [0.0] * 3
    assert local[0].tolist() == [1.5, 2.5] and local[1].tolist() == [1.0] * 3
    assert not outer_step(global_, local, outer, [([1], torch.tensor([1.0, float("nan"), 0]))],
                          0.0)
    assert global_[1].tolist() == [0.0] * 3 and local[1].tolist() == [0.0] * 3
