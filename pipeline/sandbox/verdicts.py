"""Tests for rewards: `parse_tests` reads `assert EXPR == LITERAL` lines or (EXPR, value) pairs,
and `verdicts` decides each test's pass or fail in the parent from the values the sandboxed
harness reported (tagged JSON, decoded into builtin types only) against the expected values,
which never enter the sandbox."""

from __future__ import annotations

import ast
import json
from typing import Any, Sequence

from pipeline.sandbox.results import SandboxError, TestCase, TestResult

__all__ = ["parse_tests", "verdicts"]


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is made only of the types a test can expect (what ast.literal_eval makes)."""
    if depth > 100:
        return False
    t = type(value)
    if value is None or t in (bool, int, float, complex, str, bytes):
        return True
    if t in (list, tuple, set, frozenset):
        return all(_plain(x, depth + 1) for x in value)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def parse_tests(tests: str | Sequence) -> list[TestCase]:
    """Tests as `assert EXPR == LITERAL` lines (MBPP style; the literal may be on either side),
    or a sequence of (EXPR, expected value) pairs. Any other kind of test is refused: the value
    an `assert EXPR` expects (True) is known to the program, so a program could claim it
    without computing anything."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as err:
            raise SandboxError(f"tests: not Python: {err}") from None
        cases = []
        for node in tree.body:
            where = f"tests line {node.lineno}"
            if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                    and isinstance(node.test.ops[0], ast.Eq)):
                raise SandboxError(f"{where}: only `assert EXPR == LITERAL` tests can be checked unforgeably: "
                                   f"{ast.get_source_segment(tests, node)!r}")
            left, right = node.test.left, node.test.comparators[0]
            for expr, lit in ((left, right), (right, left)):
                try:
                    expected = ast.literal_eval(lit)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                cases.append(TestCase(ast.get_source_segment(tests, expr), expected))
                break
            else:
                raise SandboxError(f"{where}: neither side of == is a literal: {ast.get_source_segment(tests, node)!r}")
        return cases
    cases = []
    for i, item in enumerate(tests):
        if isinstance(item, TestCase):
            expr, expected = item.expr, item.expected
        else:
            try:
                expr, expected = item
            except (TypeError, ValueError):
                raise SandboxError(f"tests[{i}]: expected an (expression, expected value) pair, got {item!r}") from None
        if not isinstance(expr, str):
            raise SandboxError(f"tests[{i}]: the expression must be a str, not {type(expr).__name__}")
        try:
            compile(expr, f"<test {i}>", "eval")
        except SyntaxError as err:
            raise SandboxError(f"tests[{i}]: not an expression: {expr!r} ({err.msg})") from None
        if not _plain(expected):
            raise SandboxError(f"tests[{i}]: the expected value must be made of None, bool, int, float, complex, str, bytes, "
                               f"list, tuple, set, frozenset and dict, not {type(expected).__name__}")
        cases.append(TestCase(expr, expected))
    return cases


def _decode(x: Any, depth: int = 0) -> Any:
    """The candidate's value from its tagged JSON; only builtin types come out."""
    if depth > 100 or not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise ValueError("malformed value")
    tag, rest = x[0], x[1:]

    def one(kind):
        if len(rest) != 1 or not isinstance(rest[0], kind):
            raise ValueError("malformed value")
        return rest[0]

    if tag == "n" and not rest:
        return None
    if tag == "b":
        return one(bool)
    if tag == "i":
        text = one(str)
        if len(text) > 100_000:
            raise ValueError("integer too large")
        return int(text, 16)
    if tag == "f":
        return float.fromhex(one(str))
    if tag == "c" and len(rest) == 2 and all(isinstance(r, str) for r in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "s":
        return one(str)
    if tag == "y":
        return bytes.fromhex(one(str))
    if tag in ("l", "t", "S", "F"):
        items = [_decode(v, depth + 1) for v in one(list)]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        pairs = one(list)
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ValueError("malformed value")
        return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in pairs}
    raise ValueError("malformed value")


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(_same_types(a[k], b[k]) and any(_same_types(k, kb) and k == kb for kb in b) for k in a if k in b)
    return True


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def verdicts(cases: list[TestCase], chan: bytes, strict_types: bool) -> tuple[list[TestResult], str | None]:
    """Each case's result from the results channel `chan` (one JSON record per line: {"i": case,
    "v": value} or {"i": case, "e": error}, {"load": error} when the code raised): passed when
    its one value equals the expected value (and has its types, with `strict_types`); a case
    with no record, or two, failed. Returns (results, the code's load error or None)."""
    records: dict[int, list] = {}
    load_error = None
    for line in chan.split(b"\n"):
        if not line:
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if "load" in rec and isinstance(rec["load"], str):
            load_error = load_error or rec["load"][:300]
        i = rec.get("i")
        if type(i) is int and 0 <= i < len(cases):
            records.setdefault(i, []).append(rec)
    results = []
    for i, case in enumerate(cases):
        expected = _short_repr(case.expected)
        recs = records.get(i, [])
        if not recs:
            why = f"the code raised {load_error}" if load_error else "no result: the program ended or was stopped before this test reported"
            results.append(TestResult(case.expr, expected, False, error=why))
            continue
        if len(recs) > 1:
            results.append(TestResult(case.expr, expected, False, error="more than one result for this test"))
            continue
        rec = recs[0]
        if "e" in rec:
            results.append(TestResult(case.expr, expected, False, error=str(rec["e"])[:300]))
            continue
        try:
            actual = _decode(rec.get("v"))
            passed = bool(actual == case.expected) and (not strict_types or _same_types(actual, case.expected))
        except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
            results.append(TestResult(case.expr, expected, False, error=f"unreadable result: {err}"[:300]))
            continue
        results.append(TestResult(case.expr, expected, passed, actual=_short_repr(actual)))
    return results, load_error
