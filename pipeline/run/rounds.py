"""One expert-iteration round, stage by stage, as plain functions (Dagster's assets call these).

    problems(r) -> rollouts(r) -> advantages(r) -> training_view(r) -> policy(r) -> evaluation(r)

Each stage is two parts. Its middle is a function of frames and configs to a frame, with no
store and no clock: `draw_problems`, `sample_steps` (with `rollout_config`), `advantages_frame`,
`training_view`, the workflow's evaluation (with `evaluation_config`); the policy stage's middle,
the training runs, writes checkpoints and is the exception (`ratio_diagnostics_table` and
`registry_metrics` are its pure parts). Its `stage_*` function reads what the middle needs and, in
one place (`_stage`), writes the result to `<store>/round=<r>/<table>.parquet` atomically and
records the seconds in the round's `timings`; it returns the result. The stages are named as
their Dagster assets (`STAGES`); the `timings` table keeps two older labels (`TIMING_LABELS`).

Round r samples with the checkpoints that the policy registry holds for the latest round before
r (the base model for round 0), trains them, registers round r's checkpoints, and evaluates them.
A round is complete when its `evaluation` table exists: it is written last, atomically, after
the checkpoints are registered, so a run killed at any point resumes by re-running the first
incomplete round from scratch (its tables are replaced, never appended to: no lost or duplicated
rows).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import polars as pl
import pyarrow as pa

from pipeline import store as st
from pipeline.learn.advantages import compute_advantages
from pipeline.learn.baselines import ground_truth_view
from pipeline.config import RunConfig
from pipeline.engines.pool import EnginePool
from pipeline.errors import ConfigError, DataError
from pipeline.models import load_tokenizer
from pipeline.store.registry import PolicyRegistry
from pipeline.rollout.loop import RolloutConfig, run_rollouts, write_steps
from pipeline.strategies import make_strategy
from pipeline.tasks import build_task
from pipeline.types import Problem, Sampler
from pipeline.learn.views import build_training_view, verifier_replay, with_verifier_replay
from pipeline.workflows import check_workflow, load_workflow
from schemas import EVALUATION, PROBLEMS, RATIO_DIAGNOSTICS, TIMINGS, polars_schema

__all__ = [
    "RunConfig",
    "RoundContext",
    "EnginePool",
    "STAGES",
    "TIMING_LABELS",
    "STAGE_NAMES",
    "BASE_ROUND",
    "draw_problems",
    "rollout_config",
    "sample_steps",
    "advantages_frame",
    "training_view",
    "registry_metrics",
    "ratio_diagnostics_table",
    "evaluation_config",
    "problems_table",
    "problems_from_table",
    "stage_problems",
    "stage_rollouts",
    "stage_advantages",
    "stage_training_view",
    "stage_policy",
    "stage_evaluation",
    "evaluate_base",
    "run_round_stages",
    "round_complete",
    "record_timing",
    "build_workflow",
    "run_strategies",
]

BASE_ROUND = -1

log = logging.getLogger(__name__)


def build_workflow(config: RunConfig):
    """The workflow of a run config: its name and options, its agents on one shared policy or
    each on its own; the math workflows get the config's task and loop count."""
    settings = dict(config.workflow_options)
    if config.workflow in ("math", "single"):
        settings.setdefault("task", build_task(config.task, config.task_file, config.prompt_file))
    else:
        settings.setdefault("task_file", config.task_file)
    settings.setdefault("max_loop_num", config.max_loop_num)
    return load_workflow(config.workflow, shared_policy=config.shared_policy, **settings)


DEFAULT_MIX = ("iid", "prompt_aug", "feedback", "tree")
"""The default algorithm's strategy mix (`ALGORITHM_PRESETS["maxit"]`)."""


def run_strategies(config: RunConfig, workflow) -> dict:
    """strategy id -> the strategy a run samples and trains with: the config's strategies and
    options, the feedback strategy aimed at the workflow's `feedback_agent`. With the default mix,
    a workflow without feedback runs the other strategies; an explicit feedback strategy on it is
    refused (`check_workflow`, naming the workflow)."""
    options = dict(config.strategy_options)
    chosen = config.strategies
    if "feedback" in chosen:
        if not workflow.supports_feedback and chosen == DEFAULT_MIX:
            chosen = tuple(s for s in chosen if s != "feedback")
        else:
            options["feedback"] = {**options.get("feedback", {}), "agent_id": workflow.feedback_agent}
    out = {s: make_strategy(s, group_size=config.samples, **options.get(s, {})) for s in chosen}
    check_workflow(workflow, list(out.values()))
    return out


