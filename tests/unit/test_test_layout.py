"""The tests' own rules: no test module imports another (shared helpers live in helper
modules, fixtures in conftest.py, or in ``potluck.testing``), and the leak checks are on
for every test (``tests/leaks.py``, loaded by ``tests/conftest.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_another() -> None:
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for name in _imported(path):
            if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                found.append(f"{path.relative_to(TESTS.parent)} imports {name}")
    assert not found, "; ".join(found)


def test_the_leak_checks_are_loaded_for_every_test(request: object) -> None:
    config = request.config  # type: ignore[attr-defined]
    assert config.pluginmanager.has_plugin("tests.leaks")
