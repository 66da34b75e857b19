"""Small arithmetic in words: one-step word problems ("Mia has 7 apples. She buys 5 more. How many
apples does Mia have now?") written to a GSM8K-style JSONL file, for a task where a small real
chat model has headroom: it follows the "####" format and gets some of the arithmetic wrong
(docs/results/real-models.md has the measurement).

`word_problems(n, seed)` returns the rows (question, answer "<one-line solution>\\n#### <number>");
`write_word_problems(path, n, seed)` writes them; `maxit run --task-file` then trains on the file
like any GSM8K file (chain-of-thought prompts, "#### <number>" answers, math-verify reward, and
the file task's split: a hash of the question puts 10% of the problems in the held-out split,
never trained on). `python -m pipeline.tasks.words --out FILE --n N` is the command line.

Problems: addition or subtraction of two numbers (`max_operand`, default 20; subtractions never
go below zero), each drawn with one of a few sentence frames (buying, giving away, finding,
eating...), names and objects. Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from pipeline.errors import ConfigError

__all__ = ["word_problems", "write_word_problems", "main"]

_NAMES = ("Mia", "Tom", "Sara", "Ben", "Lily", "Sam", "Anna", "Leo", "Emma", "Jack", "Nora", "Max")
_THINGS = ("apples", "pencils", "marbles", "stickers", "books", "cookies", "stamps", "shells", "cards", "balloons")

# (text, operator): {n} name, {a} {b} numbers, {t} thing; the question always ends with "now?"
_ADD = (
    "{n} has {a} {t}. {n} buys {b} more {t}. How many {t} does {n} have now?",
    "{n} has {a} {t}. A friend gives {n} {b} more {t}. How many {t} does {n} have now?",
    "There are {a} {t} in a box. {n} puts {b} more {t} in the box. How many {t} are in the box now?",
    "{n} found {a} {t} on Monday and {b} {t} on Tuesday. How many {t} did {n} find in all?",
)
_SUB = (
    "{n} has {a} {t}. {n} gives away {b} {t}. How many {t} does {n} have now?",
    "There are {a} {t} in a box. {n} takes {b} {t} out of the box. How many {t} are in the box now?",
    "{n} had {a} {t} and lost {b} of them. How many {t} does {n} have now?",
)


def word_problems(n: int, seed: int = 0, max_operand: int = 20) -> list[dict]:
    """`n` distinct word problems (rows with question and answer), drawn from `seed`."""
    if n < 1:
        raise ConfigError(f"--n must be at least 1, got {n}")
    if max_operand < 2:
        raise ConfigError(f"--max-operand must be at least 2, got {max_operand}")
    rng = random.Random(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 50 * n + 1000:
            raise ConfigError(f"only {len(rows)} distinct problems exist with --max-operand {max_operand}; ask for fewer")
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        if rng.random() < 0.5:
            a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
            text, value, work = rng.choice(_ADD), a + b, f"{a} + {b} = {a + b}"
        else:
            a = rng.randint(2, max_operand)
            b = rng.randint(1, a)
            text, value, work = rng.choice(_SUB), a - b, f"{a} - {b} = {a - b}"
        question = text.format(n=name, a=a, b=b, t=thing)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": f"{work}\n#### {value}"})
    return rows


def write_word_problems(path: str | Path, n: int, seed: int = 0, max_operand: int = 20) -> Path:
    """Write `word_problems(n, seed, max_operand)` to `path` as JSONL; returns the path."""
    rows = word_problems(n, seed, max_operand)
    p = Path(path)
    if p.suffix.lower() != ".jsonl":
        raise ConfigError(f"--out {p} must end in .jsonl")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tasks.words", description="write small arithmetic word problems as a GSM8K-style JSONL task file")
    ap.add_argument("--out", required=True, help="the .jsonl file to write")
    ap.add_argument("--n", type=int, default=2000, help="number of problems (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-operand", type=int, default=20, help="largest number in a problem (default 20)")
    args = ap.parse_args(argv)
    try:
        p = write_word_problems(args.out, args.n, args.seed, args.max_operand)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.n} problems -> {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
