"""The staleness study's tables (docs/results/async.md) from its stores.

The stores are `DIR/<variant>-s<seed>`, one `maxit run --rounds R --seed S` each, e.g. `k0-s0`
(synchronous), `k1-s2` (`--max-staleness 1`), `k2-tis-s0` (`--max-staleness 2
--off-policy-correction tis`). Per variant: the seeds found, the held-out metrics of the last round
(mean and min..max over the seeds), the gain over the starting model, the rows trained, and the
importance-ratio diagnostics of the rounds whose rows were stale (mean log ratio, ESS fraction,
masked and truncated shares), grouped by staleness.

    .venv/bin/python scripts/staleness_study.py DIR [--metrics solver/accuracy verifier/verdict_balanced_accuracy]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def spread(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    return f"{mean * scale:.1f} ({min(values) * scale:.1f}..{max(values) * scale:.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--rounds", type=int, default=5, help="rounds a store must have completed to count (default 5)")
    ap.add_argument("--metrics", nargs="+", default=["solver/accuracy", "solver/accuracy_greedy", "verifier/verdict_balanced_accuracy"])
    args = ap.parse_args(argv)
    stores = defaultdict(dict)
    for path in sorted(Path(args.dir).iterdir()):
        m = re.fullmatch(r"(.+)-s(\d+)", path.name)
        if m and path.is_dir() and (path / f"round={args.rounds - 1}" / "evaluation.parquet").exists():
            stores[m.group(1)][int(m.group(2))] = path
    header = ["variant", "seeds"] + [f"{m} last" for m in args.metrics] + [f"{m} gain" for m in args.metrics]
    header += [f"{args.metrics[0]} gain by seed", "rows trained"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    diag_rows = []
    for variant, seeds in sorted(stores.items()):
        last, gain, rows = defaultdict(list), defaultdict(list), []
        for seed, path in sorted(seeds.items()):
            ev = pl.read_parquet(str(path / "round=*" / "evaluation.parquet"), hive_partitioning=False)
            final = args.rounds - 1
            ev = ev.filter(pl.col("round") <= final)
            for metric in args.metrics:
                agent, name = metric.split("/")
                pick = ev.filter((pl.col("agent_id") == agent) & (pl.col("metric") == name))
                end = pick.filter(pl.col("round") == final)["value"].mean()
                start = pick.filter(pl.col("round") == -1)["value"].mean()
                last[metric].append(end)
                gain[metric].append(end - start)
            rows.append(sum(pl.scan_parquet(path / f"round={r}" / "training_view.parquet").select(pl.len()).collect().item() for r in range(args.rounds)))
            diag = pl.concat([pl.read_parquet(path / f"round={r}" / "ratio_diagnostics.parquet") for r in range(args.rounds)], how="vertical_relaxed")
            if "staleness" in diag.columns:
                whole = diag.filter((pl.col("agent_id") == "*") & (pl.col("strategy") == "*"))
                diag_rows.append(whole.with_columns(pl.lit(variant).alias("variant"), pl.lit(seed).alias("seed")))
        cells = [variant, ",".join(map(str, sorted(seeds)))]
        cells += [spread(last[m]) for m in args.metrics] + [spread(gain[m]) for m in args.metrics]
        cells += ["/".join(f"{g * 100:.1f}" for g in gain[args.metrics[0]]), f"{sum(rows) / len(rows):.0f}"]
        print("| " + " | ".join(cells) + " |")
    if diag_rows:
        cols = ["mean_log_ratio", "ess_fraction", "masked_fraction", "truncated_fraction"]
        if any("truncated_token_fraction" in d.columns for d in diag_rows):  # stores from before the column lack it
            cols.append("truncated_token_fraction")
        table = (pl.concat([d.select("variant", "seed", "round", "staleness", *[c for c in cols if c in d.columns]) for d in diag_rows],
                           how="diagonal_relaxed")
                 .group_by("variant", "staleness").agg(pl.len().alias("policy-rounds"), *[pl.col(c).mean().round(3) for c in cols])
                 .sort("variant", "staleness"))
        print("\nImportance-ratio diagnostics, every policy's overall row, mean over seeds and rounds, by staleness:\n")
        print("| " + " | ".join(table.columns) + " |")
        print("|" + "---|" * len(table.columns))
        for row in table.iter_rows():
            print("| " + " | ".join("-" if v is None else str(v) for v in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
