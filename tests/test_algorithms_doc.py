"""docs/ALGORITHMS.md cites the code by name (`compute_advantages`, `AdvantageConfig.group_by`,
`pipeline/learn/views.py`): every such name must exist in the project, so the page cannot send a
reader to a function that was renamed or never written.

A backticked token is a code name when it is a (dotted) Python identifier with an underscore, a
dot or a capital letter, or a path with a slash. It exists when it is: a path of the repository;
a function, class or assigned name in the project's modules; `Class.attr` where the project's
class `Class` has `attr` (a field, method or class attribute); a dotted module path; or a string
the code uses as a name (a column, a strategy id, a file it writes). The few names the page
quotes from its sources and its formulas' symbols are listed below, by hand."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "assets", "maxit", "schemas", "scripts", "benchmarks")

NOT_THE_PROJECTS = {
    # the sources' own names, quoted as theirs
    "group_by_agent_id", "env.rollout.n", "clip_ratio_c", "compute_policy_loss", "ppo_mini_update_num", "GRPOTrainer", "score_i",
    # symbols of the formulas (the Notation paragraph and the estimators)
    "A", "N", "m_j", "n_s", "w_s", "p_old", "r_i", "x_sample", "x_train",
}

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*(/[A-Za-z_][A-Za-z0-9_.-]*)+/?$")


@lru_cache(maxsize=1)
def project_names() -> tuple[frozenset, dict, frozenset, frozenset]:
    """(defined names, {class: its attributes}, module paths, identifier-like string constants)."""
    names: set[str] = set()
    classes: dict[str, set[str]] = {}
    modules: set[str] = set()
    strings: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            modules.add(".".join(parts))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    attrs = classes.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                            attrs.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            attrs.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                        elif isinstance(target, ast.Attribute):
                            names.add(target.attr)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value and len(node.value) < 60:
                    strings.add(node.value)
    return frozenset(names), {k: frozenset(v) for k, v in classes.items()}, frozenset(modules), frozenset(strings)


def code_names(text: str) -> list[str]:
    """The backticked tokens of `text` that look like code names of the project."""
    out = []
    for token in re.findall(r"`([^`\n]+)`", text):
        if PATH.match(token) or (IDENTIFIER.match(token) and ("_" in token or "." in token or token != token.lower())):
            out.append(token)
    return list(dict.fromkeys(out))


def missing_names(text: str) -> list[str]:
    """The code names `text` cites that the project does not have."""
    names, classes, modules, strings = project_names()
    missing = []
    for token in code_names(text):
        if token in NOT_THE_PROJECTS:
            continue
        if "/" in token:
            found = (ROOT / token).exists()
        elif "." in token:
            head, *rest = token.split(".")
            if head in classes:
                found = len(rest) == 1 and rest[0] in classes[head]
            else:
                found = token in modules or token in strings
        else:
            found = token in names or token in strings
        if not found:
            missing.append(token)
    return missing


def test_every_code_name_algorithms_md_cites_exists():
    text = (ROOT / "docs" / "ALGORITHMS.md").read_text(encoding="utf-8")
    assert len(code_names(text)) > 100  # the page cites the code throughout
    assert missing_names(text) == []


def test_the_check_finds_names_that_do_not_exist():
    """The check is not vacuous: made-up functions, fields of real classes that do not exist, and
    paths that are not there are reported; real ones are not."""
    text = ("Code: `pipeline/rollout/loop.py` `run_rollouts`, `_after_fake`; `RolloutConfig.max_loop_num`, `RolloutConfig.temperature`; "
            "`AdvantageConfig.group_by`, `Settings.no_such_setting`; `pipeline/nowhere.py`; `pipeline.learn.loss`, `pipeline.nowhere`; "
            "`traj_uid`, `prompt_aug`; `iid`, `--loss`, `#presets`")
    assert missing_names(text) == ["_after_fake", "RolloutConfig.max_loop_num", "Settings.no_such_setting", "pipeline/nowhere.py", "pipeline.nowhere"]
