"""The `rollouts` asset: a graph of one step per shard.

The round's problems are split into `RunConfig.scale.shards` shards by a stable hash of their uid
(`pipeline.rollout.loop.shard_of`); `rollout_shards` fans out one dynamic output per shard,
`rollout_shard` samples one shard with its own engine (in its own process under the
multiprocess executor, in its own pod under a Kubernetes or Celery executor), and
`merge_rollout_shards` writes the round's one `steps` table once every shard is in, so the
`advantages` asset starts only then. Each shard draws its rows with per-request seeds, so the
merged table is the one a single process would write (`pipeline.rollout.loop.merge_shards`).
With one shard there is nothing to merge: the shard's stage writes the round's `steps` table
itself, once. The checkpoints every shard samples with are resolved once, by the fan-out, and
handed to the shards.

On Ray (`RunConfig.scale.executor` "ray") the fan-out has one output and its one step hands every
shard to Ray (`pipeline.run.ray_shards`): each shard a Ray task with its own engine and
resources, writing its part, even with one shard; the merge is the same. The round's other steps
then run in the run's own process, and the shards' parallelism is Ray's.

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
from pathlib import Path

import dagster as dg
import polars as pl

from assets.config import RunSettings
from assets.io import IO_MANAGER_KEY, TABLE_KEY
from assets.metadata import md_table, reward_by_agent_strategy
from assets.partitions import round_of, rounds
from assets.resources import EngineResource, PolicyRegistryResource, StoreResource
from pipeline.rollout.sampling import merge_shards
from pipeline.run.ray_shards import ShardJob, ray_session, run_shards, sample_shard, shard_resources
from pipeline.run.rounds import evaluate_base, stage_rollouts
from pipeline.run.timings import record_timings
from pipeline.store import TableInfo

SHARD_TABLE = "rollout_shards"
"""`<store>/round=<r>/rollout_shards.parquet`: one row per shard (problems, rows, process id,
host, start and end times), written once the shards are in."""


@dg.op(out=dg.DynamicOut(dict))
def rollout_shards(context: dg.OpExecutionContext, problems: pl.DataFrame, settings: RunSettings, store: StoreResource,
                   policy_registry: PolicyRegistryResource):
    """One dynamic output per shard: its number and the checkpoints it samples with, resolved
    here, once, so the shards never race to register the base model and all sample with the same
    checkpoints. One shard samples every problem and is handed the round's `problems` table (the
    IO manager loaded it); several shards each read their share (`sample_shard`)."""
    r, scale = round_of(context), settings.run_config().scale
    shards = scale.shards
    ctx = settings.context(store, r, policy_registry=policy_registry)
    checkpoints = {pid: str(path) for pid, path in ctx.checkpoints.sample_checkpoints(r).items()}
    ctx.tables.remove_parts(r)  # a crashed attempt's shard files are replaced, never merged
    if scale.executor == "ray":  # one step hands every shard to Ray, which runs them at once
        yield dg.DynamicOutput({"shards": list(range(shards)), "checkpoints": checkpoints}, mapping_key="ray")
        return
    if shards == 1:
        yield dg.DynamicOutput({"shard": 0, "checkpoints": checkpoints, "problems": problems}, mapping_key="shard_0")
        return
    for s in range(shards):
        yield dg.DynamicOutput({"shard": s, "checkpoints": checkpoints}, mapping_key=f"shard_{s}")


def rollout_summary(steps: pl.DataFrame) -> dict:
    """What the rollouts asset reports of a `steps` table: its rows, completion tokens, engine and
    rewards by agent and strategy."""
    return {
        "rows": steps.height,
        "tokens": int(steps["completion_ids"].list.len().sum()),
        "engine": steps["engine"][0] if steps.height else "",
        "rewards": reward_by_agent_strategy(steps).to_dicts(),
    }


@dg.op(tags={"maxit/stage": "rollouts"})
def rollout_shard(
    context: dg.OpExecutionContext, task: dict, settings: RunSettings, store: StoreResource, engine: EngineResource, policy_registry: PolicyRegistryResource
) -> list[dict]:
    """Sample the shards of `task`: on Dagster one shard with this process's engine (with one
    shard the round's `steps` table itself, with several this shard's part of it); on Ray every
    shard, each a Ray task with its own engine writing its part. Returns one result per shard."""
    r, scale = round_of(context), settings.run_config().scale
    shards = scale.shards
    if scale.executor == "ray":
        return ray_shards(context, task, settings, store, engine)
    shard = int(task["shard"])
    checkpoints = {pid: Path(path) for pid, path in task["checkpoints"].items()}
    ctx = settings.context(store, r, engine, policy_registry)
    # an op, not an asset: nothing reaches it through the IO manager, and in a process of its own
    # its reads (round -1's evaluation, a shard's problems) need the working copy current
    ctx.tables.pull()
    if shards > 1:
        out = sample_shard(ctx, r, shard, shards, checkpoints)
    else:
        # The starting checkpoints' evaluation (round -1, once per store) runs here, on the engine
        # the rollouts are about to use, and not after training, which closes the engines on a
        # CPU: one engine start and one weight swap fewer. With several shards each process has
        # its own engine, and the evaluation asset evaluates round -1 once.
        evaluate_base(ctx)
        started = time.time()
        problems = task["problems"]
        steps = pl.from_arrow(stage_rollouts(ctx, r, problems, checkpoints))  # writes the round's table and records its seconds
        out = {"shard": shard, "problems": problems.height, "rows": steps.height, "pid": os.getpid(), "host": socket.gethostname(),
               "substages": {}, "summary": rollout_summary(steps), "started": started, "finished": time.time()}
    context.log.info(f"shard {shard}/{shards}: {out['problems']} problems, {out['rows']} rows in {out['finished'] - out['started']:.1f}s (pid {os.getpid()})")
    return [out]


def ray_shards(context: dg.OpExecutionContext, task: dict, settings: RunSettings, store: StoreResource, engine: EngineResource) -> list[dict]:
    """Every shard of the round as a Ray task (`pipeline.run.ray_shards`), on the run's Ray
    instance (or, for a run the UI launched, one this step starts and stops)."""
    config = settings.run_config()
    r, shards = round_of(context), config.scale.shards
    jobs = [ShardJob(str(store.tables().location), config, engine.engine, engine.pool_options(config.engine_options), r, s, shards,
                     dict(task["checkpoints"])) for s in task["shards"]]
    engine_gpus = config.scale.tensor_parallel_size * config.scale.data_parallel_size
    with ray_session(config.scale.ray_address) as session:
        resources = shard_resources(session.resources, shards, engine_gpus)
        out = run_shards(jobs, resources)
    for s in out:
        context.log.info(f"shard {s['shard']}/{shards} on Ray ({resources}): {s['problems']} problems, {s['rows']} rows "
                         f"in {s['finished'] - s['started']:.1f}s (pid {s['pid']} on {s['host']})")
    return out


@dg.op(out=dg.Out(TableInfo, io_manager_key=IO_MANAGER_KEY))
def merge_rollout_shards(context: dg.OpExecutionContext, problems: pl.DataFrame, shards: list[list[dict]], settings: RunSettings,
                         store: StoreResource) -> TableInfo:
    """Every shard is in: unless one shard wrote it itself, the round's `steps` table from the
    shards' parts, in the order one process would write it, written once (and the shards' seconds
    recorded); the `rollout_shards` table. Its output is the `steps` table, which the IO manager
    publishes (with the `rollout_shards` table) and describes."""
    r = round_of(context)
    shards = sorted((s for step in shards for s in step), key=lambda s: s["shard"])
    # `problems` was loaded once every shard was in: the IO manager's pull then brought the parts
    # that shards in other processes or on other machines uploaded
    tables = store.tables()
    wall = max(s["finished"] for s in shards) - min(s["started"] for s in shards)
    summary = shards[0]["summary"]
    if summary is None:
        parts = [part.to_arrow() for part in tables.read_parts(r, "steps")]
        steps = merge_shards(parts, problems["uid"].to_list(), list(settings.run_config().strategies))
        tables.write(r, "steps", steps)
        substages = {name: sum(s["substages"].get(name, 0.0) for s in shards) for name in {k for s in shards for k in s["substages"]}}
        record_timings(tables, r, {"rollouts": wall}, added=substages)  # substages summed over the shards' processes
        tables.remove_parts(r)
        summary = rollout_summary(pl.from_arrow(steps))
    keep = ("shard", "problems", "rows", "pid", "host", "started", "finished")
    shard_df = pl.DataFrame([{k: s[k] for k in keep} for s in shards]).with_columns(pl.lit(r, pl.Int32).alias("round"))
    tables.write(r, SHARD_TABLE, shard_df)
    context.add_output_metadata(
        {
            "completion_tokens": summary["tokens"],
            "tokens_per_second": round(summary["tokens"] / wall, 1) if wall > 0 else 0.0,
            "engine": summary["engine"],
            "shards": len(shards),
            "shard_pids": ", ".join(str(s["pid"]) for s in shards),
            "by_shard": md_table(shard_df.select("shard", "problems", "rows", "pid", "host", (pl.col("finished") - pl.col("started")).round(1).alias("seconds"))),
            "reward_by_agent_strategy": md_table(pl.DataFrame(summary["rewards"])),
        }
    )
    return tables.info(r, "steps", summary["rows"])


@dg.graph_asset(
    name="rollouts",
    partitions_def=rounds,
    group_name="expert_iteration",
    ins={"problems": dg.AssetIn(key="problems")},
    kinds={"vllm"},
    metadata={TABLE_KEY: "steps"},
    description="Every agent call of the round (the `steps` table): the team acting on the problems under every search strategy, "
    "with token ids and sampling logprobs; one step per shard (RunConfig.scale.shards), merged when all are in.",
)
def rollouts(problems):
    return merge_rollout_shards(problems, rollout_shards(problems).map(rollout_shard).collect())
