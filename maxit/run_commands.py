"""The `maxit` commands over whole rounds and stores: `run`, `rollout`, `ui`, `runs`, `report`,
`sql`. Each is a parser function (`add_*_parser`) and a thin call into the library."""

from __future__ import annotations

import sys
import time

from maxit.common import local_store, print_frame, print_source_notes, say
from pipeline.errors import MaxitError
from pipeline.run.settings import add_setting_flags

__all__ = [
    "add_run_parser",
    "add_ui_parser",
    "add_runs_parser",
    "add_report_parser",
    "add_rollout_parser",
    "add_sql_parser",
    "check_scale_out",
    "check_run_inputs",
    "small_splits",
]


def check_scale_out(config, store_dir: str) -> None:
    """The store's filesystem against the run's scale-out (`config`: its `RunConfig`, whose
    `ScaleConfig` checked the sizes), a one-line error naming the flag."""
    from pipeline.errors import ConfigError
    from pipeline.store import check_store_url, is_url

    if is_url(str(store_dir)):
        check_store_url(str(store_dir), "--store")  # scheme, package, bucket, reachable: nothing written
        if str(store_dir).startswith("memory://") and config.scale.shards > 1:
            raise ConfigError(
                f"--store {store_dir}: the memory filesystem is one process's, and --shards > 1 runs steps in processes of "
                "their own; use --shards 1, or a store every process can reach"
            )


def check_run_inputs(config, store_dir: str):
    """Before any work of `maxit run` / `maxit rollout`: the workflow of `config` (the run's
    `RunConfig`; imported and checked, with its task and prompt files), the strategies it must
    run, the store and the model folder, each a named error. Returns the workflow and the ids of
    the strategies the run samples."""
    from pipeline.learn.verdicts import check_verdict_training
    from pipeline.models.chat import check_model_dir
    from pipeline.run.context import build_workflow, run_strategies
    from pipeline.store import check_writable, is_url, working_copy

    check_scale_out(config, store_dir)
    workflow = build_workflow(config)  # imports and checks the workflow; a math task reads its file
    strategies = list(run_strategies(config, workflow))  # strategies the workflow cannot run are named here
    check_verdict_training(getattr(workflow, "task", None), config.view)
    # a URL store is worked on in a local copy under the project's cache
    check_writable(working_copy(store_dir) if is_url(store_dir) else store_dir, "--store", "folder")
    if config.model_dir:
        check_model_dir(config.model_dir, "--model-dir")
    return workflow, strategies


def small_splits(config, workflow) -> list[str]:
    """A line for each split that holds fewer problems than a round of `config` (its `RunConfig`)
    asks of it (a small task file), so that a run does not quietly train or evaluate on fewer
    problems than its flags say."""
    notes = []
    for split, flag, n, use in (("train", "--problems", config.problems, "each round draws from all"),
                                ("heldout", "--eval-problems", config.evaluation.problems, "every evaluation uses")):
        have = len(workflow.problems(split, n, config.seed))
        if have < n:
            notes.append(f"maxit run: note: {flag} {n}, but the task's {split} split holds {have} problems: {use} {have}")
    return notes


# -- maxit run ---------------------------------------------------------------------------------


