"""The `math_review` team played as deployed against its own Solver alone, over seeds.

    PYTHONPATH=. .venv/bin/python scripts/review_study.py --round 4 STORE [STORE ...]

Each STORE is a `maxit run --workflow math_review` store (one seed). Prints, as markdown, one row
per metric of the round's held-out evaluation (`pipeline.workflows.math.review.evaluate_review`)
with its value in percent per store and the mean and (min..max) over the stores, and the paired
difference deployed - first answer per store. A store without that round is an error naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = (
    ("team", "success", "team as deployed (final answer), sampled"),
    ("solver", "first_answer_accuracy", "its Solver alone (first answer, same episodes)"),
    ("team", "fixed", "first answer wrong, final right"),
    ("team", "broken", "first answer right, final wrong"),
    ("team", "success_greedy", "team as deployed, greedy"),
    ("solver", "accuracy_greedy", "Solver alone, greedy"),
    ("solver", "accuracy", "Solver accuracy (its own pass, T=1)"),
    ("verifier", "review_balanced_accuracy", "Verifier balanced accuracy, fixed balanced set (T=1)"),
    ("verifier", "review_balanced_accuracy_greedy", "the same, greedy"),
    ("verifier", "review_accuracy_right", "  on its right answers (T=1)"),
    ("verifier", "review_accuracy_wrong", "  on its near misses (T=1)"),
    ("verifier", "review_parsable", "  verdicts parsable (T=1)"),
    ("verifier", "verdict_balanced_accuracy", "Verifier balanced accuracy on the Solver's own answers (T=1)"),
    ("verifier", "approve_rate", "Verifier approve rate on the Solver's answers"),
)


def _spread(values: list[float]) -> str:
    values = [100 * v for v in values]
    return f"{sum(values) / len(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def main(argv=None) -> int:
    import polars as pl

    from pipeline.store import Tables

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stores", nargs="+", type=Path)
    ap.add_argument("--round", type=int, default=4, help="the round compared (default 4)")
    args = ap.parse_args(argv)
    values: dict[tuple[str, str], list[float]] = {}
    for store in args.stores:
        ev = Tables(store).scan("evaluation").filter(pl.col("round") == args.round).collect()
        if ev.is_empty():
            print(f"error: store {store} has no evaluation of round {args.round}", file=sys.stderr)
            return 2
        got = {(a, m): v for a, m, v in ev.select("agent_id", "metric", "value").iter_rows()}
        for key, _ in ((k[:2], k[2]) for k in ROWS):
            if key in got:
                values.setdefault(key, []).append(got[key])
        diff = got.get(("team", "success"), float("nan")) - got.get(("solver", "first_answer_accuracy"), float("nan"))
        values.setdefault(("diff", "deployed_minus_first"), []).append(diff)
    names = " / ".join(s.name for s in args.stores)
    print(f"| round {args.round} | mean (min..max) | {names} |\n|---|---:|---|")
    for agent, metric, label in (*ROWS, ("diff", "deployed_minus_first", "deployed - Solver alone (paired, points)")):
        vs = values.get((agent, metric))
        if vs and len(vs) == len(args.stores):
            print(f"| {label} | {_spread(vs)} | {' / '.join(f'{100 * v:.1f}' for v in vs)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
