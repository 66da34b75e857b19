"""Functions a reader can hold: no function of the library over `MAX_FUNCTION` lines and no
module over `MAX_MODULE` lines (docs/DESIGN.md, "Library layout"). A function's length counts its
decorators' first line to its last, docstring included; a module's, its lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "assets", "maxit", "schemas")
MAX_FUNCTION = 80
MAX_MODULE = 600


def oversized(files: list[Path], root: Path) -> list[str]:
    """Each function over MAX_FUNCTION lines and each module over MAX_MODULE lines, named by
    path (relative to `root`), qualified name and length."""
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE:
            found.append(f"{rel}: {lines} lines (module limit {MAX_MODULE})")
        found += [f"{rel}:{line} {name}: {n} lines (function limit {MAX_FUNCTION})" for name, line, n in _functions(ast.parse(text))]
    return found


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, first line, length) of every function over the limit, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > MAX_FUNCTION:
                    yield name, first, length
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def library_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_library_keeps_its_size_limits():
    files = library_files()
    assert len(files) > 50  # the walk found the library
    assert oversized(files, ROOT) == []


def test_an_oversized_function_and_module_are_named(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    nested = "class Holder:\n    def method(self):\n" + "\n".join(f"        y{i} = {i}" for i in range(MAX_FUNCTION))
    src = f"def long_one():\n{body}\n\n\ndef short_one():\n    return 1\n\n\n{nested}\n"
    src += "\n" * (MAX_MODULE - len(src.splitlines()) + 1)
    path = tmp_path / "pkg" / "mod.py"
    path.parent.mkdir()
    path.write_text(src)
    found = oversized([path], tmp_path)
    assert found[0] == f"pkg/mod.py: {MAX_MODULE + 1} lines (module limit {MAX_MODULE})"
    assert found[1] == f"pkg/mod.py:1 long_one: {MAX_FUNCTION + 1} lines (function limit {MAX_FUNCTION})"
    assert found[2].startswith("pkg/mod.py:") and "Holder.method: 81 lines" in found[2]
    assert len(found) == 3


def test_a_function_at_the_limit_passes_and_its_decorator_counts(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION - 2))
    path = tmp_path / "ok.py"
    path.write_text(f"@staticmethod\ndef at_limit():\n{body}\n")
    assert oversized([path], tmp_path) == []
    path.write_text(f"@staticmethod\n@staticmethod\ndef at_limit():\n{body}\n")
    assert oversized([path], tmp_path) == [f"ok.py:1 at_limit: {MAX_FUNCTION + 1} lines (function limit {MAX_FUNCTION})"]
