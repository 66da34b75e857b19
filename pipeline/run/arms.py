"""A store's budget-matched baselines and arms: the `baselines` table (round -1, computed once
per store from the run's starting checkpoints, `pipeline.rollout.budget_matched`, and the trained team
played the same way at its last complete round), and the trained arms, each a run at the team's
training rows in a sibling store `<store>-<arm>`, all read beside the team by `maxit report`.

The arms (`ARMS`), each trained with the team's recorded settings, as many rounds as it completed:
- `single` (`<store>-single`): the team's single agent (`Workflow.single_agent`: ONE agent doing
  the job; math: `single`; any other: `arm_workflow` with `arm=single`), its training problems per
  round scaled by the team's calls per episode over the single agent's (`team_calls / single
  calls`, both in the `baselines` table), so that it samples at least about as many rows as the
  team; played at one call and at the team's calls (vote, self-refine);
- `protocol` (`<store>-protocol`): the team's protocol played by one agent on one policy
  (`ProtocolWorkflow`, `arm_workflow` with `arm=protocol`): the same environment, tools, turns and
  calls, every seat one agent, so it isolates what the protocol does from what the team does;
- `separate` / `shared` (`<store>-separate`, `<store>-shared`): the team itself on the other policy
  layout (a policy per agent, or one shared by all), the team's problems per round;
- `wide` (`<store>-wide`): the single agent on an embedded model of about the parameters of the
  team with a policy per agent (the agents' count times the model's), where the workflow builds
  its model in code and says how to scale it (a `model_scale` option: grid); problems as `single`'s.

What an arm trains is matched on rows: each round's training view is cut to the rows the team
trained that round (`train_rows`: the `rows` its policies were registered with, summed over them),
a seeded subset of the view's rows in their order (`match_rows`), so both train on the same number
of rows per round. A round whose view has fewer rows than the team's trains them all, and `maxit
report` shows both counts per round, so a shortfall is in plain view. Each trained arm is then
played from its last round's checkpoints on the team's held-out problems, samples and seeds
(`compute_arm_baselines`, into the sibling's `baselines` table), so the team and every arm meet the
same problems with the same draws.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from pipeline import store as st
from pipeline.config.fields import check_count
from pipeline.errors import ConfigError, DataError
from pipeline.run.experiment_record import EXPERIMENT_FILE, complete_rounds, is_store, read_experiment, stored_settings
from pipeline.store import BASE_ROUND

__all__ = ["ARMS", "compute_baselines", "compute_arm_baselines", "read_baselines", "arm_store", "single_store", "arm_settings", "trained_single_settings",
           "arm_workflow", "single_workflow", "team_of", "train_rows", "match_rows", "match_seed"]

TABLE = "baselines"

ARMS: dict[str, str] = {
    "single": "the trained single agent",
    "protocol": "the team's protocol played by one trained agent",
    "separate": "the team, a trained policy per agent",
    "shared": "the team, one trained shared policy",
    "wide": "the trained single agent with the team's parameters",
}
"""The trained arms (`maxit baselines --arm NAME`), each run into `<store>-NAME`: what `maxit
report` calls them."""


def arm_store(store: str | Path, arm: str) -> Path:
    """Where arm `arm` of `store` runs: the sibling folder `<store>-<arm>`."""
    if arm not in ARMS:
        raise ConfigError(f"arm must be one of {list(ARMS)}, got {arm!r}")
    path = Path(store)
    return path.with_name(f"{path.name}-{arm}")


def single_store(store: str | Path) -> Path:
    """Where the trained single agent of `store` runs: the sibling folder `<store>-single`."""
    return arm_store(store, "single")


def arm_workflow(of: str = "math", arm: str = "single", **options):
    """Arm `arm` (single | protocol | wide) of the workflow `of` built with `options`: its single
    agent (`Workflow.single_agent`; wide: the same, its options holding the model's `model_scale`)
    or its protocol played by one agent (`ProtocolWorkflow`). What `maxit run
    --workflow pipeline.run.arms:arm_workflow --workflow-options of=NAME arm=ARM ...` trains.
    The math workflows take their task by name here (`task`, `task_file`, `prompt_file`), as
    `maxit run` builds it."""
    from pipeline.rollout.workflow import ProtocolWorkflow
    from pipeline.workflows import load_workflow

    if arm not in ("single", "protocol", "wide"):
        raise ConfigError(f"arm_workflow: arm must be single, protocol or wide, got {arm!r}")
    if of in ("math", "single"):
        from pipeline.tasks import build_task

        task = options.pop("task", "arithmetic")
        task_file, prompt_file = options.pop("task_file", None), options.pop("prompt_file", None)
        options["task"] = build_task(task, task_file, prompt_file) if isinstance(task, str) else task
    else:
        options.pop("prompt_file", None)
    team = load_workflow(of, **options)
    if arm == "protocol":
        return ProtocolWorkflow(team)
    single = team.single_agent()
    if single is None:
        raise ConfigError(f"workflow {of!r} has no single agent (Workflow.single_agent is None)")
    return single


def single_workflow(team: str = "math", **options):
    """The single agent of the workflow `team` built with `options` (`Workflow.single_agent`):
    what the trained single agents' stores recorded before `arm_workflow` name (a workflow option
    `team` cannot reach the workflow here: new stores record `arm_workflow`)."""
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
    """The store's `baselines` tables (round -1's and any trained round's, in round order; an arm's
    sibling store has its played round's alone), or None when it has none."""
    tables = st.Tables(store)
    if not tables.has_any(TABLE):
        return None
    return tables.scan(TABLE).collect().sort("round", maintain_order=True)


