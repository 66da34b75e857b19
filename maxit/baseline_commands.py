"""`maxit baselines`: a store's budget-matched baselines (`pipeline.run.baselines`), computed once
into its `baselines` table and printed beside the team; with `--trained-single`, the run of the
team's single agent at the team's training rows into the sibling store `<store>-single`.

The single agent's rounds are `maxit run`'s rounds on the sibling's own Dagster instance, each
materialized in two parts: its sampling stages (problems to training view), then, with its
`training_view` table cut to the team's rows of that round (`match_rows`), its training and
evaluation. A complete round is kept, an incomplete one made again from its first stage, as
`maxit run` resumes."""

from __future__ import annotations

from maxit.common import say

__all__ = ["add_baselines_parser"]


def add_baselines_parser(sub) -> None:
    p = sub.add_parser(
        "baselines",
        help="the team's budget-matched baselines: the starting model as a single agent at the team's calls per held-out problem "
        "(best-of-k majority vote, self-refine), kept as the store's baselines table; --trained-single also trains the single agent",
    )
    p.add_argument("--store", required=True, metavar="DIR", help="a store with at least round -1's evaluation (maxit run)")
    p.add_argument("--force", action="store_true", help="compute the baselines afresh, replacing the store's baselines table")
    p.add_argument(
        "--trained-single", action="store_true",
        help="also run the team's single agent, with the team's settings, as many rounds as the team completed, each trained on "
        "as many rows as the team's round (a seeded subset of its training view), into STORE-single (resumed like maxit run); "
        "maxit report shows it beside the team",
    )
    p.add_argument(
        "--single-problems", type=int, default=None, metavar="N",
        help="with --trained-single: the single agent's training problems per round (default: the team's, scaled by the team's "
        "calls per episode over the single agent's, so that it samples at least the team's rows to cut from)",
    )
    p.set_defaults(func=cmd_baselines)


def cmd_baselines(args) -> int:
    from pathlib import Path

    from assets.launch import console_to_log
    from pipeline.errors import ConfigError
    from pipeline.run.baselines import compute_baselines, single_store, team_of, trained_single_settings
    from pipeline.run.experiments import LOG_FILE
    from pipeline.run.report import baselines_markdown

    store = Path(args.store)
    if args.single_problems is not None and not args.trained_single:
        raise ConfigError("--single-problems is the trained single agent's: give it with --trained-single")
    if args.single_problems is not None and args.single_problems < 1:
        raise ConfigError(f"--single-problems must be >= 1, got {args.single_problems}")
    team_of(store)  # a folder that is not a recorded store is named before anything is written
    with console_to_log(store / LOG_FILE):  # the engines' output goes to the store's log, as maxit run's does
        compute_baselines(store, force=args.force)
    if args.trained_single:
        _run_single(store, single_store(store), *trained_single_settings(store, args.single_problems))
    print("\n".join(baselines_markdown(store, args.store)))
    return 0


def _run_single(store, sibling, settings, team_rows: dict[int, int]) -> None:
    """The trained single agent of `store`, run with `settings` into `sibling` as `maxit run` runs
    a store (its writer lock, experiment record, log and Dagster instance), round r trained on
    `team_rows[r]` rows; a line per round on the console."""
    from assets.config import RunSettings
    from assets.launch import console_to_log, dagster_home, instance_at
    from assets.resources import close_engines
    from pipeline.engines import vllm_available
    from pipeline.run.experiments import LOG_FILE, record_experiment
    from pipeline.store import Tables
    from pipeline.store.lock import acquire, command_line, token_in_env

    rounds = len(team_rows)
    say(f"maxit baselines: the trained single agent: workflow {' '.join((settings.workflow, *settings.workflow_options))}, "
        f"{settings.problems} problems per round, {rounds} round(s), each trained on the team's rows of that round, into {sibling}")
    settings.run_config()  # every setting checked before anything starts
    tables = Tables(sibling)
    tables.root.mkdir(parents=True, exist_ok=True)
    with acquire(tables.root, command=command_line()) as lock, token_in_env(lock.token):
        engine = settings.engine if settings.engine != "auto" else ("vllm" if vllm_available() else "hf")
        record_experiment(tables.root, settings, engine)
        run_settings = RunSettings.from_settings(settings)
        with console_to_log(tables.root / LOG_FILE) as (out, _err):
            instance = instance_at(dagster_home(tables.root))
            try:
                for r, rows in team_rows.items():
                    sampled = _single_round(instance, tables, r, run_settings, engine, rows)
                    line = f"round {r} already complete" if sampled is None else f"round {r}: trained {min(sampled, rows)} of its {sampled} rows"
                    print(f"maxit baselines: the trained single agent's {line} (the team's round {r}: {rows} rows)", file=out, flush=True)
            finally:
                close_engines()


def _single_round(instance, tables, r: int, settings, engine: str, rows: int) -> int | None:
    """Round `r` of the trained single agent, its training view cut to `rows` rows; the rows its
    view had (None: the round was complete and is kept)."""
    import pyarrow.parquet as pq

    from assets.launch import materialize_round
    from assets.overlap import SAMPLE_STAGES
    from pipeline.run.baselines import match_rows, match_seed
    from pipeline.run.rounds import round_complete

    if round_complete(tables, r):
        return None
    tables.remove_temporary(r)  # left by a run killed mid-write
    materialize_round(instance, tables, r, settings, engine, True, stages=SAMPLE_STAGES)
    view = pq.read_table(tables.path(r, "training_view"))  # as written: its types and its view statistics kept
    kept = match_rows(view, rows, match_seed(settings.seed, r))
    tables.write(r, "training_view", kept)
    materialize_round(instance, tables, r, settings, engine, True, stages=("policy", "evaluation"))
    return view.num_rows
