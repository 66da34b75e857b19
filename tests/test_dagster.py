"""Dagster wiring: definitions load, one round materializes in-process on the tiny model, the
sensor requests the next round, a failing blocking check stops the round."""

from __future__ import annotations

import dagster as dg
import polars as pl
import pytest

from assets.checks import all_checks
from assets.config import RunSettings
from assets.definitions import ROUND_ASSETS, defs, make_resources
from assets.partitions import rounds
from assets.resources import close_engines
from assets.sensors import make_next_round_sensor, next_round
from pipeline.run.timings import STAGES, SUBSTAGES
from pipeline.store import Tables, table_path
from pipeline.store.registry import PolicyRegistry
from schemas import validate


def small_settings(model_dir, **overrides) -> RunSettings:
    values = dict(
        model_dir=str(model_dir),
        problems=6,
        samples=2,
        eval_problems=8,
        eval_samples=1,
        epochs=1,
        minibatch_size=64,
        micro_batch_size=32,
    )
    return RunSettings(**{**values, **overrides})


def materialize_round(instance, store, settings, r: int, assets=None):
    key = str(r)
    if not instance.has_dynamic_partition(rounds.name, key):
        instance.add_dynamic_partitions(rounds.name, [key])
    return dg.materialize(
        assets or [*ROUND_ASSETS, *all_checks],
        partition_key=key,
        instance=instance,
        resources=make_resources(str(store), "hf", settings),
        raise_on_error=False,
    )


def test_definitions_load():
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} >= {
        "problems", "rollouts", "advantages", "training_view", "policy", "evaluation"
    }
    job = defs.resolve_job_def("expert_iteration_round")
    assert job.partitions_def == rounds
    assert defs.resolve_sensor_def("next_round_sensor") is not None
    assert defs.resolve_schedule_def("iteration_schedule") is not None


@pytest.fixture(scope="module")
def one_round(tmp_path_factory, default_model_dir):
    store = tmp_path_factory.mktemp("store")
    instance = dg.DagsterInstance.ephemeral()
    # round -1 computed, not taken from the cache an earlier run of the suite left: its engine and
    # timings are part of what is tested
    settings = small_settings(default_model_dir, base_eval_cache=False)
    counts = {"writes": [], "workflows": 0, "configs": 0}
    with pytest.MonkeyPatch.context() as mp:
        # what the round builds and writes: each table once, the run config and the workflow once
        import pipeline.config.run as config_module
        import pipeline.run.context as context_module

        write, build, post_init = Tables.write, context_module.build_workflow, config_module.RunConfig.__post_init__

        def counted_write(self, round_, table, data, **kw):
            counts["writes"].append((round_, table, kw.get("part")))
            return write(self, round_, table, data, **kw)

        def counted_build(config):
            counts["workflows"] += 1
            return build(config)

        def counted_post_init(self):
            counts["configs"] += 1
            return post_init(self)

        mp.setattr(Tables, "write", counted_write)
        mp.setattr(context_module, "build_workflow", counted_build)
        mp.setattr(config_module.RunConfig, "__post_init__", counted_post_init)
        result = materialize_round(instance, store, settings, 0)
    yield instance, store, settings, result, counts
    close_engines()


def test_a_round_writes_each_table_once_and_builds_its_config_and_workflow_once(one_round):
    _instance, _store, _settings, result, counts = one_round
    assert result.success
    written = [(r, table) for r, table, part in counts["writes"] if table != "timings"]
    assert sorted(written) == sorted(set(written)), written  # no table of a round written twice
    assert {(0, t) for t in ("problems", "steps", "advantages", "training_view", "ratio_diagnostics", "evaluation", "rollout_shards")} <= set(written)
    assert all(part is None for _r, _t, part in counts["writes"])  # one shard: no parts, nothing merged
    assert counts["workflows"] == 1, counts  # one workflow (and task) for every asset and check of the round
    assert counts["configs"] <= 1, counts  # one RunConfig (none when this process built it before)


