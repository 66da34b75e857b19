"""`maxit baselines`: a store's budget-matched baselines (`pipeline.run.baselines`), computed once
into its `baselines` table and printed beside the team; with `--trained-single`, the run of the
team's single agent at the team's training samples into the sibling store `<store>-single`."""

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
        help="also run the team's single agent, with the team's settings and about its training rows per round, as many rounds "
        "as the team completed, into STORE-single (resumed like maxit run); maxit report shows it beside the team",
    )
    p.set_defaults(func=cmd_baselines)


def cmd_baselines(args) -> int:
    from pathlib import Path

    from assets.launch import console_to_log
    from pipeline.run.baselines import compute_baselines, single_store, team_of, trained_single_settings
    from pipeline.run.experiments import LOG_FILE
    from pipeline.run.report import baselines_markdown

    store = Path(args.store)
    team_of(store)  # a folder that is not a recorded store is named before anything is written
    with console_to_log(store / LOG_FILE):  # the engines' output goes to the store's log, as maxit run's does
        compute_baselines(store, force=args.force)
    if args.trained_single:
        _run_single(store, single_store(store), *trained_single_settings(store))
    print("\n".join(baselines_markdown(store, args.store)))
    return 0


def _run_single(store, sibling, settings, rounds: int) -> None:
    from assets.config import RunSettings
    from assets.launch import run_rounds

    say(f"maxit baselines: the trained single agent: workflow {' '.join((settings.workflow, *settings.workflow_options))}, "
        f"{settings.problems} problems per round, {rounds} round(s), into {sibling}")
    settings.run_config()  # every setting checked before anything starts
    run_rounds(rounds, str(sibling), RunSettings.from_settings(settings), engine=settings.engine, quiet_dagster=True)
