"""Rooms stay small enough to read: every module of the library, the Dagster layer and the CLI
holds at most `MAX_LINES` lines (a module past it holds more than one concern: split it along
its seams, named for what each part holds)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("pipeline", "assets", "maxit")
MAX_LINES = 400


def oversized(root: Path = ROOT, folders=FOLDERS, limit: int = MAX_LINES) -> list[str]:
    """'path: N lines' for each .py file under `folders` of `root` longer than `limit`."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def test_every_module_holds_at_most_400_lines():
    bad = oversized()
    assert not bad, f"modules over {MAX_LINES} lines (split each by concern):\n" + "\n".join(bad)


def test_the_check_names_a_long_module(tmp_path):
    (tmp_path / "pipeline" / "deep").mkdir(parents=True)
    (tmp_path / "pipeline" / "deep" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pipeline" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path, ("pipeline",)) == [f"pipeline/deep/long.py: {MAX_LINES + 1} lines"]
