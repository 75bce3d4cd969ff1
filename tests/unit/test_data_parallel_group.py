"""Which group ``DataParallel(model)`` talks on when none is passed (one process).

torch's default group first, then the cohort ``potluck.init()`` returned; a worker that a
launcher started among several with neither is refused, not left training alone.
"""

from __future__ import annotations

import pytest
import torch

import potluck
from potluck import DataParallel
from potluck.cohort.current import current
from potluck.errors import ConfigError


@pytest.fixture(autouse=True)
def _no_cohort(monkeypatch: pytest.MonkeyPatch) -> None:
    """No current cohort, whatever an earlier test left open (restored after)."""
    monkeypatch.setattr("potluck.cohort.current._current", None)


def test_several_workers_without_a_group_are_refused_with_both_fixes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"no process group, but WORLD_SIZE=2: each of the "
                       r"2 workers would train its own model.*init_process_group\(\.\.\.\).*"
                       r"potluck\.init\(\).*group=cohort\.group"):
        DataParallel(torch.nn.Linear(2, 1))


def test_one_process_without_a_group_trains_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    model = DataParallel(torch.nn.Linear(2, 1))
    assert model.group is None and model.world_size == 1


def test_the_cohort_potluck_init_returned_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    cohort = potluck.init()
    try:
        monkeypatch.setenv("WORLD_SIZE", "2")  # (read only when there is no cohort)
        model = DataParallel(torch.nn.Linear(2, 1))
        assert model.group is cohort.group and model.process_group is cohort.group
    finally:
        cohort.close()
    assert current() is None