def team_of(store: Path):
    """The team's `RunConfig` and workflow, rebuilt from the store's record."""
    from pipeline.run.context import build_workflow

    config = stored_settings(_record(store)).run_config()
    return config, build_workflow(config)


def compute_baselines(store: str | Path, *, engines=None, force: bool = False, problems: int | None = None) -> pl.DataFrame:
    """The store's `baselines` tables, computed where missing (all of them with `force`) and read
    back: round -1's (the untrained team and its single agent's baselines, from the starting
    checkpoints) and its last complete round's (the trained team played as the baselines are, with
    that round's checkpoints, when they are registered), on the held-out problems of its
    evaluation (`problems`: that many held-out problems instead, the same samples, temperature and
    seed; a round's table played on another number is played again). A store without an
    evaluation, or whose team's calls per problem cannot be counted, is a one-line `DataError`."""
    from pipeline.rollout.budget_matched import team_calls
    from pipeline.run.context import RoundContext

    store = Path(store)
    config, _ = team_of(store)
    tables = st.Tables(store)
    if not tables.has_any("evaluation"):
        raise DataError(f"store {store}: no evaluation table (run `maxit run --store {store}` first): the team's budget is counted from it")
    ctx = RoundContext(tables, config, engines=engines)
    episodes = _episodes(config, problems)
    rounds = [r for r in (BASE_ROUND, *complete_rounds(store)[-1:]) if force or not _played_on(tables, r, episodes)]
    rounds = [r for r in rounds if r == BASE_ROUND or all(ctx.registry.get(r, pid) is not None for pid in ctx.policy_ids)]
    if rounds:
        steps = tables.scan("steps").select("round", "strategy", "traj_uid").collect() if tables.has_any("steps") else None
        k, source = team_calls(tables.scan("evaluation").collect(), steps)
        try:
            for r in rounds:
                tables.write(r, TABLE, _played(ctx, r, k, source, problems))
        finally:
            if engines is None:
                ctx.engines.close()
    return read_baselines(store)


def _episodes(config, problems: int | None) -> int | None:
    """The episodes a played row holds when `problems` held-out problems are asked for (None: the
    evaluation's, whatever a kept table was played on)."""
    from pipeline.run.rounds import evaluation_config

    if problems is None:
        return None
    check_count("--eval-problems", problems)
    return problems * evaluation_config(config).samples


def _played_on(tables, round_: int, episodes: int | None) -> bool:
    """Whether round `round_`'s `baselines` table is there, played on `episodes` episodes (None:
    on any number)."""
    if not tables.exists(round_, TABLE):
        return False
    if episodes is None:
        return True
    played = tables.read(round_, TABLE, columns=["n", "value"])
    return all(n == episodes for n, v in zip(played["n"].to_list(), played["value"].to_list()) if v is not None)


