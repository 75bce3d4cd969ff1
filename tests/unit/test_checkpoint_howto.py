"""docs/checkpoint.md runs as written: its python blocks execute in order, twice (the
second time as a resumed run), in a fresh directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpoint.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_doc_has_the_loop_and_the_loading_example() -> None:
    assert len(blocks()) == 2


@pytest.mark.timeout(60)
def test_doc_code_runs_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first: dict[str, Any] = {}
    for code in blocks():
        exec(compile(code, str(DOC), "exec"), first)
    assert first["step"] == 20 and first["cursor"].state.epoch == 3  # 6 steps an epoch
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "ckpt-000000000010.pt", "ckpt-000000000015.pt", "ckpt-000000000020.pt"]
    second: dict[str, Any] = {}
    exec(compile(blocks()[0], str(DOC), "exec"), second)  # resumes at step 20
    assert second["step"] == 20
    assert second["cursor"].state == first["cursor"].state
    assert (second["model"].weight == first["model"].weight).all()
