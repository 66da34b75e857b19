"""A store's budget-matched baselines: the `baselines` table (round -1, computed once per store from
the run's starting checkpoints, `pipeline.rollout.baselines`) and the trained single agent, a run
of the team's single-agent variant at the team's training rows in a sibling store
(`<store>-single`), both read beside the team by `maxit report`.

The trained single agent's run (`trained_single_settings`) is the team's recorded settings with the
workflow replaced by its single agent (math: `single`; any other: `single_workflow`, which builds
the team and plays its `single_agent`) and the training problems per round scaled by the team's
calls per episode over the single agent's (`team_calls / single calls`, both in the `baselines`
table), so that it samples at least about as many rows as the team. What it trains is then matched
on rows: each round's training view is cut to the rows the team trained that round (`train_rows`:
the `rows` its policies were registered with, summed over them), a seeded subset of the view's
rows in their order (`match_rows`), so both train on the same number of rows per round. A round
whose view has fewer rows than the team's trains them all, and `maxit report` shows both counts
per round, so a shortfall is in plain view.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline import store as st
from pipeline.errors import ConfigError, DataError
from pipeline.run.experiments import EXPERIMENT_FILE, complete_rounds, is_store, read_experiment, stored_settings
from pipeline.store import BASE_ROUND

__all__ = ["compute_baselines", "read_baselines", "single_store", "trained_single_settings", "single_workflow", "team_of", "train_rows", "match_rows",
           "match_seed"]

TABLE = "baselines"


def single_store(store: str | Path) -> Path:
    """Where the trained single agent of `store` runs: the sibling folder `<store>-single`."""
    path = Path(store)
    return path.with_name(path.name + "-single")


def single_workflow(team: str = "math", **options):
    """The single agent of the workflow `team` built with `options` (`Workflow.single_agent`): a
    workflow `maxit run --workflow pipeline.run.baselines:single_workflow --workflow-options
    team=NAME ...` trains."""
    from pipeline.workflows import load_workflow

    workflow = load_workflow(team, **options)
    single = workflow.single_agent()
    if single is None:
        raise ConfigError(f"workflow {team!r} has no single agent (Workflow.single_agent is None)")
    return single


def _record(store: Path) -> dict:
    if not is_store(store):
        raise ConfigError(f"store {store}: not a store (no round folders, no {EXPERIMENT_FILE})")
    record = read_experiment(store)
    if record is None or "settings" not in record:
        raise DataError(f"store {store}: no {EXPERIMENT_FILE} with its settings: the team's workflow and model cannot be rebuilt")
    return record


def read_baselines(store: str | Path) -> pl.DataFrame | None:
    """The store's `baselines` tables (round -1's and any trained round's, in round order), or None
    when it has no round -1 table."""
    tables = st.Tables(store)
    if not tables.exists(BASE_ROUND, TABLE):
        return None
    return tables.scan(TABLE).collect().sort("round", maintain_order=True)


def team_of(store: Path):
    """The team's `RunConfig` and workflow, rebuilt from the store's record."""
    from pipeline.run.context import build_workflow

    config = stored_settings(_record(store)).run_config()
    return config, build_workflow(config)


def compute_baselines(store: str | Path, *, engines=None, force: bool = False) -> pl.DataFrame:
    """The store's `baselines` tables, computed where missing (all of them with `force`) and read
    back: round -1's (the untrained team and its single agent's baselines, from the starting
    checkpoints) and its last complete round's (the trained team played as the baselines are, with
    that round's checkpoints, when they are registered), on the held-out problems of its
    evaluation. A store without an evaluation, or whose team's calls per problem cannot be
    counted, is a one-line `DataError`."""
    from pipeline.rollout.baselines import team_calls
    from pipeline.run.context import RoundContext

    store = Path(store)
    config, _ = team_of(store)
    tables = st.Tables(store)
    if not tables.has_any("evaluation"):
        raise DataError(f"store {store}: no evaluation table (run `maxit run --store {store}` first): the team's budget is counted from it")
    ctx = RoundContext(tables, config, engines=engines)
    rounds = [r for r in (BASE_ROUND, *complete_rounds(store)[-1:]) if force or not tables.exists(r, TABLE)]
    rounds = [r for r in rounds if r == BASE_ROUND or all(ctx.registry.get(r, pid) is not None for pid in ctx.policy_ids)]
    if rounds:
        steps = tables.scan("steps").select("round", "strategy", "traj_uid").collect() if tables.has_any("steps") else None
        k, source = team_calls(tables.scan("evaluation").collect(), steps)
        try:
            for r in rounds:
                tables.write(r, TABLE, _played(ctx, r, k, source))
        finally:
            if engines is None:
                ctx.engines.close()
    return read_baselines(store)


def _played(ctx, round_: int, k: float, source: str) -> pl.DataFrame:
    """Round `round_`'s `baselines` rows: with round -1 the untrained team and its single agent's
    baselines, with a trained round the team alone, each with that round's checkpoints."""
    from pipeline.models.loading import load_tokenizer
    from pipeline.rollout.baselines import baseline_rows
    from pipeline.rollout.loop import RolloutConfig
    from pipeline.run.rounds import evaluation_config
    from schemas import BASELINES, polars_schema, validate

    team = ctx.workflow().scored_as_a_team()
    checkpoints = ctx.trained_checkpoints(round_)
    policy_of = {a.agent_id: a.policy_id for a in team.agents}
    samplers = ctx.samplers(checkpoints)
    tokenizers = {pid: load_tokenizer(path) for pid, path in checkpoints.items()}
    ev = evaluation_config(ctx.config)

    def budget(workflow) -> int:
        return ev.max_tokens or workflow.max_tokens(workflow.turn_order[0], "eval") or RolloutConfig.max_tokens

    rows = baseline_rows(
        team, team.single_agent(), team.problems("heldout", ev.problems, ev.seed),
        lambda agent: (samplers[policy_of[agent]], tokenizers[policy_of[agent]]),
        k=k, source=source, samples=ev.samples, temperature=ev.temperature, max_tokens=budget, seed=ev.seed, round_=round_, team_only=round_ != BASE_ROUND,
    )
    return validate(pl.DataFrame(rows, schema=polars_schema(BASELINES)), BASELINES)