def _played(ctx, round_: int, k: float, source: str, problems: int | None = None) -> pl.DataFrame:
    """Round `round_`'s `baselines` rows: with round -1 the untrained team and its single agent's
    baselines, with a trained round the team alone, each with that round's checkpoints, on the
    evaluation's held-out problems (`problems`: that many instead)."""
    from pipeline.rollout.budget_matched import baseline_rows
    from pipeline.run.rounds import evaluation_config
    from schemas import BASELINES, polars_schema, validate

    team = ctx.workflow().scored_as_a_team()
    single = team.single_agent() if round_ == BASE_ROUND else None
    sampler_of = _sampler_of(ctx, round_, (team, *([single] if single is not None else [])))
    ev = evaluation_config(ctx.config)
    rows = baseline_rows(
        team, single, team.problems("heldout", problems or ev.problems, ev.seed), sampler_of,
        k=k, source=source, samples=ev.samples, temperature=ev.temperature, max_tokens=_budget(ev), seed=ev.seed, round_=round_, team_only=round_ != BASE_ROUND,
    )
    return validate(pl.DataFrame(rows, schema=polars_schema(BASELINES)), BASELINES)


def _budget(ev):
    """The completion budget of a workflow's baseline calls: the evaluation's, else its own."""
    from pipeline.rollout.sampling import RolloutConfig

    return lambda workflow: ev.max_tokens or workflow.max_tokens(workflow.turn_order[0], "eval") or RolloutConfig.max_tokens


def _sampler_of(ctx, round_: int, workflows):
    """agent_id -> (engine, tokenizer) of the agent's policy's checkpoint of `round_` in `ctx`,
    for the agents of `workflows` (a team and the variants played beside it)."""
    from pipeline.models.loading import load_tokenizer

    checkpoints = ctx.checkpoints.trained_checkpoints(round_)
    policy_of = {a.agent_id: a.policy_id for w in workflows for a in w.agents}
    samplers = ctx.samplers(checkpoints)
    tokenizers = {pid: load_tokenizer(path) for pid, path in checkpoints.items()}
    return lambda agent: (samplers[policy_of[agent]], tokenizers[policy_of[agent]])


def compute_arm_baselines(store: str | Path, arm: str, *, engines=None, force: bool = False, problems: int | None = None) -> pl.DataFrame | None:
    """Arm `arm` of `store` (trained in `<store>-<arm>`) played from its last complete round's
    checkpoints as the team's baselines are (`arm_rows`: the team's held-out problems, samples,
    temperature and seed, the team's calls per problem for a single agent's vote and self-refine),
    written once (afresh with `force`, or when it was played on another number than `problems`
    held-out problems) to the sibling's `baselines` table of that round and read back; None when
    the sibling has no complete round."""
    from pipeline.rollout.budget_matched import arm_rows
    from pipeline.run.context import RoundContext
    from pipeline.run.rounds import evaluation_config
    from schemas import BASELINES, polars_schema, validate

    store = Path(store)
    sibling = arm_store(store, arm)
    done = complete_rounds(sibling) if is_store(sibling) else []
    if not done:
        return None
    team_table = read_baselines(store)
    if team_table is None:
        raise DataError(f"store {store}: no baselines table: compute it first (maxit baselines --store {store})")
    r = done[-1]
    tables = st.Tables(sibling)
    team_config, _ = team_of(store)
    if force or not _played_on(tables, r, _episodes(team_config, problems)):
        ctx = RoundContext(tables, stored_settings(_record(sibling)).run_config(), engines=engines)
        try:
            workflow = ctx.workflow().scored_as_a_team()
            ev = evaluation_config(team_config)
            rows = arm_rows(
                workflow, arm, workflow.problems("heldout", problems or ev.problems, ev.seed), _sampler_of(ctx, r, (workflow,)),
                k=float(team_table["team_calls"][0]), source=str(team_table["calls_source"][0]), samples=ev.samples, temperature=ev.temperature,
                max_tokens=_budget(ev), seed=ev.seed, round_=r, at_calls=arm in ("single", "wide"),
            )
            tables.write(r, TABLE, validate(pl.DataFrame(rows, schema=polars_schema(BASELINES)), BASELINES))
        finally:
            if engines is None:
                ctx.engines.close()
    return read_baselines(sibling).filter(pl.col("round") == r)


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
    """`arm_settings(store, "single", problems)`: the trained single agent's run."""
    return arm_settings(store, "single", problems)


