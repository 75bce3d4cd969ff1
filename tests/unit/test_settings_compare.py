"""A joiner compares its prepare() settings with the cohort's (``live_state``)."""

from __future__ import annotations

import pytest

from potluck.errors import ConfigError
from potluck.protocol import running
from potluck.step.live_state import compare_settings


def _settings(**changed: int | str) -> dict[str, int | str]:
    return {"potluck": running(), "global_batch": 8, "seed": 0, "trust": "None", **changed}


def test_the_same_settings_and_another_seed_are_accepted() -> None:
    compare_settings(_settings(seed=5), _settings(), rank=2)
    compare_settings(_settings(), None, rank=2)  # a cohort whose state carries none


def test_another_setting_is_named_with_both_values() -> None:
    with pytest.raises(ConfigError, match="global_batch: the cohort's 8, this worker's 16"):
        compare_settings(_settings(global_batch=16), _settings(), rank=2)


@pytest.mark.parametrize("theirs", ["0.0.9 (wire 1)", None])
def test_another_potluck_is_named_with_the_fix(theirs: str | None) -> None:
    # (None: a cohort of a potluck from before the version travelled with the settings)
    cohort = _settings(potluck=theirs or "")
    if theirs is None:
        del cohort["potluck"]
    with pytest.raises(ConfigError) as caught:
        compare_settings(_settings(global_batch=16), cohort, rank=2)
    message = str(caught.value)
    assert "runs another potluck than the cohort it joined (global_batch" in message
    assert f"potluck: the cohort's {theirs}, this worker's {running()}" in message
    assert "install the same potluck on every worker" in message