@dataclass
class RoundContext:
    """What the stages of a run share: the store, the run config, the registry, the engines."""

    store: Path
    config: RunConfig
    engines: EnginePool | None = None
    registry: PolicyRegistry | None = None
    """Where round r finds round r-1's checkpoints (default: the store's own registry)."""

    def __post_init__(self) -> None:
        self.store = Path(self.store)
        if self.engines is None:
            dtype = getattr(self.config.train, "dtype", "auto")  # an explicit --dtype reaches the engines too
            self.engines = EnginePool(self.config.engine, {"dtype": dtype} if dtype != "auto" else None)
        if self.registry is None:
            self.registry = PolicyRegistry(self.store)

    # -- the team ---------------------------------------------------------------------------
    def task(self):
        """The task of the math workflows (arithmetic, or the task file), or None for a workflow
        that draws its own problems."""
        return getattr(self.workflow(), "task", None)

    def workflow(self):
        """The run's workflow (`pipeline.workflows.load_workflow`), built once per context."""
        wf = getattr(self, "_workflow", None)
        if wf is None:
            wf = self._workflow = build_workflow(self.config)
        return wf

    def agents(self):
        return self.workflow().agents

    @property
    def policy_ids(self) -> tuple[str, ...]:
        return self.workflow().policy_ids

    def strategy_objects(self) -> dict:
        return run_strategies(self.config, self.workflow())

    def base_model(self) -> Path:
        if self.config.model_dir:
            path = Path(self.config.model_dir)
            if not (path / "config.json").is_file():
                raise ConfigError(f"model_dir {path} is not a local HF model directory (no config.json)")
            return path
        path = self.workflow().default_model()
        if path is None:
            raise ConfigError(f"workflow {self.config.workflow!r} has no embedded model: give a starting checkpoint with --model-dir")
        return Path(path)

    def start_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the checkpoint round `round_` samples with and trains from: the latest
        registered before it (registering the base model as round -1 on first use)."""
        reg = self.registry
        out = {}
        for pid in self.policy_ids:
            path = reg.latest(pid, round_)
            if path is None:
                reg.base(pid, self.base_model())
                path = reg.latest(pid, round_)
            out[pid] = path
        return out

    def trained_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the checkpoint trained in `round_` (-1: the base model)."""
        if round_ == BASE_ROUND:
            return self.start_checkpoints(0)
        out = {}
        for pid in self.policy_ids:
            rec = self.registry.get(round_, pid)
            if rec is None:
                raise DataError(f"round {round_} has no registered checkpoint for policy {pid!r}; materialize its policy first")
            out[pid] = Path(rec.path)
        return out

    def samplers(self, checkpoints: Mapping[str, Path]) -> dict[str, Sampler]:
        """policy_id -> its engine, pointed at its checkpoint. A run that trains LoRA adapters
        asks for engines that serve them (one engine on the base for every policy's adapter)."""
        lora = getattr(self.config.train, "lora", None)
        options = {"lora_rank": int(lora.r)} if lora is not None else {}
        return {pid: self.engines.get(pid, path, **options) for pid, path in checkpoints.items()}

    def round_seed(self, round_: int, salt: int = 0) -> int:
        return (self.config.seed * 1_000_003 + (round_ + 2) * 7919 + salt) % (2**31 - 1)


# -- stage names and timings ------------------------------------------------------------------

STAGES = ("problems", "rollouts", "advantages", "training_view", "policy", "evaluation")
"""The stages of a round in order, by the names of their Dagster assets (and of
`run_round_stages`'s results)."""

TIMING_LABELS = {"training_view": "view", "policy": "training"}
"""The `timings` table's labels of two stages, older than the stages' names and kept as aliases:
stored tables use them, and so do their readers (the round table's s_view and s_train columns,
the trackers' time/<stage> scalars)."""

