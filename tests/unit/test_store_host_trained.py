"""``store_host_job.trained``: which part a killed worker trained. A worker killed
between a step's commit and its ledger line trained its part; one whose part another
worker trained in the generation that committed the step did not (that generation
formed without it, after a group that was not built: no failed step shows it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from potluck_lab.store_host_job import trained

pytestmark = pytest.mark.timeout(10)


def _worker(directory: Path, name: str, lines: list[dict[str, object]],
            ledger: list[list[object]]) -> None:
    (directory / f"{name}.times").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (directory / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ledger))


def test_a_killed_workers_part_in_the_committed_step_counts(tmp_path: Path) -> None:
    _worker(tmp_path, "node0-1", [{"pending": 5, "epoch": 0, "ids": [1, 2]},
                                  {"step": 5, "at": 1.0}], [[0, [1, 2]]])
    _worker(tmp_path, "node9-2", [{"step": 4, "at": 0.5},
                                  {"pending": 5, "epoch": 0, "ids": [3, 4]}], [])
    assert sorted(trained(tmp_path)) == [(0, [1, 2]), (0, [3, 4])]


def test_a_part_a_committer_trained_itself_is_not_the_killed_workers(
        tmp_path: Path) -> None:
    _worker(tmp_path, "node0-1", [{"pending": 5, "epoch": 0, "ids": [1, 2]},
                                  {"step": 5, "at": 1.0}], [[0, [1, 2]]])
    _worker(tmp_path, "node9-2", [{"step": 4, "at": 0.5},
                                  {"pending": 5, "epoch": 0, "ids": [2, 1]}], [])
    assert trained(tmp_path) == [(0, [1, 2])]
