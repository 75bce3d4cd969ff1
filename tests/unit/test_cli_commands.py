"""The ``potluck`` command finds the lab's commands (``demo``, ``bench``) through the
``potluck.commands`` entry points, and without them says in one line what is missing."""

from __future__ import annotations

from typing import Any

import pytest

from potluck import cli


class _Entry:
    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded

    def load(self) -> Any:
        if isinstance(self.loaded, Exception):
            raise self.loaded
        return self.loaded


@pytest.mark.timeout(30)
def test_the_lab_registers_demo_and_bench_in_helps_order() -> None:
    found = cli.commands()
    assert [c.name for c in found] == ["run", "demo", "plot", "plan", "bench"]
    lab = {c.name: c for c in found if c.module.startswith("potluck_lab.")}
    assert set(lab) == set(cli.LAB_COMMANDS)
    assert [c.name for c in lab["bench"].subcommands][:2] == ["ddp", "allreduce"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("entries", [[], [_Entry(ImportError("No module named 'potluck_lab'"))]],
                         ids=["no entry points", "a stale entry point"])
@pytest.mark.parametrize("argv", [["bench", "ddp", "--quick"], ["demo"], ["bench"]])
def test_without_the_lab_its_commands_say_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        entries: list[_Entry], argv: list[str]) -> None:
    monkeypatch.setattr(cli, "entry_points", lambda group: entries)
    assert [c.name for c in cli.commands()] == ["run", "plot", "plan"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"potluck {argv[0]}: this command comes with potluck's lab")
    assert "reinstall potluck from its repository (pip install -e .)" in err
    assert "Traceback" not in err


@pytest.mark.timeout(30)
def test_another_registered_command_is_listed_in_its_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hello = cli.Command("hello", "tests.unit.hello_command", "say hello", order=35)
    monkeypatch.setattr(cli, "entry_points", lambda group: [_Entry(hello)])
    assert [c.name for c in cli.commands()] == ["run", "plot", "plan", "hello"]
    assert "say hello" in cli.build_parser().format_help()
