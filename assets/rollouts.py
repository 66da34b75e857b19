"""The `rollouts` asset: a graph of one step per shard.

The round's problems are split into `settings.shards` shards by a stable hash of their uid
(`pipeline.rollout.loop.shard_of`); `rollout_shards` fans out one dynamic output per shard,
`rollout_shard` samples one shard with its own engine (in its own process under the
multiprocess executor, in its own pod under a Kubernetes or Celery executor), and
`merge_rollout_shards` writes the round's one `steps` table once every shard is in, so the
`advantages` asset starts only then. Each shard draws its rows with per-request seeds, so the
merged table is the one a single process would write (`pipeline.rollout.loop.merge_shards`).

Why dynamic outputs and not a second partition dimension (round x shard): the shard count is a
run setting, not part of the definitions, and a partition dimension would fix it there (a
static dimension) or need keys added per run (a second dynamic dimension), and every downstream
asset would need a partition mapping back to rounds. Mapped steps keep the asset graph and its
checks as they are, and each shard is still its own step: its own process, logs, retries and
re-execution from failure.
"""


import os
import socket
import time
from dataclasses import replace
from pathlib import Path

import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.metadata import md_table, reward_by_agent_strategy
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.store import read_table, round_dir, table_path, write_table

SHARD_TABLE = "rollout_shards"
"""`<store>/round=<r>/rollout_shards.parquet`: one row per shard (problems, rows, process id,
host, start and end times), written with the merged steps table."""


def shard_store(root: str | Path, round_: int, shard: int) -> Path:
    """The folder a shard writes its own tables to before the merge (removed after it)."""
    return round_dir(root, round_) / "shards" / f"shard={int(shard)}"


@dg.op(ins={"problems": dg.In(dg.Nothing)}, out=dg.DynamicOut(int))
def rollout_shards(context: dg.OpExecutionContext, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource):
    """One dynamic output per shard. The starting checkpoints are resolved here, once, so the
    shards never race to register the base model."""
    r = round_of(context)
    shards = int(settings.shards)
    if shards < 1:
        raise dg.Failure(f"settings.shards must be >= 1, got {shards}")
    store.pull()
    settings.context(store, _NoEngine(), policy_registry).start_checkpoints(r)
    store.remove(f"round={r}/shards")  # a crashed attempt's shard files are replaced, never merged
    for s in range(shards):
        yield dg.DynamicOutput(s, mapping_key=f"shard_{s}")


@dg.op(tags={"maxit/stage": "rollouts"})
def rollout_shard(
    context: dg.OpExecutionContext, shard: int, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> dict:
    """Sample one shard's problems (every strategy, every agent step) with this process's engine."""
    from pipeline.rollout.loop import shard_of
    from pipeline.run.rounds import evaluate_base, stage_rollouts, substage_seconds

    r = round_of(context)
    shards = int(settings.shards)
    store.pull()
    run_ctx = settings.context(store, engine, policy_registry)
    if shards == 1:
        # The starting checkpoints' evaluation (round -1, once per store) runs here, on the engine
        # the rollouts are about to use, and not after training, which closes the engines on a
        # CPU: one engine start and one weight swap fewer. With several shards each process has
        # its own engine, and the evaluation asset evaluates round -1 once.
        evaluate_base(run_ctx)
    started = time.time()
    problems = read_table(table_path(store.root(), r, "problems"))
    mine = problems.filter(pl.col("uid").map_elements(lambda u: shard_of(u, shards), return_dtype=pl.Int64) == shard)
    out = shard_store(store.root(), r, shard)
    rows = 0
    substages = {}
    if mine.height:
        ctx = replace(run_ctx, store=out)
        before = substage_seconds(ctx)
        rows = stage_rollouts(ctx, r, mine).num_rows
        # the shard's own timings go to its folder, removed after the merge: its engine starts and
        # swaps travel with its result to the round's timings
        substages = {k: v - before[k] for k, v in substage_seconds(ctx).items() if v > before[k]}
        store.publish(r)  # a URL store: the shard's table goes up for the merge (maybe on another machine)
    finished = time.time()
    context.log.info(f"shard {shard}/{shards}: {mine.height} problems, {rows} rows in {finished - started:.1f}s (pid {os.getpid()})")
    return {
        "shard": shard, "problems": mine.height, "rows": rows, "pid": os.getpid(), "host": socket.gethostname(),
        "started": started, "finished": finished, "path": table_path(out, r, "steps").relative_to(store.root()).as_posix() if rows else None,
        "substages": substages,
    }


@dg.op(out=dg.Out(dg.Nothing))
def merge_rollout_shards(context: dg.OpExecutionContext, shards: list[dict], settings: RunSettings, store: StoreResource):
    """Every shard is in: the round's `steps` table, in the order one process would write it."""
    import pipeline.rollout.loop as rollouts_mod
    from pipeline.run.rounds import record_timing
    from schemas import STEPS

    r = round_of(context)
    shards = sorted(shards, key=lambda s: s["shard"])
    store.pull()
    problems = read_table(table_path(store.root(), r, "problems"))
    tables = [read_table(store.root() / s["path"], STEPS).to_arrow() for s in shards if s["path"]]
    steps_table = rollouts_mod.merge_shards(tables, problems["uid"].to_list(), list(settings.run_config().strategies))
    rollouts_mod.write_steps(steps_table, store.root(), r)
    shard_df = pl.DataFrame([{k: v for k, v in s.items() if k != "substages"} for s in shards]).drop("path").with_columns(pl.lit(r, pl.Int32).alias("round"))
    write_table(shard_df, table_path(store.root(), r, SHARD_TABLE))
    wall = max(s["finished"] for s in shards) - min(s["started"] for s in shards)
    record_timing(store.root(), r, "rollouts", wall)
    for name in sorted({k for s in shards for k in s.get("substages", {})}):  # summed over the shards' processes
        record_timing(store.root(), r, name, sum(s.get("substages", {}).get(name, 0.0) for s in shards), add=True)
    store.remove(f"round={r}/shards")
    store.publish(r)
    steps = pl.from_arrow(steps_table)
    tokens = int(steps["completion_ids"].list.len().sum())
    context.add_output_metadata(
        {
            "dagster/row_count": steps.height,
            "path": store.location(r, "steps"),
            "completion_tokens": tokens,
            "tokens_per_second": round(tokens / wall, 1) if wall > 0 else 0.0,
            "engine": steps["engine"][0] if steps.height else "",
            "shards": len(shards),
            "shard_pids": ", ".join(str(s["pid"]) for s in shards),
            "by_shard": md_table(shard_df.select("shard", "problems", "rows", "pid", "host", (pl.col("finished") - pl.col("started")).round(1).alias("seconds"))),
            "reward_by_agent_strategy": md_table(reward_by_agent_strategy(steps)),
        }
    )


@dg.graph_asset(
    name="rollouts",
    partitions_def=rounds,
    group_name="expert_iteration",
    ins={"problems": dg.AssetIn(key="problems", dagster_type=dg.Nothing)},
    kinds={"vllm"},
    description="Every agent call of the round (the `steps` table): the team acting on the problems under every search strategy, "
    "with token ids and sampling logprobs; one step per shard (settings.shards), merged when all are in.",
)
def rollouts(problems):
    return merge_rollout_shards(rollout_shards(problems).map(rollout_shard).collect())


class _NoEngine:
    """The starting checkpoints are resolved without sampling: no engine is loaded."""

    def pool(self, options=None):
        return None
