"""The middles of a round's stages (pipeline/run/rounds.py) on fakes: frames and configs in, a frame
out, no store; and the stages' I/O around them (the table written, the seconds recorded)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from fakes import FakeSampler, FakeTask, FakeTokenizer
from pipeline.learn.advantages import compute_advantages
from pipeline.config import RunConfig
from pipeline.errors import ConfigError, DataError
from pipeline.run.context import RoundContext, run_strategies
from pipeline.run.problems import draw_problems, problems_from_table
from pipeline.run.rounds import (
    _stage,
    advantages_frame,
    evaluation_config,
    ratio_diagnostics_table,
    registry_metrics,
    rollout_config,
    sample_steps,
    stage_advantages,
    stage_rollouts,
    training_view,
)
from pipeline.run.timings import OLD_STAGE_LABELS, STAGES, TIMING_ROWS, read_timings, record_other, record_timings, seconds_column
from pipeline.store import Tables, table_path
from pipeline.learn.loss_diagnostics import LossDiagnostics, RatioStats
from pipeline.learn.views import build_training_view
from pipeline.workflows.math import MathWorkflow, SingleWorkflow
from schemas import PROBLEMS, RATIO_DIAGNOSTICS, STEPS, validate
from tiny import advantage_row, advantages_table, tiny_tokenizer

CONFIG = RunConfig(problems=4, samples=2, strategies=("iid", "prompt_aug"))


def a_round(config: RunConfig = CONFIG):
    """One round's middles chained on the fakes: problems, steps, advantages."""
    workflow = MathWorkflow(FakeTask())
    problems = draw_problems(workflow, config.problems, seed=7, round_=0)
    strategies = run_strategies(config, workflow)
    steps = sample_steps(problems, workflow, strategies.values(), FakeSampler(), rollout_config(config, workflow, 0, seed=11))
    return workflow, strategies, problems, steps, advantages_frame(steps, config.advantage)


def test_draw_problems_is_the_workflows_train_draw_as_a_problems_table():
    workflow = MathWorkflow(FakeTask())
    df = draw_problems(workflow, 5, seed=3, round_=2)
    validate(df.to_arrow(), PROBLEMS)
    assert df["round"].to_list() == [2] * 5
    assert problems_from_table(df) == workflow.problems("train", 5, 3)
    assert_frame_equal(draw_problems(workflow, 5, seed=3, round_=2), df)


def test_rollout_config_takes_the_runs_mix_and_temperature_and_the_agents_budgets():
    workflow = MathWorkflow(FakeTask())
    # a policy-gradient loss on every row: the rs loss and its view refuse a mixed reward when
    # the config is built
    ppo = dataclasses.replace(CONFIG.train.loss, kind="ppo")
    mixed = dataclasses.replace(
        CONFIG,
        view=dataclasses.replace(CONFIG.view, reward_is_local=False),
        temperature=0.7,
        train=dataclasses.replace(CONFIG.train, temperature=0.7, loss=ppo),
        advantage=dataclasses.replace(CONFIG.advantage, alpha=0.5, local_weight=2.0),
    )
    rc = rollout_config(mixed, workflow, 3, seed=9)
    assert (rc.round, rc.seed, rc.temperature, rc.alpha, rc.local_weight) == (3, 9, 0.7, 0.5, 2.0)
    budget = workflow.max_tokens(workflow.turn_order[0])  # the task's own (16 for a task without one)
    assert rc.max_tokens == budget and rc.max_tokens_by_agent == {a: budget for a in workflow.turn_order}
    given = rollout_config(dataclasses.replace(CONFIG, max_tokens=9), workflow, 0, seed=0)
    assert given.max_tokens == 9 and dict(given.max_tokens_by_agent) == {}


