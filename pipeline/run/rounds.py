"""One expert-iteration round, stage by stage, as plain functions (Dagster's assets call these).

    problems(r) -> rollouts(r) -> advantages(r) -> training_view(r) -> policy(r) -> evaluation(r)

Each stage is two parts. Its middle is a function of frames and configs to a frame, with no
store and no clock: `draw_problems` (`pipeline.run.problems`), `sample_steps` (with `rollout_config`), `advantages_frame`,
`training_view`, the workflow's evaluation (with `evaluation_config`); the policy stage's middle,
the training runs, writes checkpoints and is the exception (`ratio_diagnostics_table` and
`registry_metrics` are its pure parts). Its `stage_*` function reads what the middle needs and, in
one place (`_stage`), writes the result through the store's table owner (`RoundContext.tables`,
atomically and validated, once per round) and records its seconds in the round's `timings`
(`pipeline.run.timings`); it returns the result. A stage has one name: its asset's, its
function's, its timings row's and its round-table column's (`STAGES`).

Round r trains from the checkpoints the policy registry holds for the latest round before r (the
base model for round 0) and samples with the checkpoints its driver passes (`stage_rollouts`'s
`checkpoints`: the same ones unless a driver that overlaps rounds passes older ones), registers
round r's checkpoints, and evaluates them; which checkpoint is which is
`pipeline.run.checkpoints.RoundCheckpoints` (the context's `checkpoints`). A stage hands its
middle the parts of the context it needs (the config, the tables, the workflow, the checkpoints),
not the context. A round is
complete when its `evaluation` table exists: it is written last, atomically, after the
checkpoints are registered, so a run killed at any point resumes by re-running the first
incomplete round from scratch (its tables are replaced, never appended to: no lost or duplicated
rows).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

import polars as pl
import pyarrow as pa

from pipeline.config import RunConfig
from pipeline.config.scale import devices_env
from pipeline.errors import ConfigError
from pipeline.learn.advantages import compute_advantages
from pipeline.learn.ground_truth import ground_truth_view
from pipeline.learn.staleness import apply_version_threshold
from pipeline.learn.verifier_replay import verifier_replay, with_verifier_replay
from pipeline.learn.views import build_training_view
from pipeline.models import load_tokenizer
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.run.checkpoints import RoundCheckpoints
from pipeline.run.context import RoundContext
from pipeline.run.problems import REPLAY_STEP_COLUMNS, draw_problems, problems_from_table, replay_candidates
from pipeline.run.timings import STAGES, read_timings, record_timings
from pipeline.store import BASE_ROUND, Tables, checkpoint_dir
from pipeline.types import Sampler
from schemas import RATIO_DIAGNOSTICS, polars_schema

log = logging.getLogger(__name__)


# -- the stages' middles: frames and configs in, a frame out; no store, no clock ----------------


def rollout_config(config: RunConfig, workflow, round_: int, seed: int, policy_rounds=None, staleness=None) -> RolloutConfig:
    """How round r samples: the run's temperature and reward mix; the run's completion budget,
    else each agent's own (`workflow.max_tokens`), else `RolloutConfig`'s; the rounds of the
    checkpoints that sample each policy and their staleness (`RoundCheckpoints.staleness_plan`)."""
    return RolloutConfig(
        policy_rounds=dict(policy_rounds or {}),
        staleness=dict(staleness or {}),
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


def advantages_frame(steps, config, earlier: pl.DataFrame | None = None) -> pl.DataFrame:
    """The `advantages` table of a `steps` table (Arrow or Polars); `earlier`: the earlier rounds'
    rows the role baseline's running mean is made from (`baseline="role"`)."""
    return compute_advantages(steps if isinstance(steps, pl.DataFrame) else pl.from_arrow(steps), config, earlier=earlier)


ROLE_BASELINE_COLUMNS = ("round", "step_id", "uid", "strategy", "agent_id", "turn", "global_reward", "local_reward", "active")
"""The earlier rounds' `advantages` columns the role baseline reads."""


def training_view(advantages, strategies, tokenizer, config: RunConfig, workflow, round_: int, *, earlier=(), problems: pl.DataFrame | None = None,
                  trained: Mapping[str, int] | None = None):
    """The `training_view` table and its `ViewStats`: the rows of `advantages` that `config.view`
    trains, context-swapped; with `max_row_staleness`, the version threshold applied to them and to
    the `earlier` rounds' rows, counted from `trained` (policy_id -> the round of the checkpoint it
    trains from, as the rows' `staleness` is); with `verifier_replay`, the checking agent's rows replaced by its replay
    over this round and the `earlier` rounds' advantages tables (`pipeline.learn.verifier_replay.verifier_replay`);
    with train_on="ground_truth", as many rows of the task's reference answers to `problems` (the
    step-matched baseline)."""
    references = problems_from_table(problems) if config.train_on == "ground_truth" else None
    if config.max_row_staleness is not None:
        if trained is None:
            raise ConfigError("training_view: max_row_staleness counts from the rounds the policies train from; pass trained")
        advantages = apply_version_threshold(advantages, trained, config.max_row_staleness, config.stale_row_weight)
        earlier = [apply_version_threshold(e, trained, config.max_row_staleness, config.stale_row_weight) for e in earlier]
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
            references, task, tokenizer, view.num_rows, round_,
            policy_id=first.policy_id, agent_id=first.agent_id, temperature=config.temperature,
        )
    return view, stats