SUBSTAGES = ("sandbox", "engine_start", "engine_swap")
"""Rows of a round's `timings` table that are parts of other stages' time, not added to it:
"sandbox", the seconds the round waited on model-written programs (a workflow's `sandbox_seconds`:
the code workflow's tests, in its rollouts and evaluation); "engine_start", building engines, and
"engine_swap", pointing live engines at new checkpoints (`EnginePool`), in rollouts and evaluation."""

STAGE_NAMES = (*(TIMING_LABELS.get(s, s) for s in STAGES), "other", *SUBSTAGES)
"""The rows of a round's `timings` table, in round order ("other": the round's wall time the
stages do not account for, recorded by whoever runs the whole round, e.g. `maxit run`)."""


def record_timing(store: str | Path, round_: int, stage: str, seconds: float, *, add: bool = False) -> None:
    """Set `stage`'s seconds (a stage of `STAGES`, its `timings` label, "other" or a `SUBSTAGES`
    row) in `<store>/round=<r>/timings.parquet`, replacing an earlier value (a re-run round
    records its own times), or with `add` adding to it. The stages of a round run one after another."""
    stage = TIMING_LABELS.get(stage, stage)
    if stage not in STAGE_NAMES:
        raise ConfigError(f"record_timing: stage must be one of {STAGE_NAMES}, got {stage!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"record_timing: seconds of stage {stage!r} must be finite and >= 0, got {seconds!r}")
    path = st.table_path(store, round_, "timings")
    schema = polars_schema(TIMINGS)
    old = pl.read_parquet(path).select(*schema) if path.exists() else pl.DataFrame(schema=schema)
    row = pl.DataFrame({"round": [round_], "stage": [stage], "seconds": [float(seconds)]}, schema=schema)
    if add:  # a row several stages contribute to (`SUBSTAGES`)
        row = row.with_columns(pl.col("seconds") + old.filter(pl.col("stage") == stage)["seconds"].sum())
    table = pl.concat([old.filter(pl.col("stage") != stage), row])
    order = {name: i for i, name in enumerate(STAGE_NAMES)}
    table = table.sort(pl.col("stage").replace_strict(order, return_dtype=pl.Int32))
    st.write_table(table, path, TIMINGS)


def _stage(ctx: "RoundContext", round_: int, stage: str, compute, write=None):
    """A stage's I/O, in one place around its middle: `compute()`, then `write(result)` (its
    tables, atomically), then the seconds both took in the round's timings (and the seconds the
    workflow waited on its sandbox meanwhile, added to the round's "sandbox" row)."""
    before = substage_seconds(ctx)
    t0 = time.perf_counter()
    out = compute()
    if write is not None:
        write(out)
    record_timing(ctx.store, round_, stage, time.perf_counter() - t0)
    for name, seconds in substage_seconds(ctx).items():
        if seconds > before[name]:
            record_timing(ctx.store, round_, name, seconds - before[name], add=True)
    return out


def substage_seconds(ctx) -> dict[str, float]:
    """The running totals behind `SUBSTAGES`: the seconds the context's workflow (if built yet: a
    new one has waited 0) waited on its sandbox, and its engine pool's starts and swaps."""
    engines = getattr(ctx, "engines", None)
    return {
        "sandbox": float(getattr(getattr(ctx, "_workflow", None), "sandbox_seconds", 0.0) or 0.0),
        "engine_start": float(getattr(engines, "start_seconds", 0.0) or 0.0),
        "engine_swap": float(getattr(engines, "swap_seconds", 0.0) or 0.0),
    }


def _write(ctx: "RoundContext", round_: int, table: str, schema):
    """`write` of a stage whose result is (or starts with) the frame of `table`."""
    return lambda out: st.write_table(out[0] if isinstance(out, tuple) else out, st.table_path(ctx.store, round_, table), schema)


# -- the stages' middles: frames and configs in, a frame out; no store, no clock ----------------


def problems_table(problems: Sequence[Problem], round_: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "round": [round_] * len(problems),
            "uid": [p.uid for p in problems],
            "question": [p.question for p in problems],
            "answer": [p.answer for p in problems],
            "split": [p.split for p in problems],
            "hint": [p.hint for p in problems],
        },
        schema=polars_schema(PROBLEMS),
    )


def problems_from_table(df: pl.DataFrame) -> list[Problem]:
    return [Problem(uid=r["uid"], question=r["question"], answer=r["answer"], split=r["split"], hint=r["hint"]) for r in df.iter_rows(named=True)]


