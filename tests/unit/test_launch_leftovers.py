"""Whose keys an etcd job finds under its run id: ``leftovers.judge`` decides from
what an agent read (node 0's count published, agents checked in, a beat seen)."""

from __future__ import annotations

import pytest

from potluck.launch.leftovers import judge


@pytest.mark.parametrize(("node_rank", "published", "started", "beating", "why"), [
    (0, False, 0, False, None),  # a fresh job: nothing there
    (1, False, 0, False, None),  # a fresh job's later node, before node 0 came
    (1, True, 0, False, None),  # node 0 published, not on the roll yet
    (1, True, 2, True, None),  # a running job this node joins
    (0, True, 1, False, "it ended"),  # an ended job's count: node 0 writes it first
    (0, True, 2, True, "its agents still beat: it is running"),  # a second node 0
    (2, True, 2, False, "its agents no longer beat: it ended"),
])
def test_judge(node_rank: int, published: bool, started: int, beating: bool,
               why: str | None) -> None:
    assert judge(node_rank, published, started, beating) == why