def registry_metrics(result) -> dict[str, float]:
    """The training metrics a checkpoint is registered with; a policy without rows has no loss,
    which is left out to keep the registry's JSON strict."""
    values = {"steps": result.steps, "rows": result.n_rows, "mean_loss": result.mean_loss, "tokens_per_second": result.tokens_per_second}
    return {k: v for k, v in values.items() if math.isfinite(v)}


def ratio_diagnostics_table(results: Mapping[str, object], round_: int, staleness: Mapping[str, int] | None = None) -> pl.DataFrame:
    """The importance-ratio diagnostics of a round's training runs, one row per policy and
    (agent, strategy) cell, plus each policy's per-agent, per-strategy and overall rows ("*"),
    each with the staleness of the policy's sampled rows (`staleness`: policy_id -> rounds)."""
    staleness = staleness or {}
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
                    "truncated_fraction": stats.truncated_fraction, "truncated_token_fraction": stats.truncated_token_fraction,
                    "ess_fraction": stats.ess_fraction, "kl": stats.mean_kl,
                    "staleness": staleness.get(pid),
                }
            )
    return pl.DataFrame(rows, schema=polars_schema(RATIO_DIAGNOSTICS))


def evaluation_config(config: RunConfig):
    """What the held-out evaluation samples: the run's, at the sampling temperature (its budget:
    `eval_max_tokens`, else the workflow's)."""
    return replace(config.evaluation, temperature=config.temperature)


# -- a stage's I/O, in one place ----------------------------------------------------------------


def _stage(ctx: RoundContext, round_: int, stage: str, compute, table: str | None = None):
    """A stage around its middle: `compute()`, then its result (or the result's first part) as
    round `round_`'s `table` (written once, atomically and validated, by the store's table
    owner), then the seconds both took in the round's timings, with the seconds spent meanwhile
    in the substages (sandbox, engine starts and swaps) in the same write."""
    before = ctx.substage_seconds()
    t0 = time.perf_counter()
    out = compute()
    if table is not None:
        ctx.tables.write(round_, table, out[0] if isinstance(out, tuple) else out)
    seconds = time.perf_counter() - t0
    after = ctx.substage_seconds()
    record_timings(ctx.tables, round_, {stage: seconds}, added={k: after[k] - before[k] for k in after})
    return out


# -- the stages: the middles above with their reads and writes ---------------------------------


def stage_problems(ctx: RoundContext, round_: int) -> pl.DataFrame:
    """Draw round r's training problems from the train split only: with `problem_replay`, that
    share of them drawn again from the earlier rounds' hardest (`replay_candidates`), the rest a
    fresh draw."""

    def compute():
        c, tables = ctx.config, ctx.tables
        k = round(c.problems * c.problem_replay)
        earlier = [r for r in range(round_) if tables.exists(r, "steps") and tables.exists(r, "problems")] if k else []
        replay = None
        if earlier:
            problems = pl.concat([tables.read(r, "problems") for r in earlier])
            steps = pl.concat([tables.read(r, "steps", columns=REPLAY_STEP_COLUMNS) for r in earlier])
            replay = replay_candidates(problems, steps, k)
        return draw_problems(ctx.workflow(), c.problems, ctx.round_seed(round_, 1), round_, replay)

    return _stage(ctx, round_, "problems", compute, "problems")


def sample_round(ctx: RoundContext, round_: int, problems: pl.DataFrame, checkpoints: Mapping[str, Path]) -> pa.Table:
    """The rollouts stage's middle with its engines: the team on `problems` (round r's, or a
    shard's share of them) under every strategy, sampled by engines pointed at `checkpoints`."""
    workflow, strategies = ctx.workflow(), ctx.strategy_objects()
    policy_rounds, staleness = ctx.checkpoints.staleness_plan(round_, checkpoints)
    config = rollout_config(ctx.config, workflow, round_, ctx.round_seed(round_, 2), policy_rounds, staleness)
    return sample_steps(problems, workflow, strategies.values(), ctx.samplers(checkpoints), config)