def test_sample_steps_and_advantages_frame_are_the_engines_and_the_advantage_engines():
    workflow, strategies, problems, steps, adv = a_round()
    validate(steps, STEPS)
    assert set(steps.column("uid").to_pylist()) == set(problems["uid"])
    assert set(steps.column("strategy").to_pylist()) == {"iid", "prompt_aug"}
    assert adv.height == steps.num_rows > 0
    assert_frame_equal(adv, compute_advantages(pl.from_arrow(steps), CONFIG.advantage))
    assert_frame_equal(advantages_frame(pl.from_arrow(steps), CONFIG.advantage), adv)  # Polars in, the same


def test_training_view_is_the_views_rows_of_the_advantages():
    workflow, strategies, _problems, _steps, adv = a_round()
    tok = FakeTokenizer()
    view, stats = training_view(adv.to_arrow(), strategies, tok, CONFIG, workflow, 0)
    want, want_stats = build_training_view(adv.to_arrow(), strategies, tok, CONFIG.view)
    assert view.num_rows == stats.n_rows > 0 and view.equals(want) and stats == want_stats


def test_training_view_of_the_ground_truth_baseline_is_as_many_reference_rows():
    workflow = MathWorkflow(FakeTask())
    problems = draw_problems(workflow, 4, seed=1, round_=0)
    rows = [advantage_row(f"s{i}", uid=problems["uid"][i % 4], local_reward=1.0, reward=1.0) for i in range(6)]
    config = dataclasses.replace(CONFIG, train_on="ground_truth")
    view, stats = training_view(advantages_table(rows), run_strategies(config, workflow), tiny_tokenizer(), config, workflow, 0, problems=problems)
    assert view.num_rows == stats.n_rows == 6
    assert set(view.column("strategy").to_pylist()) == {"ground_truth"}


def test_training_view_refuses_a_replay_without_a_checking_agent():
    workflow = SingleWorkflow(FakeTask())
    assert workflow.verifier_id is None
    config = dataclasses.replace(CONFIG, view=dataclasses.replace(CONFIG.view, verifier_replay=2))
    with pytest.raises(ConfigError, match="--verifier-replay trains a checking agent's verdicts; workflow 'math' has none"):
        training_view(advantages_table([advantage_row("s0", local_reward=1.0)]), run_strategies(CONFIG, workflow), FakeTokenizer(), config, workflow, 0)


def test_registry_metrics_leave_out_a_missing_loss():
    assert registry_metrics(SimpleNamespace(steps=2, n_rows=8, mean_loss=math.nan, tokens_per_second=10.0)) == {"steps": 2, "rows": 8, "tokens_per_second": 10.0}
    assert registry_metrics(SimpleNamespace(steps=2, n_rows=8, mean_loss=0.5, tokens_per_second=10.0))["mean_loss"] == 0.5


def test_ratio_diagnostics_table_has_a_row_per_cell_and_the_stars():
    cell = RatioStats(n_rows=2, n_tokens=6, sum_log_ratio=-0.6)
    whole = LossDiagnostics(overall=cell, by_agent={"solver": cell}, by_strategy={"iid": cell}, by_agent_strategy={"solver/iid": cell, "verifier/iid": RatioStats()})
    df = ratio_diagnostics_table({"shared": SimpleNamespace(diagnostics=whole, first_step_diagnostics=None)}, 1)
    validate(df.to_arrow(), RATIO_DIAGNOSTICS)
    assert df.select("agent_id", "strategy").rows() == [("*", "*"), ("solver", "*"), ("*", "iid"), ("solver", "iid")]  # an empty cell has no row
    assert df["mean_log_ratio"].to_list() == pytest.approx([-0.1] * 4) and df["first_step_log_ratio"].is_null().all()
    assert df["round"].to_list() == [1] * 4


def test_evaluation_config_is_the_runs_at_the_sampling_temperature():
    config = dataclasses.replace(CONFIG, temperature=0.6, train=dataclasses.replace(CONFIG.train, temperature=0.6))
    assert evaluation_config(config) == dataclasses.replace(config.evaluation, temperature=0.6)


