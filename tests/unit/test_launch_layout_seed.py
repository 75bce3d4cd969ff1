"""A node that joins after the job's store moved numbers its workers: the survivors'
agents write back node 0's worker count and the slots taken (``seed_layout``)."""

from __future__ import annotations

import pytest
from torch.distributed import HashStore

from potluck import keys
from potluck.errors import RendezvousError
from potluck.launch.config import LaunchConfig
from potluck.launch.meeting import elastic_offset, seed_layout

pytestmark = pytest.mark.timeout(20)

LATE = LaunchConfig(script="train.py", nnodes=4, min_nodes=2, node_rank=3, elastic=True,
                    run_id="r", join_timeout=0.3)


def test_a_late_node_on_a_moved_store_takes_the_next_slots() -> None:
    moved = HashStore()  # a successor's store: none of node 0's launch keys
    with pytest.raises(RendezvousError, match="node 0 did not say"):
        elastic_offset(moved, LATE, lambda: False)  # (what a late node met before)
    seed_layout(moved, "r", first=1, taken=2)  # node 2, its worker at launch rank 2
    seed_layout(moved, "r", first=1, taken=1)  # node 1 (the lower one: no change)
    assert moved.get(keys.agents("r", "nproc0")) == b"1"
    assert int(moved.add(keys.agents("r", "slots"), 0)) == 2
    assert elastic_offset(moved, LATE, lambda: False) == 3  # after ranks 0, 1 and 2


def test_the_write_back_keeps_what_the_moved_store_holds_already() -> None:
    moved = HashStore()
    moved.set(keys.agents("r", "nproc0"), "2")
    moved.add(keys.agents("r", "slots"), 5)
    seed_layout(moved, "r", first=2, taken=3)
    assert moved.get(keys.agents("r", "nproc0")) == b"2"
    assert int(moved.add(keys.agents("r", "slots"), 0)) == 5