def stage_rollouts(ctx: RoundContext, round_: int, problems: pl.DataFrame, checkpoints: Mapping[str, Path] | None = None) -> pa.Table:
    """Sample the team on round r's problems under every strategy with `checkpoints` (policy_id ->
    checkpoint, as its driver passes them; None: the round's, `RoundCheckpoints.sample_checkpoints`:
    its start checkpoints, or round r-1-K's with `max_staleness` K) -> the `steps` table."""
    if checkpoints is None:
        checkpoints = ctx.checkpoints.sample_checkpoints(round_)
    return _stage(ctx, round_, "rollouts", lambda: sample_round(ctx, round_, problems, checkpoints), "steps")


def stage_advantages(ctx: RoundContext, round_: int, steps) -> pl.DataFrame:
    """Round r's `advantages` table from its `steps` table (with the role baseline, and the
    earlier rounds' rows its running mean is made from)."""

    def compute():
        earlier = None
        if ctx.config.advantage.baseline == "role":
            olds = [ctx.tables.read(r, "advantages", columns=ROLE_BASELINE_COLUMNS) for r in range(round_) if ctx.tables.exists(r, "advantages")]
            earlier = pl.concat(olds) if olds else None
        return advantages_frame(steps, ctx.config.advantage, earlier)

    return _stage(ctx, round_, "advantages", compute, "advantages")


def stage_training_view(ctx: RoundContext, round_: int, advantages):
    """Round r's `training_view` table (and its `ViewStats`), rendered with the tokenizer of the
    checkpoints the round trains from."""
    return _stage(ctx, round_, "training_view", lambda: round_view(
        ctx.config, ctx.tables, ctx.checkpoints, ctx.workflow(), ctx.strategy_objects(), round_, advantages), "training_view")


def round_view(config: RunConfig, tables: Tables, checkpoints: RoundCheckpoints, workflow, strategies, round_: int, advantages):
    """The training view stage's middle with its reads: round r's advantages (and with
    `verifier_replay` the earlier rounds' it replays) as `training_view` renders them, with the
    tokenizer of the checkpoints the round sampled with and, for the version threshold, the rounds
    of those it trains from."""
    # the checkpoints it sampled with are registered even when the ones it trains are not yet
    # (overlapped rounds); a run's checkpoints share one tokenizer
    sampled = checkpoints.sample_checkpoints(round_)
    trained = checkpoints.trained_rounds(round_) if config.max_row_staleness is not None else None
    earlier = []
    if config.view.verifier_replay and config.train_on == "rollouts":
        replayed = range(round_ - 1, max(-1, round_ - config.view.verifier_replay), -1)
        earlier = [tables.read(r, "advantages") for r in replayed if tables.exists(r, "advantages")]
    problems = tables.read(round_, "problems") if config.train_on == "ground_truth" else None
    tokenizer = load_tokenizer(next(iter(sampled.values())))
    return training_view(advantages, strategies, tokenizer, config, workflow, round_, earlier=earlier, problems=problems, trained=trained)


def stage_policy(ctx: RoundContext, round_: int, view) -> dict:
    """Train each policy on its rows; checkpoints go to `<store>/checkpoints/round=<r>/<policy>`
    (atomically) and into the registry; their importance-ratio diagnostics to the round's
    `ratio_diagnostics` table. The process's engines are closed first (`EnginePool.release`),
    except LoRA-serving engines on a GPU. With `ScaleConfig.train_processes` > 1 each policy
    trains in a process group of its own (torchrun, `train_in_subprocess`; FSDP2 with
    `ScaleConfig.fsdp`): this process waits for it, then registers what its rank 0 wrote."""
    import tempfile

    def compute(tmp: Path):
        # torch and the transformers Trainer take seconds to import: only this stage needs them
        import pyarrow.parquet as pq
        import torch

        from pipeline.learn.trainer import train_in_subprocess, train_policy
        from pipeline.learn.views import to_arrow

        scale, view_file = ctx.config.scale, tmp / "training_view.parquet"
        # overlapped rounds: the next round's rollouts sample meanwhile, with engines that are not
        # this stage's to close (the trainer lane is a process of its own: `assets.lane`)
        overlapped = ctx.config.max_staleness > 0
        parents = ctx.checkpoints.start_checkpoints(round_)
        # Engines that the new checkpoints would rebuild anyway (full weights: the default swap
        # builds a new engine) are closed first, so training does not hold a live engine's memory
        # as well; keeping them saves no time. LoRA-serving engines stay on a GPU, where a new
        # adapter is only a new request; on a CPU the engine and the trainer share one RAM, so they
        # are closed too and rebuilt after training. Measured: docs/results/engines.md.
        released = [] if overlapped else ctx.engines.release(keep_lora=torch.cuda.is_available())
        if released:
            log.info("closed the engines of %s before training", released)
        in_process = scale.train_processes == 1
        if not in_process:  # the trainer's processes read the view from a file
            pq.write_table(to_arrow(view), view_file)
        results = {}
        for pid, parent in parents.items():
            out = checkpoint_dir(ctx.store, round_, pid)
            train = ctx.config.train.for_round(round_)  # the round's learning rate (--lr-round-decay)
            if in_process:
                res = train_policy(view, pid, parent, out, train, round_=round_)
            else:  # torchrun's ranks on the trainer's devices (`--trainer-devices`), rank i on the i-th
                res = train_in_subprocess(
                    view_file, pid, parent, out, train, round_=round_, processes=scale.train_processes, fsdp=scale.fsdp,
                    env=devices_env(scale.trainer_devices),
                )
            ctx.registry.register(round_, pid, res.checkpoint, parent=parent, data_hash=res.data_hash, metrics=registry_metrics(res))
            results[pid] = res
        return ratio_diagnostics_table(results, round_, round_staleness(ctx.tables, round_)), results

    with tempfile.TemporaryDirectory(prefix="maxit-policy-") as tmp:
        _diagnostics, results = _stage(ctx, round_, "policy", lambda: compute(Path(tmp)), "ratio_diagnostics")
    return results


