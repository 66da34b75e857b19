"""The library runs without Dagster: nothing under `pipeline/` imports it (or `assets/`)."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pipeline

ROOT = Path(__file__).resolve().parents[1]


def test_pipeline_imports_no_dagster():
    modules = sorted(m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.") if not m.name.endswith("__main__"))
    assert "pipeline.rounds" in modules and "pipeline.settings" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dagster', 'assets', 'maxit'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"pipeline imported {res.stdout.strip()}\n{res.stderr[-2000:]}"


def test_comments_cite_only_documents_in_the_repository():
    """Code cites docs/ or papers by name, never documents outside the repository."""
    outside = re.compile(r"seed 00\d|(?<!second )seed's|(?<!docs/)FINDINGS|(?<!docs/)DESIGN\.md|/work/shared|shared/seeds")
    found = []
    for folder in ("pipeline", "assets", "schemas", "maxit", "scripts", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "test_layout.py":
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if outside.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
