"""The team against its budget-matched baselines over seeds: one table of the stores' baselines.

    .venv/bin/python scripts/teams_study.py STORE [STORE ...]

Each STORE is a team's store (one seed) on which `maxit baselines --store STORE` and
`maxit baselines --store STORE --arm ARM ...` ran (`--trained-single` is `--arm single`). Prints,
as markdown, one row per arm of `maxit report`'s baselines block
(`pipeline.reporting.markdown.baselines_summary`) with its success in percent over the stores, mean and
(min..max), and the calls per held-out problem; then the training rows of the team and of each
trained arm per round, summed over the policies, mean and (min..max) over the stores; then the
verdict over the stores (`pipeline.reporting.verdict.verdict_across`: against which arm the team pays,
by how much, "no difference" inside the seed spread). An arm a store lacks is an error naming the
store.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rounded(who: str) -> str:
    """A `baselines_summary` row's label without the round its store stopped at."""
    return re.sub(r"round \d+", "last round", who)


def _arm(who: str) -> str:
    """The arm of a `baselines_summary` row: its label without the round and without the calls of
    its vote or self-refine (a store's k follows that store's team calls)."""
    return re.sub(r"(best-of-|self-refine x)\d+", r"\1k", _rounded(who))


def _spread(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    values = [scale * v for v in values]
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}..{max(values):.{digits}f})"


def arms(stores: list[Path], partial: bool = False) -> list[tuple[str, list[float], list[float | None]]]:
    """(arm, success per store, calls per store) in the order of the first store's block. An arm
    some stores lack is an error naming it, or with `partial` left out (named on stderr): a study
    whose last arms are still running."""
    from pipeline.reporting.markdown import baselines_summary
    from pipeline.reporting.verdict import label_over_stores

    table: dict[str, tuple[list[float], list[float | None]]] = {}
    labels: dict[str, list[str]] = {}
    for store in stores:
        summary = baselines_summary(store)
        if summary is None:
            raise SystemExit(f"teams_study: store {store}: no baselines table (maxit baselines --store {store})")
        for row in summary[0].iter_rows(named=True):
            if row["success"] is None:
                continue
            success, calls = table.setdefault(_arm(row["who"]), ([], []))
            success.append(row["success"])
            calls.append(row["calls"])
            labels.setdefault(_arm(row["who"]), []).append(_rounded(row["who"]))
    for name, (success, _) in list(table.items()):
        if len(success) != len(stores):
            if not partial:
                raise SystemExit(f"teams_study: arm {name!r} is in {len(success)} of the {len(stores)} stores (--partial leaves it out)")
            print(f"teams_study: left out, in {len(success)} of the {len(stores)} stores: {name}", file=sys.stderr)
            del table[name]
    return [(label_over_stores(labels[name]), success, calls) for name, (success, calls) in table.items()]


def rows_by_round(stores: list[Path]) -> list[str]:
    """Markdown lines: per round, the team's training rows and each trained arm's (the arms some
    store has)."""
    from pipeline.run.arms import ARMS, arm_store, train_rows

    team = [train_rows(s) for s in stores]
    arms = {arm: [train_rows(arm_store(s, arm)) for s in stores] for arm in ARMS}
    arms = {arm: per for arm, per in arms.items() if any(per)}
    rounds = sorted(set.intersection(*(set(t) for t in team)))
    lines = ["| round | team's training rows | " + " | ".join(f"{ARMS[a]}'s" for a in arms) + " |", "|---:|---:|" + "---:|" * len(arms)]
    for r in rounds:
        cells = []
        for per in arms.values():
            mine = [s.get(r) for s in per]
            cells.append(_spread([float(v) for v in mine], 1.0, 0) if None not in mine else "-")
        lines.append(f"| {r} | {_spread([float(t[r]) for t in team], 1.0, 0)} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="+", type=Path)
    ap.add_argument("--partial", action="store_true", help="leave out the arms some stores lack (named on stderr) instead of stopping")
    args = ap.parse_args(argv)
    print(f"| arm | success, mean (min..max) over {len(args.stores)} stores | calls/problem |")
    print("|---|---:|---:|")
    for name, success, calls in arms(args.stores, args.partial):
        known = [c for c in calls if c is not None]
        print(f"| {name} | {_spread(success)} | {sum(known) / len(known):.2f} |" if known else f"| {name} | {_spread(success)} |  |")
    print()
    print("\n".join(rows_by_round(args.stores)))
    from pipeline.reporting.verdict import verdict_across

    print()
    print("\n".join(verdict_across(args.stores)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