def draw_problems(workflow, n: int, seed: int, round_: int) -> pl.DataFrame:
    """Round r's training problems: `n` of the workflow's train split, drawn with `seed`."""
    return problems_table(workflow.problems("train", n, seed), round_)


def rollout_config(config: RunConfig, workflow, round_: int, seed: int) -> RolloutConfig:
    """How round r samples: the run's temperature and reward mix; the run's completion budget,
    else each agent's own (`workflow.max_tokens`), else `RolloutConfig`'s."""
    return RolloutConfig(
        round=round_,
        temperature=config.temperature,
        max_tokens=config.max_tokens or workflow.max_tokens(workflow.turn_order[0]) or RolloutConfig.max_tokens,
        max_tokens_by_agent={} if config.max_tokens else {a: b for a in workflow.turn_order if (b := workflow.max_tokens(a))},
        alpha=config.advantage.alpha,
        local_weight=config.advantage.local_weight,
        seed=seed,
    )


def sample_steps(problems: pl.DataFrame, workflow, strategies, samplers: Mapping[str, Sampler], config: RolloutConfig) -> pa.Table:
    """The `steps` table of the team on `problems` under every strategy, sampled by `samplers`."""
    return run_rollouts(problems_from_table(problems), workflow, list(strategies), samplers, config)


def advantages_frame(steps, config) -> pl.DataFrame:
    """The `advantages` table of a `steps` table (Arrow or Polars)."""
    return compute_advantages(steps if isinstance(steps, pl.DataFrame) else pl.from_arrow(steps), config)


def training_view(advantages, strategies, tokenizer, config: RunConfig, workflow, round_: int, *, earlier=(), problems: pl.DataFrame | None = None):
    """The `training_view` table and its `ViewStats`: the rows of `advantages` that `config.view`
    trains, context-swapped; with `verifier_replay`, the checking agent's rows replaced by its replay
    over this round and the `earlier` rounds' advantages tables (`pipeline.learn.views.verifier_replay`);
    with train_on="ground_truth", as many rows of the task's reference answers to `problems` (the
    step-matched baseline)."""
    view, stats = build_training_view(advantages, strategies, tokenizer, config.view)
    if config.view.verifier_replay and config.train_on == "rollouts":
        checker = getattr(workflow, "verifier_id", None)
        if checker is None:
            raise ConfigError(f"--verifier-replay trains a checking agent's verdicts; workflow {config.workflow!r} has none")
        tables = [advantages, *earlier]
        replay, n_relabeled = verifier_replay(tables, strategies, tokenizer, config.view)
        log.info("verifier replay: %d rows from %d round(s), %d relabelled", replay.num_rows, len(tables), n_relabeled)
        view = with_verifier_replay(view, replay, checker)
    if config.train_on == "ground_truth":
        task = getattr(workflow, "task", None)
        if task is None or not callable(getattr(task, "solver_messages", None)):
            raise ConfigError(f"train_on='ground_truth' trains on a task's reference answers; workflow {workflow.name!r} has no such task")
        first = next(a for a in workflow.agents if a.agent_id == workflow.turn_order[0])
        view = ground_truth_view(
            problems_from_table(problems), task, tokenizer, view.num_rows, round_,
            policy_id=first.policy_id, agent_id=first.agent_id, temperature=config.temperature,
        )
    return view, stats


def registry_metrics(result) -> dict[str, float]:
    """The training metrics a checkpoint is registered with; a policy without rows has no loss,
    which is left out to keep the registry's JSON strict."""
    values = {"steps": result.steps, "rows": result.n_rows, "mean_loss": result.mean_loss, "tokens_per_second": result.tokens_per_second}
    return {k: v for k, v in values.items() if math.isfinite(v)}