def test_one_round_materializes_in_process(one_round):
    instance, store, settings, result, _counts = one_round
    assert result.success
    for table in ("problems", "steps", "advantages", "training_view", "ratio_diagnostics", "evaluation"):
        assert table_path(store, 0, table).exists(), table
    assert table_path(store, -1, "evaluation").exists()  # the baseline
    steps = pl.read_parquet(table_path(store, 0, "steps"))
    assert set(steps["strategy"].unique()) == {"iid", "prompt_aug", "feedback", "tree"}
    assert set(steps["agent_id"].unique()) == {"solver", "verifier"}
    rec = PolicyRegistry(store).get(0, "shared")
    assert rec is not None and rec.parent is not None
    ev = pl.read_parquet(table_path(store, 0, "evaluation"))
    assert {"accuracy", "verdict_accuracy"} <= set(ev["metric"])
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["steps_schema"] and checks["tree_groups_share_context"] and checks["advantages_sane"]
    assert checks["problems_disjoint_from_heldout"]
    # ratio diagnostics: a table in the store, per agent and strategy, and the policy's metadata
    diag = validate(pl.read_parquet(table_path(store, 0, "ratio_diagnostics")), "ratio_diagnostics")
    overall = diag.filter((pl.col("agent_id") == "*") & (pl.col("strategy") == "*"))
    assert overall.height == 1 and overall["rows"][0] > 0
    assert set(diag.filter(pl.col("agent_id") == "*")["strategy"]) - {"*"} <= {"iid", "prompt_aug", "feedback", "tree"}
    assert "ratio_diagnostics" in result.asset_materializations_for_node("policy")[0].metadata
    assert "ratio_diagnostics" in checks
    mats = result.asset_materializations_for_node("rollouts")
    assert mats[0].metadata["dagster/row_count"].value == steps.height
    assert next_round(instance) == 1
    # seconds per stage, recorded by the stages themselves (round -1: the baseline's evaluation)
    timings = validate(pl.read_parquet(table_path(store, 0, "timings")), "timings")
    assert [s for s in timings["stage"] if s not in SUBSTAGES] == list(STAGES)
    base = pl.read_parquet(table_path(store, -1, "timings"))["stage"].to_list()
    assert base == ["evaluation", "engine_start"]  # the engine the baseline's evaluation built, inside it
    # round -1 is evaluated on the engine the rollouts then sample with (before training closes
    # it): round 0 builds one engine more, for its evaluation, on the trained weights (no swap)
    assert [s for s in timings["stage"] if s in SUBSTAGES] == ["engine_start"]


def test_the_rollouts_engine_start_is_a_timings_row_of_the_round(one_round, tmp_path, monkeypatch):
    """With round -1 already evaluated, the rollouts build the round's first engine; its seconds
    reach the round's `engine_start` row (recorded with the rollouts' own seconds, in one write),
    added to the evaluation's."""
    import shutil
    import time

    from pipeline.engines.pool import EnginePool

    instance, done, settings, _, _ = one_round
    close_engines()
    store = tmp_path / "store"
    shutil.copytree(done / "round=-1", store / "round=-1")  # round -1's evaluation, as if computed
    builds = []
    new = EnginePool._new

    def slow_new(self, *args, **kwargs):
        builds.append(time.perf_counter())
        time.sleep(1.0)
        return new(self, *args, **kwargs)

    monkeypatch.setattr(EnginePool, "_new", slow_new)
    try:
        result = materialize_round(dg.DagsterInstance.ephemeral(), store, settings, 0)
    finally:
        close_engines()
    assert result.success and len(builds) == 2  # the rollouts' engine, the evaluation's
    timings = pl.read_parquet(table_path(store, 0, "timings"))
    assert timings.filter(pl.col("stage") == "engine_start")["seconds"].item() >= 2.0


def test_evaluation_metadata_plots_accuracy_by_round(one_round):
    """The evaluation asset's metadata: numbers the UI plots across partitions, and an inline PNG
    of every accuracy by round with the table it draws."""
    import base64
    import io
    import re

    from PIL import Image

    _instance, store, _settings, result, _counts = one_round
    meta = result.asset_materializations_for_node("evaluation")[0].metadata
    ev = pl.read_parquet(table_path(store, 0, "evaluation"))
    assert meta["solver_acc"].value == ev.filter(pl.col("metric") == "accuracy")["value"][0]
    balanced = ev.filter(pl.col("metric") == "verdict_balanced_accuracy")["value"]  # absent when every answer is right, or every one wrong
    assert meta["verifier_bal_acc"].value == (balanced[0] if balanced.len() else None)
    md = meta["accuracy_plot"].value
    png = base64.b64decode(re.search(r"!\[accuracy per round\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", md).group(1))
    img = Image.open(io.BytesIO(png))
    assert img.size == (620, 300) and len(img.convert("RGB").getcolors(1 << 16)) > 10
    assert "| round | solver_acc | greedy |" in md and "| -1 |" in md and "| 0 |" in md  # the workflow's round-table columns


def test_sensor_requests_the_next_round(one_round):
    instance, *_ = one_round
    sensor = make_next_round_sensor(max_rounds=3)
    ctx = dg.build_sensor_context(instance=instance, definitions=dg.Definitions(sensors=[sensor]))
    (out,) = list(sensor(ctx))
    assert isinstance(out, dg.SensorResult)
    assert [rr.partition_key for rr in out.run_requests] == ["1"]
    assert out.dynamic_partitions_requests[0].partition_keys == ["1"]
    last = make_next_round_sensor(max_rounds=1)
    ctx = dg.build_sensor_context(instance=instance, definitions=dg.Definitions(sensors=[last]))
    (skip,) = list(last(ctx))
    assert isinstance(skip, dg.SkipReason)