def test_one_name_per_stage_everywhere_and_old_timings_labels_are_read_as_the_names(tmp_path):
    """A stage's name is its asset's, its function's, its timings row's and (with s_) its round
    table column's; a store written before (timings rows "view", "training") reads as the names."""
    import assets.definitions
    import pipeline.run.rounds as rounds

    assert STAGES == ("problems", "rollouts", "advantages", "training_view", "policy", "evaluation")
    assert [a.key.path[-1] for a in assets.definitions.ROUND_ASSETS] == list(STAGES)
    assert all(callable(getattr(rounds, f"stage_{s}")) for s in STAGES)
    assert TIMING_ROWS == (*STAGES, "other", "sandbox", "engine_start", "engine_swap")
    assert seconds_column("training_view") == "s_training_view"
    tables = Tables(tmp_path)
    record_timings(tables, 0, {"policy": 3.0, "training_view": 1.0})
    record_timings(tables, 0, {"training_view": 2.0}, added={"sandbox": 0.5})
    record_timings(tables, 0, added={"sandbox": 0.25, "engine_swap": 0.0})  # a zero adds no row
    t = pl.read_parquet(table_path(tmp_path, 0, "timings"))
    assert t.select("stage", "seconds").rows() == [("training_view", 2.0), ("policy", 3.0), ("sandbox", 0.75)]
    with pytest.raises(ConfigError, match="stage must be one of"):
        record_timings(tables, 0, {"view": 1.0})  # the old label is not written any more
    with pytest.raises(ConfigError, match="finite and >= 0"):
        record_timings(tables, 0, {"policy": float("nan")})
    old = pl.DataFrame({"round": [1, 1], "stage": ["view", "training"], "seconds": [4.0, 5.0]}, schema={"round": pl.Int32, "stage": pl.String, "seconds": pl.Float64})
    tables.path(1, "timings").parent.mkdir()
    old.write_parquet(tables.path(1, "timings"))
    assert read_timings(tables, 1).select("stage", "seconds").rows() == [("training_view", 4.0), ("policy", 5.0)]
    assert set(OLD_STAGE_LABELS.values()) <= set(STAGES)


def test_a_stage_writes_its_table_and_records_its_seconds(tmp_path):
    _workflow, _strategies, _problems, steps, adv = a_round()
    ctx = RoundContext(tmp_path, CONFIG)
    out = stage_advantages(ctx, 0, steps)
    assert_frame_equal(out, adv)
    assert_frame_equal(pl.read_parquet(table_path(tmp_path, 0, "advantages")), adv)
    timings = pl.read_parquet(table_path(tmp_path, 0, "timings"))
    assert timings["stage"].to_list() == ["advantages"] and timings["seconds"][0] >= 0


def test_the_seconds_a_workflow_waits_on_its_sandbox_are_a_row_inside_the_stages(tmp_path):
    """A workflow's `sandbox_seconds` (and the engine pool's start seconds) grown during two
    stages add up in the round's "sandbox" (and "engine_start") row; `maxit run`'s "other" time
    does not count them beside the stages they are part of."""
    ctx = RoundContext(tmp_path, CONFIG)
    ctx._workflow = SimpleNamespace(sandbox_seconds=0.0)

    def waits(seconds, start=0.0):
        def compute():
            ctx._workflow.sandbox_seconds += seconds
            ctx.engines.start_seconds += start
            return None
        return compute

    _stage(ctx, 0, "rollouts", waits(2.0, start=1.5))
    _stage(ctx, 0, "evaluation", waits(0.5, start=1.0))
    _stage(ctx, 0, "advantages", waits(0.0))
    t = dict(pl.read_parquet(table_path(tmp_path, 0, "timings")).select("stage", "seconds").rows())
    assert set(t) == {"rollouts", "evaluation", "advantages", "sandbox", "engine_start"}
    assert t["sandbox"] == pytest.approx(2.5) and t["engine_start"] == pytest.approx(2.5)
    record_other(ctx.tables, 0, wall_seconds=10.0, started=0.0)
    other = dict(pl.read_parquet(table_path(tmp_path, 0, "timings")).select("stage", "seconds").rows())["other"]
    assert other == pytest.approx(10.0 - t["rollouts"] - t["evaluation"] - t["advantages"])