def ratio_diagnostics_table(results: Mapping[str, object], round_: int) -> pl.DataFrame:
    """The importance-ratio diagnostics of a round's training runs, one row per policy and
    (agent, strategy) cell, plus each policy's per-agent, per-strategy and overall rows ("*")."""
    rows = []
    for pid, res in results.items():
        whole, first = res.diagnostics, getattr(res, "first_step_diagnostics", None)
        cells = [(("*", "*"), whole.overall, first.overall if first else None)]
        cells += [((a, "*"), st_, (first.by_agent.get(a) if first else None)) for a, st_ in sorted(whole.by_agent.items())]
        cells += [(("*", s), st_, (first.by_strategy.get(s) if first else None)) for s, st_ in sorted(whole.by_strategy.items())]
        by_cell = getattr(whole, "by_agent_strategy", {})
        first_cell = getattr(first, "by_agent_strategy", {}) if first else {}
        cells += [(tuple(k.split("/", 1)), st_, first_cell.get(k)) for k, st_ in sorted(by_cell.items())]
        for (agent, strategy), stats, first_stats in cells:
            if not stats.n_rows:
                continue
            rows.append(
                {
                    "round": round_, "policy_id": pid, "agent_id": agent, "strategy": strategy,
                    "rows": stats.n_rows, "tokens": stats.n_tokens,
                    "mean_log_ratio": stats.mean_log_ratio,
                    "first_step_log_ratio": first_stats.mean_log_ratio if first_stats is not None and first_stats.n_tokens else None,
                    "clip_fraction": stats.clip_fraction, "masked_fraction": stats.masked_fraction,
                    "truncated_fraction": stats.truncated_fraction, "ess_fraction": stats.ess_fraction, "kl": stats.mean_kl,
                }
            )
    return pl.DataFrame(rows, schema=polars_schema(RATIO_DIAGNOSTICS))


def evaluation_config(config: RunConfig):
    """What the held-out evaluation samples: the run's, at the sampling temperature (its budget:
    `eval_max_tokens`, else the workflow's)."""
    return replace(config.evaluation, temperature=config.temperature)


# -- the stages: the middles above with their reads and writes ---------------------------------


def stage_problems(ctx: RoundContext, round_: int) -> pl.DataFrame:
    """Draw round r's training problems (a fresh draw each round, from the train split only)."""
    return _stage(
        ctx, round_, "problems",
        lambda: draw_problems(ctx.workflow(), ctx.config.problems, ctx.round_seed(round_, 1), round_),
        _write(ctx, round_, "problems", PROBLEMS),
    )


def stage_rollouts(ctx: RoundContext, round_: int, problems: pl.DataFrame) -> pa.Table:
    """Sample the team on round r's problems under every strategy -> the `steps` table."""

    def compute():
        workflow = ctx.workflow()
        samplers = ctx.samplers(ctx.start_checkpoints(round_))
        config = rollout_config(ctx.config, workflow, round_, ctx.round_seed(round_, 2))
        return sample_steps(problems, workflow, ctx.strategy_objects().values(), samplers, config)

    return _stage(ctx, round_, "rollouts", compute, lambda table: write_steps(table, ctx.store, round_))


def stage_advantages(ctx: RoundContext, round_: int, steps) -> pl.DataFrame:
    """Round r's `advantages` table from its `steps` table."""
    return _stage(ctx, round_, "advantages", lambda: advantages_frame(steps, ctx.config.advantage), _write(ctx, round_, "advantages", "advantages"))


def stage_training_view(ctx: RoundContext, round_: int, advantages):
    """Round r's `training_view` table (and its `ViewStats`), rendered with the tokenizer of the
    checkpoints the round trains from."""
    c = ctx.config

    def compute():
        tokenizer = load_tokenizer(next(iter(ctx.start_checkpoints(round_).values())))
        earlier = []
        if c.view.verifier_replay and c.train_on == "rollouts":
            for r in range(round_ - 1, max(-1, round_ - c.view.verifier_replay), -1):
                path = st.table_path(ctx.store, r, "advantages")
                if path.exists():
                    earlier.append(st.read_table(path))
        problems = st.read_table(st.table_path(ctx.store, round_, "problems")) if c.train_on == "ground_truth" else None
        return training_view(advantages, ctx.strategy_objects(), tokenizer, c, ctx.workflow(), round_, earlier=earlier, problems=problems)

    return _stage(ctx, round_, "training_view", compute, _write(ctx, round_, "training_view", "training_view"))


