"""The project's modules import each other without cycles, function-level imports included.

A cycle dodged by importing inside a function still ties the two modules together: neither can be
read, tested or moved without the other, and the order of first use decides whether the program
starts. The graph is read from the source with `ast` (nothing is imported): an edge A -> B for
every `import` or `from ... import` statement of module A, at any depth, that names project module
B (`from pkg import name` counts as pkg.name where that is a module, else pkg). Importing a
submodule also runs its package's `__init__`; that implicit edge is not counted, as in every
package whose `__init__` re-exports its submodules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "assets", "maxit", "schemas")


def project_modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, tuple[Path, bool]]:
    """module name -> (file, is a package's __init__)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _project_module(name: str, modules) -> str | None:
    """The longest prefix of `name` that is a project module (`pipeline.x.Name` -> pipeline.x)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def import_graph(modules) -> dict[str, dict[str, int]]:
    """module -> {imported project module: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_project_module(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from .x import y, from .. import z
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.append(full if full in modules else _project_module(source, modules))
            for target in targets:
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def describe(cycle: list[str], graph, modules) -> str:
    """One line per edge of the cycle: file:line imports module."""
    lines = []
    for a, b in zip(cycle, cycle[1:]):
        path = modules[a][0].relative_to(ROOT)
        lines.append(f"  {path}:{graph[a][b]} imports {b}")
    return "import cycle " + " -> ".join(cycle) + "\n" + "\n".join(lines)


def test_the_project_has_no_import_cycle():
    modules = project_modules()
    assert {"pipeline.rounds", "pipeline.settings", "assets.definitions", "maxit.cli"} <= set(modules)
    graph = import_graph(modules)
    # the reading itself: edges this test must see (a top-level, a function-level, a relative import)
    assert "pipeline.config" in graph["pipeline.settings"]
    assert "pipeline.training.trainer" in graph["pipeline.rounds"]
    assert "pipeline.tasks.answers" in graph["pipeline.tasks.base"]
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph, modules)


def test_a_function_level_cycle_is_found_and_named(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("import os\n\ndef g():\n    import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")
    modules = project_modules(tmp_path, ("pkg",))
    graph = import_graph(modules)
    assert graph["pkg.d"] == {"pkg.a": 1} and graph["pkg.b"] == {"pkg.c": 2}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(project_modules(tmp_path, ("pkg",)))) is None


def test_moved_names_are_importable_where_they_were():
    """Names that moved to break cycles are still importable from their old modules."""
    import importlib

    old_homes = {
        "pipeline.tasks.base": ["parse_number", "last_number", "numbers_equal", "parse_verdict"],
        "pipeline.tasks.prompts": ["parse_marked_verdict", "parse_compared_verdict"],
        "pipeline.workflows.base": ["StepResult", "Env", "check_workflow", "check_messages", "finite_reward"],
        "pipeline.workflows.grid": ["GridEnv", "Puzzle", "parse_puzzle", "generate_puzzles", "read_puzzle_file", "read_move", "planner_text", "mover_text"],
        "pipeline.rounds": ["RunConfig", "RoundContext", "EnginePool"],
        "pipeline.views": ["ViewConfig"],
        "pipeline.evaluation": ["EvalConfig"],
    }
    for module, names in old_homes.items():
        missing = [n for n in names if not callable(getattr(importlib.import_module(module), n, None))]
        assert not missing, (module, missing)