def add_run_parser(sub) -> None:
    p = sub.add_parser("run", help="run N expert-iteration rounds in-process (Dagster), resuming complete rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--restart", action="store_true", help="re-run rounds that are already complete")
    p.add_argument(
        "--verbose", action="store_true",
        help="print engine and library output (vLLM, Dagster, progress bars, warnings) too; it always goes to STORE/maxit.log",
    )
    p.add_argument(
        "--store", default="runs/default",
        help="folder of the run's tables and checkpoints, or a URL (s3://bucket/run, gs://bucket/run with s3fs/gcsfs installed; file://, memory://): "
        "the URL is then the store of record, the run works in a local copy under the user's cache ($MAXIT_CACHE_DIR, else ~/.cache/maxit)",
    )
    add_setting_flags(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    import resource

    from assets.config import RunSettings
    from assets.run_rounds import run_rounds
    from pipeline.reporting.report import console_table
    from pipeline.run.settings import settings_from_args
    from pipeline.reporting.tracking import check_targets

    settings = settings_from_args(args)
    config = settings.run_config()  # validate every flag before anything starts
    check_targets(config.tracking.report_to)
    workflow, strategies = check_run_inputs(config, args.store)
    say(f"maxit run: algorithm {config.algorithm} (loss {config.train.loss.kind}), workflow {workflow.describe()}, strategies {' '.join(strategies)}")
    say_own_defaults("maxit run", args)
    for note in small_splits(config, workflow):
        say(note)
    print_source_notes("maxit run", settings, strategies, wrap=True)
    _note_settings_changes(args, settings)
    t0 = time.perf_counter()
    summary = run_rounds(args.rounds, args.store, RunSettings.from_settings(settings), engine=config.engine, restart=args.restart,
                         quiet_dagster=not args.verbose, verbose=args.verbose)
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    print()
    say(f"maxit run: {args.rounds} round(s) in {time.perf_counter() - t0:.0f}s, peak memory {peak:.0f} MB, store {args.store}")
    print(console_table(summary, workflow.table_metrics))
    for line in regressed_lines(summary):
        say(line)
    say(f"(every column: maxit report --markdown --store {args.store})")
    return 0


def say_own_defaults(command: str, args) -> None:
    """Say which settings the command took from the workflow's `run_defaults` (the flags it left
    unset), so that a run's budget is never a silent choice."""
    from pipeline.run.settings import setting_flag, workflow_defaults

    own = workflow_defaults({k: v for k, v in vars(args).items() if v is not None})
    if own:
        say(f"{command}: the workflow's own defaults: {', '.join(f'{setting_flag(k)} {v}' for k, v in own.items())} (a flag given overrides them)")


def regressed_lines(summary) -> list[str]:
    """A line for each round of the round table whose held-out metrics fell from their best by
    more than two standard errors (its `regressed` column), the last round's first."""
    from pipeline.reporting.report import REGRESSED_COLUMN

    if REGRESSED_COLUMN not in summary.columns:
        return []
    rows = [(r, text) for r, text in summary.select("round", REGRESSED_COLUMN).iter_rows() if text]
    if not rows:
        return []
    last, *earlier = sorted(rows, reverse=True)
    # not "round ...": the console's round lines start so, and only they
    lines = [f"held-out metrics under their best by more than 2 standard errors in round {last[0]}: {last[1]}"]
    if earlier:
        lines.append(f"so did rounds {', '.join(str(r) for r, _ in reversed(earlier))} (column `{REGRESSED_COLUMN}` of maxit report --markdown)")
    return lines


def _note_settings_changes(args, settings) -> None:
    """A note when the store last ran with other settings and holds complete rounds."""
    from pipeline.run.experiment_record import settings_changes
    from pipeline.store import is_url

    changes = [] if args.restart or is_url(args.store) else settings_changes(args.store, settings)
    if changes:
        say(f"maxit run: note: {args.store} last ran with other settings and holds complete rounds; this run uses "
            f"{', '.join(changes)} (experiment.json keeps the earlier values as previous_settings and previous_effective; "
            "--restart redoes every round)")


# -- maxit rollout ---------------------------------------------------------------------------------


def add_rollout_parser(sub) -> None:
    p = sub.add_parser("rollout", help="one round's problems and rollouts (what `maxit run` samples) -> DIR/round=R/steps.parquet")
    p.add_argument("--store", required=True, help="the run's folder or URL (its policy registry gives the checkpoint round R samples with)")
    p.add_argument("--round", type=int, default=0)
    add_setting_flags(p, groups=("team and task", "sampling", "rewards and advantages"))
    p.set_defaults(func=cmd_rollout)


def cmd_rollout(args) -> int:
    import polars as pl

    from pipeline.run.context import RoundContext
    from pipeline.run.rounds import stage_problems, stage_rollouts
    from pipeline.run.settings import settings_from_args

    settings = settings_from_args(args)
    config = settings.run_config()
    if args.round < 0:
        raise MaxitError(f"--round must be >= 0, got {args.round}")
    _workflow, strategies = check_run_inputs(config, args.store)
    say_own_defaults("maxit rollout", args)
    print_source_notes("maxit rollout", settings, strategies)
    local_store(args.store)
    ctx = RoundContext(args.store, config)
    try:
        stage_rollouts(ctx, args.round, stage_problems(ctx, args.round), ctx.checkpoints.start_checkpoints(args.round))
    finally:
        ctx.engines.close()
    ctx.tables.publish(args.round)  # problems, steps, timings: one object each
    steps = ctx.tables.read(args.round, "steps")
    say(f"{steps.height} agent calls -> {ctx.tables.location_of(args.round, 'steps')}")
    print_frame(
        steps.group_by("agent_id", "strategy")
        .agg(pl.len().alias("rows"), pl.col("reward").mean().alias("reward_mean"), pl.col("completion_ids").list.len().mean().alias("tokens_mean"))
        .sort("agent_id", "strategy")
    )
    return 0


# -- maxit ui, runs, report, sql -------------------------------------------------------------------


def add_ui_parser(sub) -> None:
    p = sub.add_parser("ui", help="the Dagster UI (dagster dev) on 127.0.0.1; Ctrl-C stops it cleanly")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument(
        "--store", default=None,
        help="the store (experiment) whose rounds the UI shows and whose runs it starts write to; its Dagster instance is "
        "STORE/.dagster (default runs/default); a URL store's is in its local working copy",
    )
    add_setting_flags(p, groups=(), names=("engine",))  # the run's setting: its help and choices are its field's
    p.set_defaults(func=cmd_ui)


def cmd_ui(args) -> int:
    from assets.ui import ui
    from pipeline.errors import ConfigError
    from pipeline.store import check_store_url, is_url

    if args.store is not None and is_url(args.store):
        check_store_url(args.store, "--store")
        if args.store.startswith("memory://"):
            raise ConfigError(f"--store {args.store}: the UI runs its steps in processes of its own, and the memory filesystem is one process's")
    return ui(host=args.host, port=args.port, store=args.store, engine=args.engine)


def add_runs_parser(sub) -> None:
    p = sub.add_parser("runs", help="list the experiments (stores) under folders: settings, complete rounds, last accuracies")
    p.add_argument("--root", action="append", metavar="DIR", help="folder holding stores, or a store (repeat; default runs)")
    p.set_defaults(func=cmd_runs)


def cmd_runs(args) -> int:
    import polars as pl

    from pipeline.errors import ConfigError
    from pipeline.reporting.experiments import experiments_table
    from pipeline.store import is_url

    for root in args.root or []:
        if is_url(root):
            raise ConfigError(f"--root {root}: maxit runs lists local folders; for a URL store use maxit sql --store {root} or maxit report --store {root}")
    table = experiments_table(args.root or ["runs"])
    if table.is_empty():
        print(f"no stores under {', '.join(args.root or ['runs'])}")
        return 0
    with pl.Config(fmt_str_lengths=300):
        print_frame(table.drop("settings"), f"{table.height} experiment(s)")
    print("\nsettings (those not at their default):")
    for store, settings in table.select("store", "settings").iter_rows():
        say(f"  {store}: {settings}")
    return 0


def add_report_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="a self-contained HTML report of one or more stores (accuracies, success, ratios, speed, time per stage) with --out; "
        "the round table as markdown on stdout with --markdown",
    )
    p.add_argument("--store", action="append", required=True, metavar="DIR", help="a store to draw, a folder or a URL (repeat to compare; one colour each)")
    p.add_argument("--out", default=None, help="the HTML file to write")
    p.add_argument(
        "--markdown", action="store_true",
        help="print each store's round table (held-out metrics, success per strategy, training rows and steps, seconds per stage; "
        "every column of the table maxit run prints at its end) as a markdown table, after a line naming the store, workflow, "
        "algorithm and seed",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from pipeline.reporting.html_report import build_report
    from pipeline.reporting.markdown import markdown_round_table
    from pipeline.store import check_writable

    if args.out is None and not args.markdown:
        raise MaxitError("maxit report needs --out FILE.html (the HTML report) or --markdown (the round table on stdout), or both")
    if args.out is not None:
        check_writable(args.out, "--out")
    local = [local_store(s) for s in args.store]
    if args.markdown:
        from pipeline.reporting.markdown import baselines_summary
        from pipeline.reporting.verdict import verdict_across

        # every table is made before any is printed: a bad store leaves stdout empty
        tables = [markdown_round_table(path, label=name) for path, name in zip(local, args.store)]
        judged = [(path, name) for path, name in zip(local, args.store) if baselines_summary(path) is not None]
        if len(judged) > 1:  # a team's seeds: the verdict against the seed spread
            tables.append("\n".join(verdict_across([p for p, _ in judged], [n for _, n in judged])))
        print("\n\n".join(tables))
    if args.out is not None:
        out = build_report(local, args.out)
        print(f"report of {len(args.store)} store(s) -> {out}", file=sys.stderr if args.markdown else sys.stdout)
    return 0


def add_sql_parser(sub) -> None:
    p = sub.add_parser("sql", help="SQL over every round's tables (DuckDB)")
    p.add_argument("query")
    p.add_argument("--store", default="runs/default", help="a store folder, or a URL (its tables are downloaded to its local working copy first)")
    p.set_defaults(func=cmd_sql)


def cmd_sql(args) -> int:
    from pipeline.store import check_table_file
    from pipeline.store.analysis import run_sql

    store = local_store(args.store)
    for path in sorted(store.glob("round=*/*.parquet")):
        check_table_file(path)  # a corrupt or truncated file is named, not a DuckDB traceback
    print_frame(run_sql(args.query, store), width=200)  # the columns the query asked for, as before the 120 rule
    return 0