def stage_policy(ctx: RoundContext, round_: int, view) -> dict:
    """Train each policy on its rows; checkpoints go to `<store>/checkpoints/round=<r>/<policy>`
    (atomically) and into the registry. The process's engines are closed first
    (`EnginePool.release`), except LoRA-serving engines on a GPU."""

    def compute():
        # torch and the transformers Trainer take seconds to import: only this stage needs them
        import torch

        from pipeline.learn.trainer import train_policy

        parents = ctx.start_checkpoints(round_)
        # Engines that the new checkpoints would rebuild anyway (full weights) are closed first, so
        # training does not hold a live engine's memory as well (SmolLM2-135M's vLLM engine: about
        # 2 GB). LoRA-serving engines stay on a GPU, where a new adapter is only a new request; on a
        # CPU the engine and the trainer share one RAM, so they are closed too and rebuilt after
        # training (SmolLM2-135M: about 20 s a round on the 2-core machine).
        released = ctx.engines.release(keep_lora=torch.cuda.is_available())
        if released:
            log.info("closed the engines of %s before training", released)
        results = {}
        for pid, parent in parents.items():
            res = train_policy(view, pid, parent, st.checkpoint_dir(ctx.store, round_, pid), ctx.config.train, round_=round_)
            ctx.registry.register(round_, pid, res.checkpoint, parent=parent, data_hash=res.data_hash, metrics=registry_metrics(res))
            results[pid] = res
        return results

    def write(results):
        st.write_table(ratio_diagnostics_table(results, round_), st.table_path(ctx.store, round_, "ratio_diagnostics"), RATIO_DIAGNOSTICS)

    return _stage(ctx, round_, "policy", compute, write)


def stage_evaluation(ctx: RoundContext, round_: int) -> pl.DataFrame:
    """Evaluate round r's checkpoints (round -1: the starting checkpoints) on the held-out split."""

    def compute():
        checkpoints = ctx.trained_checkpoints(round_)
        samplers = ctx.samplers(checkpoints)
        tokenizers = {pid: load_tokenizer(path) for pid, path in checkpoints.items()}
        return ctx.workflow().evaluate(samplers, tokenizers, evaluation_config(ctx.config), round_)

    return _stage(ctx, round_, "evaluation", compute, _write(ctx, round_, "evaluation", EVALUATION))


def evaluate_base(ctx: RoundContext) -> pl.DataFrame:
    """The baseline row set: the starting checkpoints evaluated as round -1 (once per store), taken
    from the cache when an earlier run computed the same rows (`pipeline.run.eval_cache`; off with
    `EvalConfig.reuse_base` False) and kept there when computed."""
    from pipeline.run import eval_cache

    path = st.table_path(ctx.store, BASE_ROUND, "evaluation")
    if path.exists():
        return pl.read_parquet(path)
    if not ctx.config.evaluation.reuse_base:
        return stage_evaluation(ctx, BASE_ROUND)
    engine_options = ctx.engines.options if ctx.engines is not None else {}
    key = eval_cache.base_evaluation_key(ctx.config, ctx.trained_checkpoints(BASE_ROUND), evaluation_config(ctx.config), engine_options)
    cached = eval_cache.load(key)
    if cached is not None:
        log.info("round -1: the starting checkpoints' evaluation reused from %s", eval_cache.cache_path(key))
        return _stage(ctx, BASE_ROUND, "evaluation", lambda: cached, _write(ctx, BASE_ROUND, "evaluation", EVALUATION))
    frame = stage_evaluation(ctx, BASE_ROUND)
    eval_cache.save(key, frame)
    return frame


def round_complete(store: str | Path, round_: int) -> bool:
    return st.table_path(store, round_, "evaluation").exists()


def run_round_stages(ctx: RoundContext, round_: int) -> dict:
    """All stages of one round in order, without Dagster (what a test or a notebook calls).
    Returns the tables and the seconds each stage took."""
    t: dict[str, float] = {}
    out: dict = {}

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        value = fn(*args)
        t[name] = time.perf_counter() - t0
        out[name] = value
        return value

    problems = timed("problems", stage_problems, ctx, round_)
    steps = timed("rollouts", stage_rollouts, ctx, round_, problems)
    adv = timed("advantages", stage_advantages, ctx, round_, steps)
    view, _stats = timed("training_view", stage_training_view, ctx, round_, adv)
    timed("policy", stage_policy, ctx, round_, view)
    timed("evaluation", stage_evaluation, ctx, round_)
    out["seconds"] = t
    return out
