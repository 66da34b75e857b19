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
    assert "pipeline.run.rounds" in modules and "pipeline.run.settings" in modules
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


OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b")


def outside_references(files: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if OUTSIDE.search(line)]


def documented_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder, pattern in (("docs", "*.md"), ("scripts", "*"), ("benchmarks", "*.py"), ("examples", "*")):
        files += [p for p in (ROOT / folder).rglob(pattern) if p.is_file() and p.suffix in (".md", ".py", ".sh", ".toml", ".yaml", ".json", "")]
    return files


def test_no_documented_command_reaches_outside_the_checkout():
    files = documented_files()
    assert len(files) > 20
    assert outside_references(files) == []


def test_the_check_finds_a_path_outside(tmp_path):
    doc = ROOT / "docs" / "results"
    probe = doc / "_probe_outside.md"
    probe.write_text("run --task-file ../shared/data/gsm8k/train.jsonl\n")
    try:
        assert outside_references([probe]) == ["docs/results/_probe_outside.md:1"]
    finally:
        probe.unlink()


MATH_MODULES = {
    "scripts/verifier_probe.py",  # a study of the math Verifier
    "scripts/review_study.py",  # a study of math_review's Verifier
    "scripts/review_retry_probe.py",  # math_review's retry message, probed
    "scripts/long_runs.py",  # a study of the math job's long runs
    "benchmarks/peer_trl.py",  # the math task's Solver alone against TRL's GRPOTrainer
}
MATH_PACKAGES = ("pipeline/tasks/", "pipeline/workflows/math/")  # the math tasks, the math workflows and their embedded model


def _role_names(path: Path):
    """(line, token) of every "solver"/"verifier" string literal and SOLVER/VERIFIER name."""
    import io
    import tokenize

    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if (tok.type == tokenize.STRING and tok.string.strip("\"'") in ("solver", "verifier")) or (
            tok.type == tokenize.NAME and tok.string in ("SOLVER", "VERIFIER")
        ):
            yield tok.start[0], tok.line, tok.start[1], tok.string


def test_no_math_role_name_outside_the_math_workflow_except_as_a_default():
    """Nothing downstream knows the math workflow's roles: a role name outside its own modules
    may only stand as a default or a label (right of a single "=" or of a dict key's ":": a
    parameter's, a field's, a keyword's, a synthetic row's value), never in a comparison or a
    filter."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files += [str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*.py")]  # new files not yet added
    bad = []
    for name in sorted(set(files)):
        if name.startswith("tests/") or name in MATH_MODULES or name.startswith(MATH_PACKAGES):
            continue
        for line_no, line, col, token in _role_names(ROOT / name):
            left = line[:col]
            assigned = "=" in left.replace("==", "").replace("!=", "") or left.rstrip().endswith(":")
            is_default = assigned and "==" not in line and "!=" not in line
            if not is_default:
                bad.append(f"{name}:{line_no}: {token}")
    assert not bad, "math role names outside the math workflow:\n" + "\n".join(bad)
