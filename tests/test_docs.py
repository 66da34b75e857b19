"""The docs hold to the code: the README stays a front door (its size), every flag a doc names in a
`maxit` command exists on that command, every file of the checkout a doc names in backticks
exists, and every relative link points at a file of the checkout."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from maxit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200
README_MAX_BYTES = 16 * 1024
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines (at most {README_MAX_LINES})"
    assert len(text.encode()) <= README_MAX_BYTES, f"README.md has {len(text.encode())} bytes (at most {README_MAX_BYTES})"


def command_flags() -> dict[str, set[str]]:
    """command -> every option string its parser takes (subcommands of a command included)."""
    out: dict[str, set[str]] = {}

    def walk(name: str, parser: argparse.ArgumentParser):
        for action in parser._actions:
            out.setdefault(name, set()).update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub_parser in action.choices.values():
                    walk(name, sub_parser)

    top = build_parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in commands.choices.items():
        walk(name, parser)
    return out


MAXIT_CALL = re.compile(r"maxit (?P<command>[a-z]+)(?P<rest>[^`\n|]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def documented_flags(text: str) -> list[tuple[str, str]]:
    """(command, flag) for each `--flag` written after `maxit COMMAND` on the same line of code."""
    found = []
    for match in MAXIT_CALL.finditer(text):
        for flag in FLAG.findall(match["rest"]):
            found.append((match["command"], flag))
    return found


def test_documented_flags_exist():
    flags = command_flags()
    missing = []
    for doc in DOCS:
        for command, flag in documented_flags(doc.read_text()):
            if command in flags and flag not in flags[command]:
                missing.append(f"{doc.relative_to(ROOT)}: maxit {command} {flag}")
    assert not missing, "flags the docs name that the command does not take:\n" + "\n".join(missing)


def test_the_flag_check_sees_a_wrong_flag():
    flags = command_flags()
    found = documented_flags("run `maxit run --rounds 5 --no-such-flag`")
    assert ("run", "--no-such-flag") in found and "--no-such-flag" not in flags["run"]
    assert "--rounds" in flags["run"]


PATH = re.compile(r"`((?:pipeline|assets|maxit|scripts|tests|benchmarks|examples|docs|schemas)/[A-Za-z0-9_./-]+\.(?:py|md|sh|toml|yaml|json))`")
"""A file of the checkout named in backticks (`pipeline/run/arms.py`)."""


def documented_paths(text: str) -> list[str]:
    return PATH.findall(text)


def test_documented_paths_exist():
    missing = [f"{doc.relative_to(ROOT)}: {path}" for doc in DOCS for path in documented_paths(doc.read_text()) if not (ROOT / path).exists()]
    assert not missing, "files the docs name that the checkout lacks:\n" + "\n".join(missing)


def test_the_path_check_sees_a_missing_file():
    found = documented_paths("the arms live in `pipeline/run/arms.py`, the old ones in `pipeline/run/baselines.py`")
    assert found == ["pipeline/run/arms.py", "pipeline/run/baselines.py"]
    assert (ROOT / found[0]).exists() and not (ROOT / found[1]).exists()


LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    broken = [target for target in LINK.findall(doc.read_text()) if not (doc.parent / target).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


def test_run_help_names_every_built_in_workflow():
    from pipeline.workflows import WORKFLOW_NAMES

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    help_text = next(a.help for a in run._actions if "--workflow" in a.option_strings)
    missing = [name for name in (*WORKFLOW_NAMES, "program:") if name not in help_text]
    assert not missing, f"maxit run --workflow's help does not name {missing}"