def arm_settings(store: str | Path, arm: str, problems: int | None = None):
    """The settings of arm `arm`'s run (see the module docstring) and the team's training rows of
    each round it completed (`train_rows`: round -> rows, rounds 0..n-1), the rows the arm's rounds
    are cut to. Needs the rows the team's checkpoints were registered with, and for the single
    agents the store's `baselines` table (for the calls per episode). `problems`: the arm's
    training problems per round instead of its default (the single agents': calls-scaled; the
    others': the team's), e.g. to sample as many rows as the team did; a round that then has
    fewer rows than the team's trains them all."""
    from pipeline.run.context import build_workflow, run_strategies

    store = Path(store)
    arm_store(store, arm)  # a bad arm is named first
    if problems is not None and (isinstance(problems, bool) or not isinstance(problems, int) or problems < 1):
        raise ConfigError(f"the {ARMS[arm]}'s problems per round must be a whole number >= 1, got {problems!r}")
    record = _record(store)
    settings = stored_settings(record)
    team = build_workflow(settings.run_config())
    one_agent = arm in ("single", "protocol", "wide")
    if one_agent and team.scored_as_a_team() is not team:  # its rows carry one team reward per side
        raise ConfigError(
            f"store {store}: workflow {settings.workflow!r} gives each seat its own result (one team reward per side, e.g. "
            f"team=outcome); one agent plays every seat on one reward, so it has no {ARMS[arm]}: train one "
            "from a store with the workflow's default team reward"
        )
    if arm == "separate" and not settings.shared_policy or arm == "shared" and settings.shared_policy:
        layout = "a policy per agent" if arm == "separate" else "one shared policy"
        raise ConfigError(f"store {store}: the team already trains {layout}: it is arm {arm!r} itself; its other layout is arm "
                          f"{'shared' if arm == 'separate' else 'separate'!r}")
    if arm in ("separate", "shared", "wide") and len(team.agents) < 2:
        raise ConfigError(f"store {store}: workflow {settings.workflow!r} has one agent: it has no other policy layout, nor more parameters, to train")
    if arm == "wide":
        if settings.model_dir is not None:
            raise ConfigError(f"store {store}: the team starts from --model {settings.model_dir}, not a model its workflow builds in code: it has no wide arm")
        if not hasattr(team, "model_scale") or any(o.startswith("model_scale=") for o in settings.workflow_options):
            raise ConfigError(f"store {store}: workflow {settings.workflow!r} does not scale its embedded model (no model_scale option, or one already "
                              "given): it has no wide arm")
    done, rows = complete_rounds(store), train_rows(store)
    if not done:
        raise DataError(f"store {store}: no completed round: the {ARMS[arm]} is trained at the team's rows of its rounds")
    missing = [r for r in done if r not in rows]
    if missing:
        raise DataError(f"store {store}: round(s) {missing} have no training rows in the policy registry: the {ARMS[arm]}'s rows cannot be matched")
    if arm in ("single", "wide") and problems is None:
        table = read_baselines(store)
        if table is None:
            raise DataError(f"store {store}: no baselines table: compute it first (maxit baselines --store {store})")
        single = table.filter((pl.col("round") == BASE_ROUND) & (pl.col("baseline") == "single") & (pl.col("metric") == "calls"))
        if single.is_empty() or single["value"][0] is None:
            raise DataError(f"store {store}: its workflow has no single agent, so there is no {ARMS[arm]} to run")
        problems = max(1, round(settings.problems * float(single["team_calls"][0]) / float(single["value"][0])))
    problems = problems if problems is not None else settings.problems
    if arm in ("separate", "shared"):
        changed = replace(settings, shared_policy=arm == "shared", problems=problems)
    elif arm == "single" and settings.workflow in ("math", "single"):
        changed = replace(settings, workflow="single", max_loop_num=None, problems=problems)
    else:
        options = [f"of={settings.workflow}", f"arm={arm}", *settings.workflow_options, *([f"model_scale={len(team.agents)}"] if arm == "wide" else [])]
        if settings.workflow in ("math", "single"):  # its task by name, as maxit run builds it (a task file is a setting of its own)
            options += [f"task={settings.task}"] + ([f"prompt_file={settings.prompt_file}"] if settings.prompt_file else [])
        changed = replace(settings, workflow="pipeline.run.arms:arm_workflow", workflow_options=tuple(options), problems=problems)
    config = changed.run_config()
    try:
        run_strategies(config, build_workflow(config))  # a strategy the arm cannot run is named before anything is written
    except ConfigError as err:
        raise ConfigError(f"store {store}: the {ARMS[arm]}: {err}") from None
    return changed, {r: rows[r] for r in done}