def test_the_rollouts_sample_with_the_checkpoints_their_driver_passes(tmp_path):
    """A driver that lets round r's rollouts start before round r-1's training has finished passes
    an older checkpoint: the stage samples with exactly what it is given, and writes the round's
    table once, through the table owner."""
    from pipeline.engines.pool import EnginePool

    asked = []

    class Pool(EnginePool):
        def get(self, policy_id, path, **options):
            asked.append((policy_id, Path(path)))
            return FakeSampler()

    ctx = RoundContext(tmp_path, CONFIG, Pool("hf"))
    ctx._workflow = MathWorkflow(FakeTask())
    older = tmp_path / "checkpoints" / "round=0" / "shared"
    problems = draw_problems(ctx.workflow(), CONFIG.problems, seed=1, round_=2)
    steps = stage_rollouts(ctx, 2, problems, {"shared": older})
    assert asked == [("shared", older)]
    assert_frame_equal(pl.read_parquet(table_path(tmp_path, 2, "steps")), pl.from_arrow(steps))
    assert dict(pl.read_parquet(table_path(tmp_path, 2, "timings")).select("stage", "seconds").rows()).keys() == {"rollouts"}
    with pytest.raises(DataError, match="round 3: holds rows of round"):
        ctx.tables.write(3, "steps", steps)  # the table owner: a round's table holds that round's rows


def test_the_role_baseline_carries_over_rounds_through_the_store(tmp_path):
    """With baseline="role", round r's advantages stage reads the earlier rounds' advantages from
    the store, so the running mean per role is the one a single table of every round gives."""
    from dataclasses import replace

    from pipeline.config import AdvantageConfig

    config = replace(CONFIG, advantage=AdvantageConfig(baseline="role", role_decay=0.5))
    _workflow, _strategies, _problems, steps, _adv = a_round()
    steps = pl.from_arrow(steps) if not isinstance(steps, pl.DataFrame) else steps
    second = steps.with_columns(pl.lit(1, pl.Int32).alias("round"), (pl.col("step_id") + "-r1").alias("step_id"),
                                (1.0 - pl.col("local_reward")).alias("local_reward"))
    ctx = RoundContext(tmp_path, config)
    stage_advantages(ctx, 0, steps)
    out = stage_advantages(ctx, 1, second)
    both = compute_advantages(pl.concat([steps, second]), config.advantage)
    assert out["advantage"].to_list() == both.filter(pl.col("round") == 1)["advantage"].to_list()
    with pytest.raises(ConfigError, match="earlier rounds"):  # without round 0 in the store: refused
        stage_advantages(RoundContext(tmp_path / "empty", config), 1, second)


def test_the_default_mix_drops_what_a_workflow_cannot_play_and_a_chosen_mix_is_refused():
    from pipeline.config import DEFAULT_MIX
    from pipeline.errors import ConfigError

    class NoTree(SingleWorkflow):
        supports_tree = False
        supports_feedback = False

    workflow = NoTree(FakeTask())
    default = run_strategies(RunConfig(strategies=DEFAULT_MIX), workflow)
    assert set(default) == set(DEFAULT_MIX) - {"tree", "feedback"}
    with pytest.raises(ConfigError, match="tree"):
        run_strategies(RunConfig(strategies=("iid", "tree")), workflow)
    assert "tree" in run_strategies(RunConfig(strategies=DEFAULT_MIX), SingleWorkflow(FakeTask()))
