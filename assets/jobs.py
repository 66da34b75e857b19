"""Materializing a round's assets and checks on a Dagster instance (`materialize_round`): in
the run's own process with one shard, on Dagster's multiprocess executor with several (the round
job as a reconstructable job, `sharded_round_job`, which a step process rebuilds from this module
with `build_round_job`)."""

from __future__ import annotations

from pipeline.run.rounds import round_complete
from pipeline.store import Tables

from assets.failures import round_failure
from assets.instance import PROJECT_ROOT


def materialize_round(instance, tables: Tables, r: int, settings, engine: str, quiet_dagster: bool, stages: tuple[str, ...] | None = None) -> None:
    """Run round `r`'s assets and checks from scratch on `instance`, or only the assets `stages`
    (with their checks; overlapped rounds): in this process with one shard, one process per step
    with several. A failed round is a `MaxitError` naming each failed step (`round_failure`)."""
    import dagster as dg

    from assets.checks import all_checks
    from assets.definitions import ROUND_ASSETS, make_resources
    from assets.partitions import rounds as rounds_def

    if stages is None:
        tables.remove_temporary(r)  # left by a run killed mid-write
        if round_complete(tables, r):  # --restart: the round is incomplete until it finishes again,
            tables.remove(r, "evaluation")  # so a run stopped mid-way does not leave its new tables beside the old evaluation
    key = str(r)
    if not instance.has_dynamic_partition(rounds_def.name, key):
        instance.add_dynamic_partitions(rounds_def.name, [key])
    location = str(tables.location)
    run_config = {"loggers": {"console": {"config": {"log_level": "WARNING" if quiet_dagster else "INFO"}}}}
    tags = {"maxit/launched_by": "maxit run", "maxit/store": location}
    scale = settings.run_config().scale
    if scale.shards > 1 and scale.executor != "ray":
        # one process per step (each shard's rollouts with its own engine), up to `shards` at once;
        # on Ray the shards are Ray tasks, handed over by one step of the in-process run below
        job = sharded_round_job(location, engine, settings)
        selection = None if stages is None else [dg.AssetKey(s) for s in stages]
        result = dg.execute_job(job, instance=instance, run_config=run_config, tags={**tags, "dagster/partition": key}, raise_on_error=False,
                                asset_selection=selection)
    else:
        result = dg.materialize(
            [*ROUND_ASSETS, *all_checks], partition_key=key, instance=instance, resources=make_resources(location, engine, settings),
            run_config=run_config, raise_on_error=False, tags=tags, selection=None if stages is None else list(stages),
        )
    if not result.success:
        failed_checks = [
            f"{ev.asset_check_key.name}: {ev.metadata}"
            for ev in result.get_asset_check_evaluations()
            if not ev.passed and ev.severity == dg.AssetCheckSeverity.ERROR
        ]
        raise round_failure(r, result.run_id, result.all_events, failed_checks)


SHARDED_JOB = "expert_iteration_round_multiprocess"


def sharded_round_job(store: str, engine: str, settings):
    """The round job on Dagster's multiprocess executor, as a reconstructable job: every step
    (each shard's rollouts among them) runs in its own process, at most `RunConfig.scale.shards` at
    once. The child processes rebuild the job from this module with the same store, engine and
    settings (`build_round_job`)."""
    import dagster as dg

    values = settings.settings() if hasattr(settings, "settings") else settings
    from dataclasses import asdict

    kwargs = {"store": str(store), "engine": engine, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(values).items()}}
    return dg.build_reconstructable_job(__name__, "build_round_job", reconstructable_kwargs=kwargs, reconstructor_working_directory=str(PROJECT_ROOT))


def build_round_job(store: str, engine: str, settings: dict, executor=None):
    """The job of one round's assets and checks with the run's resources bound, on the
    multiprocess executor (`max_concurrent` = shards) unless `executor` is given. The same
    definitions run on a cluster by passing another executor (`dagster_k8s.k8s_job_executor`,
    `dagster_celery.celery_executor`): see docs/SCALING.md."""
    import dagster as dg

    from assets.checks import all_checks
    from assets.config import RunSettings
    from assets.definitions import ROUND_ASSETS, make_resources
    from assets.partitions import rounds as rounds_def

    run_settings = RunSettings(**settings)
    if executor is None:
        executor = dg.multiprocess_executor.configured({"max_concurrent": run_settings.run_config().scale.shards})
    job = dg.define_asset_job(SHARDED_JOB, selection=dg.AssetSelection.groups("expert_iteration"), partitions_def=rounds_def)
    defs = dg.Definitions(
        assets=ROUND_ASSETS, asset_checks=all_checks, jobs=[job], resources=make_resources(store, engine, run_settings), executor=executor
    )
    return defs.resolve_job_def(SHARDED_JOB)