def train_rows(store: str | Path) -> dict[int, int]:
    """round -> the rows the store's policies trained in that round: the `rows` each checkpoint was
    registered with (`registry_metrics`), summed over the round's policies; rounds without it are
    left out."""
    from pipeline.store.registry import PolicyRegistry

    out: dict[int, int] = {}
    for rec in PolicyRegistry(store).records():
        if "rows" in rec.metrics:
            out[rec.round] = out.get(rec.round, 0) + int(rec.metrics["rows"])
    return dict(sorted(out.items()))


def match_seed(seed: int, round_: int) -> int:
    """The seed of round `round_`'s row subset in a run of seed `seed`."""
    return (int(seed) * 1_000_003 + int(round_)) % (2**32)


def match_rows(view: pa.Table, rows: int, seed: int) -> pa.Table:
    """`view` cut to `rows` rows: a seeded subset (`seed`), drawn uniformly without replacement, in
    the view's order; the whole view when it has no more."""
    if rows < 0:
        raise ConfigError(f"match_rows: rows must be >= 0, got {rows}")
    if view.num_rows <= rows:
        return view
    keep = np.sort(np.random.default_rng(seed).choice(view.num_rows, size=rows, replace=False))
    return view.take(pa.array(keep, type=pa.int64()))


def trained_single_settings(store: str | Path, problems: int | None = None):
    """The settings of the trained single agent's run (see the module docstring) and the team's
    training rows of each round it completed (`train_rows`: round -> rows, rounds 0..n-1), the
    rows the single agent's rounds are cut to. Needs the store's `baselines` table (for the calls
    per episode) and the rows its checkpoints were registered with. `problems`: its training
    problems per round instead of the calls-scaled number (e.g. to sample as many rows as the
    team did; a round that then has fewer rows than the team's trains them all)."""
    store = Path(store)
    if problems is not None and (isinstance(problems, bool) or not isinstance(problems, int) or problems < 1):
        raise ConfigError(f"the trained single agent's problems per round must be a whole number >= 1, got {problems!r}")
    record = _record(store)
    settings = stored_settings(record)
    from pipeline.run.context import build_workflow

    team = build_workflow(settings.run_config())
    if team.scored_as_a_team() is not team:  # its rows carry one team reward per side
        raise ConfigError(
            f"store {store}: workflow {settings.workflow!r} gives each seat its own result (one team reward per side, e.g. "
            "team=outcome); the single agent plays every seat on one reward, so it has no trained single agent: train one "
            "from a store with the workflow's default team reward"
        )
    table = read_baselines(store)
    if table is None:
        raise DataError(f"store {store}: no baselines table: compute it first (maxit baselines --store {store})")
    single = table.filter((pl.col("round") == BASE_ROUND) & (pl.col("baseline") == "single") & (pl.col("metric") == "calls"))
    if single.is_empty() or single["value"][0] is None:
        raise DataError(f"store {store}: its workflow has no single agent, so there is no trained single agent to run")
    done, rows = complete_rounds(store), train_rows(store)
    missing = [r for r in done if r not in rows]
    if missing:
        raise DataError(f"store {store}: round(s) {missing} have no training rows in the policy registry: the single agent's rows cannot be matched")
    if problems is None:
        problems = max(1, round(settings.problems * float(single["team_calls"][0]) / float(single["value"][0])))
    if settings.workflow in ("math", "single"):
        changed = replace(settings, workflow="single", max_loop_num=None, problems=problems)
    else:
        options = tuple(o for o in settings.workflow_options if not o.startswith("team="))
        changed = replace(settings, workflow="pipeline.run.baselines:single_workflow", workflow_options=(f"team={settings.workflow}", *options), problems=problems)
    return changed, {r: rows[r] for r in done}
