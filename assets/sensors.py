"""The round job, the sensor that starts round r+1 when round r's evaluation succeeds, and a
schedule for periodic iteration.

Both launch whole rounds, one after another: they cannot overlap a round's sampling with the
previous round's training, which only `maxit run --max-staleness K` does (its two lanes,
`assets.overlap`). Settings with `max_staleness` > 0 are refused by both, with a message naming
`maxit run`, instead of rounds sampled with stale checkpoints and nothing overlapped."""

from __future__ import annotations

import dagster as dg

from assets.partitions import rounds

round_job = dg.define_asset_job(
    "expert_iteration_round",
    selection=dg.AssetSelection.groups("expert_iteration"),
    partitions_def=rounds,
    description="One expert-iteration round: problems -> rollouts -> advantages -> training_view -> policy -> evaluation.",
)


def overlap_refusal(run_config: dict | None, default_staleness: int = 0) -> str | None:
    """Why the sensor or the schedule does not launch a round with `run_config` (its settings
    resource's `max_staleness`, else `default_staleness`, the definitions' own): a message
    naming `maxit run` when it is > 0, else None.

    `run_config` is a Dagster run config as the launchpad wrote it, so the one setting is read
    from its flat `settings` fields: building the run's `RunConfig` here would validate every
    setting in the sensor, and a run config that does not validate is the run's failure to
    report, not the sensor's."""
    config = ((run_config or {}).get("resources") or {}).get("settings") or {}
    settings = config.get("config", {}) if isinstance(config, dict) else {}
    k = settings.get("max_staleness", default_staleness) if isinstance(settings, dict) else default_staleness
    try:
        k = int(k or 0)
    except (TypeError, ValueError):
        return f"max_staleness {k!r} is not an integer"
    if k <= 0:
        return None
    return (f"max_staleness {k}: overlapped rounds run only in `maxit run --max-staleness {k} --store STORE` (a sampler and a "
            "trainer lane); this launches whole rounds one after another, which would sample with stale checkpoints and overlap "
            "nothing. Run `maxit run`, or set max_staleness 0 here")


def _default_staleness(settings) -> int:
    """The definitions' own `max_staleness`: their settings resource's `RunConfig`'s (0 without one)."""
    return settings.run_config().max_staleness if settings is not None else 0


def next_round(instance) -> int:
    """One past the newest round whose evaluation is materialized (0 when none is)."""
    done = [int(k) for k in instance.get_materialized_partitions(dg.AssetKey("evaluation")) if k.isdigit()]
    return max(done) + 1 if done else 0


def make_next_round_sensor(max_rounds: int, settings=None) -> dg.SensorDefinition:
    """The sensor; `settings`: the definitions' own settings resource (what a run config that
    does not set them runs with)."""
    default_k = _default_staleness(settings)

    @dg.asset_sensor(
        asset_key=dg.AssetKey("evaluation"),
        job=round_job,
        name="next_round_sensor",
        default_status=dg.DefaultSensorStatus.STOPPED,
        minimum_interval_seconds=10,
        description=f"When round r's evaluation is materialized, add round r+1 and run it (up to {max_rounds} rounds), with the same run config.",
    )
    def next_round_sensor(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
        partition = asset_event.dagster_event.partition if asset_event.dagster_event else None
        if partition is None or not partition.isdigit():
            return dg.SkipReason(f"evaluation materialized without a round partition ({partition!r})")
        nxt = int(partition) + 1
        if nxt >= max_rounds:
            return dg.SkipReason(f"round {partition} was the last of max_rounds={max_rounds}")
        run = context.instance.get_run_by_id(asset_event.run_id) if asset_event.run_id else None
        run_config = run.run_config if run is not None else {}
        refused = overlap_refusal(run_config, default_k)
        if refused is not None:
            return dg.SkipReason(f"round {nxt} not launched: {refused}")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(run_key=f"round-{nxt}", partition_key=str(nxt), run_config=run_config)],
            dynamic_partitions_requests=[rounds.build_add_request([str(nxt)])],
        )

    return next_round_sensor


def make_iteration_schedule(max_rounds: int, cron: str = "0 * * * *", settings=None) -> dg.ScheduleDefinition:
    """The schedule; it launches with the definitions' own `settings`."""
    default_k = _default_staleness(settings)

    @dg.schedule(
        cron_schedule=cron,
        job=round_job,
        name="iteration_schedule",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Periodically run the next round (up to {max_rounds}). Schedules cannot add dynamic partitions, so the partition is added on the instance first.",
    )
    def iteration_schedule(context: dg.ScheduleEvaluationContext):
        nxt = next_round(context.instance)
        if nxt >= max_rounds:
            return dg.SkipReason(f"all {max_rounds} rounds are done")
        refused = overlap_refusal(None, default_k)
        if refused is not None:
            return dg.SkipReason(f"round {nxt} not launched: {refused}")
        if not context.instance.has_dynamic_partition(rounds.name, str(nxt)):
            context.instance.add_dynamic_partitions(rounds.name, [str(nxt)])
        return dg.RunRequest(run_key=f"round-{nxt}", partition_key=str(nxt))

    return iteration_schedule
