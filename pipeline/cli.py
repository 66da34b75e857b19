"""`maxit ...`: the command line. Argument parsing lives here; every command is a thin call into
the library, and heavy modules are imported only by the command that needs them."""

from __future__ import annotations

import argparse
import glob
import sys
import time
from pathlib import Path

from pipeline.errors import MaxitError, SchemaError

__all__ = ["main", "build_parser"]


def _print_frame(df, title: str | None = None) -> None:
    import polars as pl

    if title:
        print(f"\n{title}")
    with pl.Config(tbl_rows=200, tbl_cols=30, tbl_width_chars=200, float_precision=3, tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(df)


def _parse_weights(items: list[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    weights: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise MaxitError(f"--strategy-weight takes STRATEGY=WEIGHT, got {item!r}")
        try:
            weights[name] = float(value)
        except ValueError:
            raise MaxitError(f"--strategy-weight {item!r}: {value!r} is not a number") from None
    return weights


def add_advantage_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("advantages (AdvantageConfig)")
    g.add_argument(
        "--group-by",
        nargs="*",
        default=None,
        metavar="COL",
        help="columns added to uid to form a group (agent_id turn strategy; default all three; none = plain GRPO)",
    )
    g.add_argument("--normalize", choices=["std", "center"], default="std")
    g.add_argument("--trajectory-mean", action="store_true", help="one member per trajectory (the seed's standard GRPO)")
    g.add_argument("--singleton", choices=["zero", "raw"], default="zero")
    g.add_argument("--eps", type=float, default=1e-6)
    g.add_argument("--alpha", type=float, default=1.0, help="reward = alpha*global_reward + local_reward")
    g.add_argument("--strategy-weight", action="append", metavar="S=W", help="mixture weight of a strategy (repeat)")


def advantage_config_from_args(args):
    from pipeline.config import AdvantageConfig

    group_by = args.group_by
    if group_by is None:
        group_by = ("agent_id", "turn", "strategy")
    elif group_by == ["none"] or group_by == []:
        group_by = ()
    return AdvantageConfig(
        group_by=tuple(group_by),
        normalize=args.normalize,
        trajectory_mean=args.trajectory_mean,
        singleton=args.singleton,
        eps=args.eps,
        alpha=args.alpha,
        strategy_weights=_parse_weights(args.strategy_weight),
    )


def cmd_advantages(args) -> int:
    import polars as pl

    from pipeline import store
    from pipeline.advantages import advantage_metrics, compute_advantages

    config = advantage_config_from_args(args)
    if args.demo:
        from pipeline.synthetic import synthetic_steps

        steps = synthetic_steps(n_problems=args.demo_problems, samples=4, seed=args.seed, full=True)
        source = f"a generated demo table ({steps.height} rows: {args.demo_problems} problems x 3 strategies x 4 samples x 2 agents x 3 turns)"
        if args.steps is not None:
            raise MaxitError("--demo generates its own steps table; drop --steps (or drop --demo)")
    else:
        if args.steps is None:
            raise MaxitError("--steps IN.parquet is required (or --demo to use a generated table)")
        paths = [Path(p) for p in sorted(glob.glob(args.steps))] if any(ch in args.steps for ch in "*?[") else [Path(args.steps)]
        missing = [str(p) for p in paths if not p.exists()]
        if not paths or missing:
            raise MaxitError(f"--steps: no such file: {missing[0] if missing else args.steps}")
        steps = pl.scan_parquet([str(p) for p in paths], hive_partitioning="round=" in args.steps)
        source = ", ".join(map(str, paths))
    t0 = time.perf_counter()
    out = compute_advantages(steps, config)
    dt = time.perf_counter() - t0
    store.write_table(out, args.out)
    print(f"advantages of {source}")
    print(f"grouping uid+{'+'.join(config.group_by) or '(nothing)'}, normalize={config.normalize}, trajectory_mean={config.trajectory_mean}, alpha={config.alpha}")
    print(f"{out.height} rows in {dt:.2f} s -> {args.out}")
    _print_frame(advantage_metrics(out, config), "per agent and strategy:")
    return 0


def cmd_sql(args) -> int:
    from pipeline.analysis import run_sql

    df = run_sql(args.query, args.store)
    _print_frame(df)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maxit", description="Multi-Agent eXpert ITeration: train teams of LLM agents by expert iteration.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("advantages", help="recompute group advantages of stored rollouts (no generation)")
    p.add_argument("--steps", help="steps table(s): a Parquet file or a glob such as 'runs/x/round=*/steps.parquet'")
    p.add_argument("--out", required=True, help="where to write the advantages table (atomically)")
    p.add_argument("--demo", action="store_true", help="run on a generated demo table instead of --steps")
    p.add_argument("--demo-problems", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    add_advantage_flags(p)
    p.set_defaults(func=cmd_advantages)

    p = sub.add_parser("sql", help="SQL over every round's tables (DuckDB)")
    p.add_argument("query")
    p.add_argument("--store", default="runs/default")
    p.set_defaults(func=cmd_sql)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (MaxitError, SchemaError, FileNotFoundError) as err:
        print(f"maxit {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
