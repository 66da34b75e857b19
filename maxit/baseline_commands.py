"""`maxit baselines`: a store's budget-matched baselines (`pipeline.run.arms`), computed once
into its `baselines` table and printed beside the team with the verdict; with `--arm ARM`
(repeatable: single, protocol, separate, shared, wide; `--trained-single` is `--arm single`), the run of
that arm at the team's training rows into the sibling store `<store>-ARM`, then the arm played
from its last round's checkpoints on the team's held-out problems and draws. Several `--store`s
(a team's seeds) add the verdict over them, against the seed spread.

An arm's rounds are `maxit run`'s rounds on the sibling's own Dagster instance, each
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
        "(best-of-k majority vote, self-refine), kept as the store's baselines table; --arm trains an arm at the team's rows; "
        "a verdict line per store (and over the stores given: a team's seeds)",
    )
    p.add_argument("--store", action="append", required=True, metavar="DIR",
                   help="a store with at least round -1's evaluation (maxit run); repeat for a team's seeds: the verdict over them")
    p.add_argument("--force", action="store_true", help="compute the baselines afresh, replacing the store's baselines table (and the arms' played rows)")
    p.add_argument(
        "--arm", action="append", default=[], metavar="ARM",
        help="also run this arm, with the team's settings, as many rounds as the team completed, each trained on as many rows as the "
        "team's round (a seeded subset of its training view), into STORE-ARM (resumed like maxit run), then play it from its last "
        "round on the team's held-out problems and draws: single (one agent doing the job; also played at the team's calls), "
        "protocol (the team's protocol played by one agent on one policy), separate / shared (the team on the other policy layout), "
        "wide (the single agent on an embedded model of the team's parameters: the grid's and plan_path's model_scale); "
        "repeatable; maxit report shows each beside the team",
    )
    p.add_argument("--trained-single", action="store_true", help="the same as --arm single")
    p.add_argument(
        "--single-problems", type=int, default=None, metavar="N",
        help="with --arm: the arm's training problems per round (default: single, the team's scaled by the team's calls per episode "
        "over the single agent's, so that it samples at least the team's rows to cut from; the others, the team's)",
    )
    p.add_argument(
        "--eval-problems", type=int, default=None, metavar="N",
        help="play the team and every arm on N held-out problems (default: the store's evaluation's; the same samples, temperature "
        "and seed); a store's or an arm's played rows of another number are played again, and the verdict compares rows of one number",
    )
    p.set_defaults(func=cmd_baselines)


def cmd_baselines(args) -> int:
    from pathlib import Path

    from assets.console import console_to_log
    from pipeline.errors import ConfigError
    from pipeline.config.fields import check_count
    from pipeline.run.arms import ARMS, arm_settings, arm_store, compute_arm_baselines, compute_baselines, team_of
    from pipeline.run.experiment_record import LOG_FILE
    from pipeline.reporting.markdown import baselines_markdown
    from pipeline.reporting.verdict import verdict_across

    arms = list(dict.fromkeys([*args.arm, *(["single"] if args.trained_single else [])]))
    for arm in arms:
        if arm not in ARMS:
            raise ConfigError(f"--arm must be one of {', '.join(ARMS)}, got {arm!r}")
    if args.single_problems is not None and not arms:
        raise ConfigError("--single-problems is the trained arms': give it with --arm (or --trained-single)")
    if args.single_problems is not None and args.single_problems < 1:
        raise ConfigError(f"--single-problems must be >= 1, got {args.single_problems}")
    if args.eval_problems is not None:  # a flag left out is the evaluation's number, not a count to check
        check_count("--eval-problems", args.eval_problems)
    stores = [Path(s) for s in args.store]
    if len(set(stores)) != len(stores):
        raise ConfigError(f"--store: {next(s for s in stores if stores.count(s) > 1)} is given twice")
    for store in stores:
        team_of(store)  # a folder that is not a recorded store is named before anything is written
    for store in stores:
        with console_to_log(store / LOG_FILE):  # the engines' output goes to the store's log, as maxit run's does
            compute_baselines(store, force=args.force, problems=args.eval_problems)
        for arm in arms:
            _run_arm(store, arm_store(store, arm), arm, *arm_settings(store, arm, args.single_problems))
            with console_to_log(store / LOG_FILE):
                compute_arm_baselines(store, arm, force=args.force, problems=args.eval_problems)
    blocks = ["\n".join(baselines_markdown(store, name)) for store, name in zip(stores, args.store)]
    if len(stores) > 1:
        blocks.append("\n".join(verdict_across(stores, args.store)))
    print("\n\n".join(blocks))
    return 0


def _run_single(store, sibling, settings, team_rows: dict[int, int]) -> None:
    """`_run_arm` of the trained single agent (kept for callers of the single agent alone)."""
    _run_arm(store, sibling, "single", settings, team_rows)


def _run_arm(store, sibling, arm: str, settings, team_rows: dict[int, int]) -> None:
    """Arm `arm` of `store`, run with `settings` into `sibling` as `maxit run` runs a store (its
    writer lock, experiment record, log and Dagster instance), round r trained on `team_rows[r]`
    rows; a line per round on the console."""
    from assets.config import RunSettings
    from assets.instance import dagster_home, instance_at
    from assets.console import console_to_log
    from assets.resources import close_engines
    from pipeline.engines import vllm_available
    from pipeline.run.experiment_record import LOG_FILE, record_experiment
    from pipeline.store import Tables
    from pipeline.store.lock import acquire, command_line, token_in_env

    from pipeline.run.arms import ARMS

    rounds = len(team_rows)
    name = ARMS[arm]
    layout = "shared policy" if settings.shared_policy else "a policy per agent"
    say(f"maxit baselines: {name}: workflow {' '.join((settings.workflow, *settings.workflow_options))} ({layout}), "
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
                    print(f"maxit baselines: {name}'s {line} (the team's round {r}: {rows} rows)", file=out, flush=True)
            finally:
                close_engines()


def _single_round(instance, tables, r: int, settings, engine: str, rows: int) -> int | None:
    """Round `r` of an arm, its training view cut to `rows` rows; the rows its
    view had (None: the round was complete and is kept)."""
    import pyarrow.parquet as pq

    from assets.jobs import materialize_round
    from assets.overlap import SAMPLE_STAGES
    from pipeline.run.arms import match_rows, match_seed
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
