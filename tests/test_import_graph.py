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
    assert {"pipeline.run.rounds", "pipeline.run.settings", "assets.definitions", "maxit.cli"} <= set(modules)
    graph = import_graph(modules)
    # the reading itself: edges this test must see (a top-level, a function-level, a relative import)
    assert "pipeline.config" in graph["pipeline.run.settings"]
    assert "pipeline.learn.trainer" in graph["pipeline.run.rounds"]
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


LAYERS = (
    ("schemas",),
    ("pipeline", "pipeline.types", "pipeline.errors"),
    ("pipeline.strategies", "pipeline.store", "pipeline.sandbox", "pipeline.tasks"),
    ("pipeline.config",),
    ("pipeline.models",),
    ("pipeline.engines",),
    ("pipeline.rollout",),
    ("pipeline.learn",),
    ("pipeline.workflows",),
    ("pipeline.run",),
    ("pipeline.reporting",),
    ("assets",),
    ("maxit",),
)
"""The library's floors, lowest first. A module may import its own part (the folder or module
named here that holds it) and any part on a lower floor; parts on one floor do not import each
other. Ground: records, errors, schemas. Then what knows no stage (strategies, tables and
checkpoints on disk, the sandbox, tasks); the one config tree; models and engines; the stages
(rollouts, then learning); the teams, which use both; the run layer that composes them; the
reports that read its stores back; Dagster and the CLI on top."""


def part_of(module: str) -> tuple[int, str]:
    """(floor, part) of a project module: the longest part of `LAYERS` that is the module or
    holds it."""
    best = None
    for floor, parts in enumerate(LAYERS):
        for part in parts:
            if (module == part or module.startswith(part + ".")) and (best is None or len(part) > len(best[1])):
                best = (floor, part)
    if best is None:
        raise AssertionError(f"module {module} is on no floor of LAYERS: add its part")
    return best


def layering_violations(graph) -> list[str]:
    bad = []
    for module, edges in sorted(graph.items()):
        floor, part = part_of(module)
        for target, line in sorted(edges.items()):
            t_floor, t_part = part_of(target)
            if t_part != part and t_floor >= floor:
                bad.append(f"{module}:{line} imports {target} ({part} on floor {floor}, {t_part} on floor {t_floor})")
    return bad


def test_imports_run_down_the_floors():
    modules = project_modules()
    graph = import_graph(modules)
    bad = layering_violations(graph)
    assert not bad, "imports that run up (or across) the floors:\n" + "\n".join(bad)


def test_an_upward_import_is_named():
    """The check itself: an import from a lower floor to a higher one, at function level, and one
    across a floor, are both reported; a downward one is not."""
    graph = {
        "pipeline.learn.views": {"pipeline.config.run": 3},
        "pipeline.rollout.loop": {"pipeline.learn.trainer": 12},
        "pipeline.store.lock": {"pipeline.sandbox": 4},
    }
    assert layering_violations(graph) == [
        "pipeline.rollout.loop:12 imports pipeline.learn.trainer (pipeline.rollout on floor 6, pipeline.learn on floor 7)",
        "pipeline.store.lock:4 imports pipeline.sandbox (pipeline.store on floor 2, pipeline.sandbox on floor 2)",
    ]
