"""The layers hold: the library never imports the lab, ``potluck.prepare`` loads trust
and the codecs only when asked for, and no package imports another that imports it back.

The import checks run in a fresh interpreter: this one has imported half the project.
The static checks read every import statement (function-level ones too, which an import
check misses), leaving out those under ``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _fresh(code: str) -> object:
    """What ``code`` prints (one JSON value) in a new interpreter."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=100, cwd=SRC.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_no_module_of_the_library_imports_the_lab() -> None:
    loaded = _fresh(
        "import importlib, json, pkgutil, sys, potluck\n"
        "names = [m.name for m in pkgutil.walk_packages(potluck.__path__, 'potluck.')\n"
        "         if m.name != 'potluck.__main__']  # that one runs the command\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "lab = sorted(m for m in sys.modules if m.split('.')[0] == 'potluck_lab')\n"
        "print(json.dumps({'modules': len(names), 'lab': lab}))\n")
    assert isinstance(loaded, dict)
    assert loaded["modules"] > 100  # every module, not a few
    assert loaded["lab"] == [], f"importing the library loaded the lab: {loaded['lab']}"


@pytest.mark.timeout(60)
def test_prepare_loads_neither_trust_nor_the_codecs() -> None:
    loaded = _fresh(
        "import json, sys, potluck\n"
        "potluck.prepare\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('potluck.'))))\n")
    assert isinstance(loaded, list) and "potluck.preparation" in loaded
    asked_for = [m for m in loaded if m.split(".")[1] in ("trust", "compress")]
    assert asked_for == [], f"potluck.prepare imported {asked_for}"


def _runtime_imports(path: Path) -> Iterator[tuple[str, int]]:
    """(absolute module or module.name, line) of every import in ``path`` that can run."""
    module = ".".join(path.relative_to(SRC).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" \
        else module.rpartition(".")[0]
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)


def _unit(top: str, name: str) -> str | None:
    """The package or module right under ``top`` that ``name`` lives in (None: the root
    itself, or not under ``top``). ``from potluck import prepare`` is the module that
    the root's lazy table names for ``prepare``."""
    parts = name.split(".")
    if parts[0] != top or len(parts) < 2 or parts[1] == "__init__":
        return None
    child = parts[1]
    if top == "potluck":
        import potluck

        lazy = {**potluck._LAZY, "__version__": "potluck.protocol"}
        child = lazy[child].split(".")[1] if child in lazy else child
    if (SRC / top / child).is_dir() or (SRC / top / f"{child}.py").is_file():
        return child
    return None


def _edges(top: str) -> dict[tuple[str, str], str]:
    """(unit, unit it imports) -> where, for every import between two units of ``top``."""
    edges: dict[tuple[str, str], str] = {}
    for path in sorted((SRC / top).rglob("*.py")):
        source = _unit(top, ".".join(path.relative_to(SRC).with_suffix("").parts))
        for name, line in _runtime_imports(path) if source else ():
            target = _unit(top, name)
            if target and target != source:
                edges.setdefault((source, target), f"{path.relative_to(SRC)}:{line}")
    return edges


def package_cycles(top: str) -> list[str]:
    """Each shortest cycle of imports between units of ``top``, one per unit on it that
    starts it, as ``a -> b -> a`` with where each import is."""
    edges = _edges(top)
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)

    def path(start: str, goal: str) -> list[str] | None:  # breadth first: the shortest
        came: dict[str, str] = {}
        todo = [start]
        while todo:
            node = todo.pop(0)
            for nxt in sorted(graph.get(node, ())):
                if nxt in came or nxt == start:
                    continue
                came[nxt] = node
                if nxt == goal:
                    hops = [goal]
                    while hops[-1] != start:
                        hops.append(came[hops[-1]])
                    return hops[::-1]
                todo.append(nxt)
        return None

    cycles: dict[frozenset[str], list[str]] = {}
    for a, b in sorted(edges):
        back = path(b, a)
        if back is not None:
            loop = [a, *back]
            best = cycles.get(frozenset(loop))
            if best is None or len(loop) < len(best):
                cycles[frozenset(loop)] = loop
    return [" -> ".join(f"{x} ({edges[(x, y)]})" for x, y in itertools.pairwise(loop))
            + f" -> {loop[-1]}" for loop in sorted(cycles.values(), key=len)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("top", ["potluck", "potluck_lab"])
def test_no_package_imports_one_that_imports_it_back(top: str) -> None:
    assert len(_edges(top)) > (50 if top == "potluck" else 8)  # the graph was read
    cycles = package_cycles(top)
    assert cycles == [], f"{top}: import cycles between packages:\n" + "\n".join(cycles)


@pytest.mark.timeout(30)
def test_no_import_statement_of_the_library_names_the_lab() -> None:
    found = [f"{path.relative_to(SRC)}:{line}" for path in sorted((SRC / "potluck").rglob("*.py"))
             for name, line in _runtime_imports(path) if name.split(".")[0] == "potluck_lab"]
    assert found == [], f"the library imports the lab at {found}"
