"""The table of what cannot go together: pure, printed in the docs as it is in code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from potluck.compose.parts import choose
from potluck.compose.table import TABLE, Modes, refusals, table_markdown
from potluck.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_design_md_prints_the_table_as_the_code_has_it() -> None:
    assert table_markdown() in (ROOT / "docs" / "design.md").read_text()


def test_every_row_says_what_why_and_instead() -> None:
    for rule in TABLE:
        assert rule.what and rule.why and rule.fix, rule
        assert rule.message().startswith(f"prepare() got {rule.what}: {rule.why}; ")


def test_the_default_choice_and_the_consumer_cohorts_compose() -> None:
    assert refusals(Modes()) == []
    assert refusals(Modes(reconcile="rounds", split="balanced", elastic=True)) == []
    assert refusals(Modes(split="balanced", aggregate="spot checks", elastic=True)) == []
    assert refusals(Modes(hook="codec", split="balanced", elastic=True)) == []
    assert refusals(Modes(hook="codec", aggregate="robust", elastic=True)) == []
    assert refusals(Modes(reconcile="rounds", aggregate="robust", elastic=True)) == []
    assert refusals(Modes(reconcile="streaming", aggregate="robust", split="balanced")) == []
    # spot checks under rounds are the spot re-run (trust/round_rerun.py)
    assert refusals(Modes(reconcile="rounds", aggregate="spot checks", elastic=True)) == []
    assert refusals(Modes(reconcile="streaming", aggregate="spot checks",
                          split="balanced")) == []


@pytest.mark.parametrize("modes, refused", [
    (Modes(reconcile="rounds", hook="summing"), "with comm_hook="),
    (Modes(reconcile="rounds", shares=True), "with shares="),
    (Modes(reconcile="rounds", tokens=True), "with weight="),
    (Modes(reconcile="rounds", split="balanced", planned=False), "adaptive=False"),
    (Modes(shares=True, split="balanced"), "shares= with balancing"),
    (Modes(hook="own", tokens=True), "comm_hook= with balance= or weight="),
    (Modes(aggregate="spot checks", micro_batches=True), "with a memory cap"),
])
def test_each_row_refuses_its_modes(modes: Modes, refused: str) -> None:
    assert any(refused in rule.what for rule in refusals(modes)), refusals(modes)


def test_prepare_refuses_only_through_the_table() -> None:
    """No refusal of one mode by another is written outside the table: no message in
    the library opens as a row's does ("prepare() got X with Y"); the table's rows make
    theirs from their parts."""
    src = ROOT / "src" / "potluck"
    opening = "prepare() got "
    places = [path.relative_to(src).as_posix() for path in src.rglob("*.py")
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith(opening) and " with " in node.value]
    assert places == [], places


def test_choose_raises_the_first_row_that_forbids_the_call() -> None:
    from potluck import DiLoCo, Trust
    from potluck.trust import SpotCheck

    with pytest.raises(ConfigError, match=r"^prepare\(\) got sync=DiLoCo\(\.\.\.\) with "
                                          r"weight="):
        choose(sync=DiLoCo(4), balance=None, launcher_balance=False, shares=None,
               weight=len, trust=Trust(spot_check=SpotCheck(len)), elastic=False,
               max_micro_batch=None, data_parallel={})
    # potluck run --balance under rounds is the round's speed plan: no refusal.
    chosen = choose(sync=DiLoCo(4), balance=None, launcher_balance=True, shares=None,
                    weight=None, trust=None, elastic=True, max_micro_batch=None,
                    data_parallel={})
    assert chosen.modes.split == "balanced" and chosen.balance is None


def _prepare() -> ast.FunctionDef:
    tree = ast.parse((ROOT / "src" / "potluck" / "preparation.py").read_text())
    return next(node for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name == "prepare")


def test_prepare_wires_the_parts_in_about_sixty_lines() -> None:
    prepare = _prepare()
    doc_end = prepare.body[0].end_lineno
    assert doc_end is not None and prepare.end_lineno is not None
    assert prepare.end_lineno - doc_end <= 60


def test_no_lambda_in_prepare_reaches_an_object_built_after_it() -> None:
    """Each name a lambda in ``prepare`` reads is bound before the lambda's line: an
    argument, or a local assigned above (never one the lambda would find later)."""
    prepare = _prepare()
    bound: dict[str, int] = {a.arg: prepare.lineno for a in
                             [*prepare.args.args, *prepare.args.kwonlyargs]}
    for node in ast.walk(prepare):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) else [])
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, node.lineno)
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            bound.setdefault(node.optional_vars.id, node.context_expr.lineno)
    lambdas = [node for node in ast.walk(prepare) if isinstance(node, ast.Lambda)]
    assert lambdas  # (the check below would pass vacuously without any)
    late = [(name.id, node.lineno) for node in lambdas for name in ast.walk(node.body)
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load)
            and name.id in bound and bound[name.id] >= node.lineno]
    assert late == [], f"lambdas reading names bound at or after their line: {late}"