def test_failing_blocking_check_stops_the_round(tmp_path, default_model_dir, monkeypatch):
    real_write = Tables.write

    def corrupt(self, round_, table, data, **kw):
        if table == "steps":
            df = pl.from_arrow(data) if not isinstance(data, pl.DataFrame) else data
            first_tree = df.filter(pl.col("strategy") == "tree")["step_id"][0]
            df = df.with_columns(pl.when(pl.col("step_id") == first_tree).then(pl.lit("not-the-siblings-context")).otherwise(pl.col("prompt_hash")).alias("prompt_hash"))
            data = df.to_arrow()
        return real_write(self, round_, table, data, **kw)

    monkeypatch.setattr(Tables, "write", corrupt)
    instance = dg.DagsterInstance.ephemeral()
    try:
        result = materialize_round(instance, tmp_path, small_settings(default_model_dir), 0)
    finally:
        close_engines()
    assert not result.success
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["tree_groups_share_context"] is False
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "rollouts" in materialized and "advantages" not in materialized
    assert not table_path(tmp_path, 0, "advantages").exists()


def test_a_round_under_the_role_baseline_passes_the_advantages_check(tmp_path, default_model_dir):
    """`--baseline role` (SPIRAL's RAE): the round's blocking advantage check judges one baseline
    per role, not group centring, so the round reaches training (it stopped at the check before)."""
    from assets.definitions import advantages, problems, rollouts

    instance = dg.DagsterInstance.ephemeral()
    try:
        result = materialize_round(instance, tmp_path, small_settings(default_model_dir, baseline="role", problems=3), 0,
                                   assets=[problems, rollouts, advantages, *all_checks])
    finally:
        close_engines()
    checks = {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}
    assert result.success and checks["advantages_sane"] is True
    adv = pl.read_parquet(table_path(tmp_path, 0, "advantages"))
    members = adv.filter(pl.col("active") & pl.col("reward").is_not_null())
    b = members.group_by("agent_id").agg((pl.col("reward") - pl.col("advantage")).alias("b"))
    assert b.height == 2 and all(max(v) - min(v) < 1e-9 for v in b["b"])  # one baseline per role
    assert abs(float(members["advantage"].mean())) > 1e-6  # not centred: the per-group test would have failed


def test_ground_truth_baseline_round_is_step_matched(tmp_path, default_model_dir):
    """The SFT-on-ground-truth baseline trains as many rows as the rollouts' view would have."""
    from pipeline.engines.pool import EnginePool
    from pipeline.run.context import RoundContext
    from pipeline.run.rounds import run_round_stages

    ctx = RoundContext(tmp_path, small_settings(default_model_dir, train_on="ground_truth").run_config(), EnginePool("hf"))
    try:
        out = run_round_stages(ctx, 0)
    finally:
        ctx.engines.close()
    view, stats = out["training_view"]
    assert set(view.column("strategy").to_pylist()) == {"ground_truth"}
    assert view.num_rows == stats.n_rows > 0
    assert set(view.column("temperature").to_pylist()) == {1.0}
    assert PolicyRegistry(tmp_path).get(0, "shared") is not None
    assert table_path(tmp_path, 0, "evaluation").exists()


def test_the_sensor_and_the_schedule_refuse_overlapped_rounds_naming_maxit_run():
    """`max_staleness` > 0, in the last round's run config or the definitions' settings: neither
    the sensor nor the schedule launches a whole round (which would overlap nothing); each says
    to use `maxit run`. With 0 both launch as before."""
    from assets.sensors import make_iteration_schedule, overlap_refusal

    config = {"resources": {"settings": {"config": {"max_staleness": 2}}}}
    assert "maxit run --max-staleness 2" in overlap_refusal(config)
    assert overlap_refusal({"resources": {"settings": {"config": {"max_staleness": 0}}}}, 1) is None  # the run's own 0 wins
    assert overlap_refusal({}) is None
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization(dg.AssetKey("evaluation"), partition="0"))
        for k, launched in ((1, False), (0, True)):
            settings = RunSettings(max_staleness=k)
            sensor = make_next_round_sensor(max_rounds=3, settings=settings)
            ctx = dg.build_sensor_context(instance=instance, definitions=dg.Definitions(sensors=[sensor]))
            (out,) = list(sensor(ctx))
            assert isinstance(out, dg.SensorResult) == launched, out
            if not launched:
                assert isinstance(out, dg.SkipReason) and "maxit run --max-staleness 1" in out.skip_message
            schedule = make_iteration_schedule(max_rounds=3, settings=settings)
            out = schedule(dg.build_schedule_context(instance=instance))
            assert isinstance(out, dg.RunRequest) == launched, out
            if not launched:
                assert "maxit run --max-staleness 1" in out.skip_message