def round_staleness(tables: Tables, round_: int) -> dict[str, int]:
    """policy_id -> the staleness of round `round_`'s sampled rows (their largest), from its
    `steps` table; {} for a table without the column (written before it existed)."""
    if not tables.exists(round_, "steps") or "staleness" not in tables.columns(round_, "steps"):
        return {}
    df = tables.read(round_, "steps", columns=["policy_id", "staleness"]).group_by("policy_id").agg(pl.col("staleness").max())
    return {pid: int(v) for pid, v in df.iter_rows() if v is not None}


def stage_evaluation(ctx: RoundContext, round_: int) -> pl.DataFrame:
    """Evaluate round r's checkpoints (round -1: the starting checkpoints) on the held-out split."""

    def compute():
        checkpoints = ctx.checkpoints.trained_checkpoints(round_)
        samplers = ctx.samplers(checkpoints)
        tokenizers = {pid: load_tokenizer(path) for pid, path in checkpoints.items()}
        return ctx.workflow().evaluate(samplers, tokenizers, evaluation_config(ctx.config), round_)

    return _stage(ctx, round_, "evaluation", compute, "evaluation")


def evaluate_base(ctx: RoundContext) -> pl.DataFrame:
    """The baseline row set: the starting checkpoints evaluated as round -1 (once per store), taken
    from the cache when an earlier run computed the same rows (`pipeline.run.eval_cache`; off with
    `EvalConfig.reuse_base` False) and kept there when computed."""
    from pipeline.run import eval_cache

    if ctx.tables.exists(BASE_ROUND, "evaluation"):
        return ctx.tables.read(BASE_ROUND, "evaluation")
    if not ctx.config.evaluation.reuse_base:
        return stage_evaluation(ctx, BASE_ROUND)
    key = eval_cache.base_evaluation_key(ctx.config, ctx.checkpoints.trained_checkpoints(BASE_ROUND), evaluation_config(ctx.config), ctx.engines.options)
    cached = eval_cache.load(key)
    if cached is not None:
        log.info("round -1: the starting checkpoints' evaluation reused from %s", eval_cache.cache_path(key))
        return _stage(ctx, BASE_ROUND, "evaluation", lambda: cached, "evaluation")
    frame = stage_evaluation(ctx, BASE_ROUND)
    eval_cache.save(key, frame)
    return frame


def round_complete(tables: Tables, round_: int) -> bool:
    """Whether round `round_` is complete: its `evaluation` table, written last, exists."""
    return tables.exists(round_, "evaluation")


def run_round_stages(ctx: RoundContext, round_: int, checkpoints: Mapping[str, Path] | None = None) -> dict:
    """All stages of one round in order, without Dagster (what a test or a notebook calls),
    sampling with `checkpoints` (default: the round's start checkpoints). Returns each stage's
    result by its name, and under "seconds" what each stage took, as its `_stage` recorded it in
    the round's timings table (the one stopwatch)."""
    out: dict = {"problems": stage_problems(ctx, round_)}
    out["rollouts"] = stage_rollouts(ctx, round_, out["problems"], checkpoints)
    out["advantages"] = stage_advantages(ctx, round_, out["rollouts"])
    out["training_view"] = stage_training_view(ctx, round_, out["advantages"])
    out["policy"] = stage_policy(ctx, round_, out["training_view"][0])
    out["evaluation"] = stage_evaluation(ctx, round_)
    timings = read_timings(ctx.tables, round_)
    out["seconds"] = dict(timings.filter(pl.col("stage").is_in(STAGES)).select("stage", "seconds").rows())
    return out
