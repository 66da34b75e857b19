"""A finished round of a store, logged to experiment trackers: TensorBoard, MLflow, Weights & Biases.

Everything stays inside the store and offline: no account, no network, no prompt.

- `tensorboard`: event files in `<store>/tensorboard/` (torch's `SummaryWriter`).
- `mlflow`: one MLflow run per store in a SQLite database, `<store>/mlflow/mlflow.db` (artifacts
  under `<store>/mlflow/artifacts/`). Not MLflow's `./mlruns` file store: MLflow 3 keeps that
  backend in maintenance mode, and the 3.17 installed here refuses to open it unless
  MLFLOW_ALLOW_FILE_STORE=true is set. MLflow's telemetry is switched off
  (MLFLOW_DISABLE_TELEMETRY=true in this process, set before mlflow is imported).
- `wandb`: one W&B run per store in offline mode, `<store>/wandb/offline-run-*-<id>/`; every
  process that logs makes its own folder of the same run id, and `wandb sync` uploads them
  one after another as one run. W&B's error reporting and system metrics are off.

What one round logs (`pipeline.reporting.round_scalars.collect_round`), step = the round number, round -1 (the starting
checkpoints' evaluation) at step -1; W&B's own step must start at 0 and only grow, so there every
point also carries `round` and every chart is drawn against it (`define_metric`):

- `<split>/<agent_id>/<metric>`: every row of the round's `evaluation` table (split "heldout");
- `summary/<column>`: the round table `maxit run` prints (`round_summary`: the workflow's
  table metrics, trajectory success per strategy, rollout tokens/s), without its seconds per
  stage, which `time/` has unrounded;
- `rollout/agent/<agent_id>/...`, `rollout/strategy/<strategy>/...`: from the `steps` table,
  active rows: mean local and global reward, `success` (share of calls whose local reward is
  correct, `pipeline.rollout.rewards.CORRECT_THRESHOLD`; per strategy: trajectory success,
  `pipeline.reporting.report.trajectory_success`) and `calls`;
- `ratio/<policy_id>/<agent_id>/<strategy>/<column>`: every row of `ratio_diagnostics` ("*"
  written "all");
- `time/<stage>`: seconds per stage (`timings`);
- `train/<policy_id>/<metric>`: the policy registry's training summary of the round (steps,
  rows, mean_loss, tokens_per_second). Per-step losses are not in the store: `maxit run` trains
  with `TrainConfig.report_to="none"` (`Settings.train_config`), so there is no per-step log to
  replay; the round's summary is what is logged.

A value that is null or not finite (a policy without rows has no loss) is left out rather than
logged as NaN. The store's settings (`experiment.json`: `settings`, `effective`, `engine`) are
logged once per target: TensorBoard hparams and a text panel, MLflow params, W&B config.

What was logged is kept in `<store>/tracking.json` (rounds per target, the MLflow and W&B run
ids), so logging a round again logs nothing and a resumed `maxit run` continues the same runs.
A round re-run with `maxit run --restart` keeps the values first logged for it. A call
interrupted mid-write is safe to repeat for TensorBoard (the next writer purges the steps it
rewrites) and MLflow (a round whose batch reached the database is recognised by its `round`
metric); W&B may then hold the interrupted round twice.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from pipeline import store as st
from pipeline.config.scale import TrackingConfig
from pipeline.errors import ConfigError, DataError, MaxitError
from pipeline.reporting.round_scalars import RoundScalars, collect_round, settings_values
from pipeline.run.experiment_record import read_experiment
from pipeline.run.settings import flag_named
from pipeline.store import BASE_ROUND

__all__ = ["TARGETS", "STATE_FILE", "check_targets", "log_round"]

TARGETS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),  # its SQLite backend needs the last two
    "wandb": ("wandb",),
}
"""The Python packages each tracker the config takes (`TRACKERS`) needs."""

INSTALL = {"tensorboard": "pip install tensorboard", "mlflow": "pip install 'maxit[track]'", "wandb": "pip install 'maxit[track]'"}

STATE_FILE = "tracking.json"
"""What was logged where: `{target: {"rounds": [...], "settings": bool, "run_id": ...}}`."""

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlflow"
WANDB_PROJECT = "maxit"
MLFLOW_EXPERIMENT = "maxit"


# -- targets ----------------------------------------------------------------------------------


def check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    """The targets, checked: their names by the field that holds them (`TrackingConfig.report_to`:
    each one of `TRACKERS`, "none" alone meaning no target, repeats dropped), then each one's
    packages installed. Raises a one-line `ConfigError` naming `--report-to X` and what to
    install. Returns the targets without repeats, in their order."""
    try:
        targets = TrackingConfig(report_to=tuple(targets)).report_to
    except ConfigError as err:
        raise ConfigError(flag_named(str(err))) from None
    for target in targets:
        missing = [p for p in TARGETS[target] if importlib.util.find_spec(p) is None]
        if missing:
            raise ConfigError(f"--report-to {target}: package {', '.join(missing)} is not installed; {INSTALL[target]}")
    return targets


# -- the state file ---------------------------------------------------------------------------


def _read_state(store: Path) -> dict[str, dict[str, Any]]:
    path = store / STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err}); delete it to log every round again") from None


def _write_state(store: Path, state: Mapping[str, Any]) -> None:
    st.atomic_write_text(store / STATE_FILE, json.dumps(state, indent=2, sort_keys=True) + "\n")


def _todo(store: Path, round_: int, logged: Sequence[int]) -> list[int]:
    """Rounds to log for a call on `round_`: the starting checkpoints' evaluation first, when the
    store has it and it was never logged, then `round_`; those already logged left out."""
    rounds = [BASE_ROUND] if round_ != BASE_ROUND and st.Tables(store).exists(BASE_ROUND, "evaluation") else []
    return [r for r in [*rounds, round_] if r not in logged]


# -- the writers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of the block (a library reads them when it
    starts its helper process), then put back what was there."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _log_tensorboard(store: Path, points: Sequence[RoundScalars], entry: dict, settings: Mapping[str, Any]) -> None:
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    logged = entry.get("rounds", [])
    # TensorBoard hides the events of steps >= purge_step written before this writer's file: what
    # an interrupted attempt at these rounds left, when they come after every round logged
    first = min(p.round for p in points)
    purge = first if not logged or first > max(logged) else None
    writer = SummaryWriter(log_dir=str(store / TENSORBOARD_DIR), purge_step=purge)
    try:
        if settings and not entry.get("settings"):
            for summary in hparams(dict(settings), {}):
                writer.file_writer.add_summary(summary)
            writer.add_text("settings", "\n".join(f"    {k} = {v}" for k, v in settings.items()))
        for point in points:
            for key, value in point.values.items():
                writer.add_scalar(key, value, global_step=point.round)
        writer.flush()
    finally:
        writer.close()
    entry["settings"] = entry.get("settings") or bool(settings)


def _mlflow_client(store: Path):
    # MLflow starts its telemetry client when imported and checks this before every event
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from mlflow.tracking import MlflowClient

    folder = store / MLFLOW_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=f"sqlite:///{(folder / 'mlflow.db').resolve()}")


def _log_mlflow(store: Path, points: Sequence[RoundScalars], entry: dict, settings: Mapping[str, Any]) -> None:
    from mlflow.entities import Metric, Param

    client = _mlflow_client(store)
    run_id = entry.get("run_id")
    if run_id is None:
        experiment = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else client.create_experiment(MLFLOW_EXPERIMENT, artifact_location=(store / MLFLOW_DIR / "artifacts").resolve().as_uri())
        )
        run_id = client.create_run(experiment_id, run_name=store.resolve().name, tags={"maxit.store": str(store.resolve())}).info.run_id
        entry["run_id"] = run_id
    if settings and not entry.get("settings"):
        params = [Param(k, str(v)[:6000]) for k, v in settings.items()]  # MLflow keeps 6000 characters a value
        for i in range(0, len(params), 100):  # at most 100 params a batch
            client.log_batch(run_id, params=params[i : i + 100])
        entry["settings"] = True
    # a round whose batch reached the database before an interruption kept its state from being
    # written is there already: its `round` marker says so
    present = {int(m.step) for m in client.get_metric_history(run_id, "round")}
    now = int(time.time() * 1000)
    for point in points:
        if point.round in present:
            continue
        metrics = [Metric(k, v, now, point.round) for k, v in point.values.items()] + [Metric("round", float(point.round), now, point.round)]
        for i in range(0, len(metrics), 1000):  # at most 1000 metrics a batch
            client.log_batch(run_id, metrics=metrics[i : i + 1000])
    client.set_terminated(run_id, "FINISHED")


def _log_wandb(store: Path, points: Sequence[RoundScalars], entry: dict, settings: Mapping[str, Any]) -> None:
    offline = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_ERROR_REPORTING": "false", "WANDB_DISABLE_GIT": "true"}
    with _environ(**offline):
        import wandb

        run_id = entry.get("run_id") or secrets.token_hex(4)  # W&B ids: letters and digits
        config = dict(settings) if settings and not entry.get("settings") else None
        run = wandb.init(
            project=WANDB_PROJECT,
            name=store.resolve().name,
            id=run_id,
            resume="allow",
            dir=str(store),
            config=config,
            settings=wandb.Settings(
                mode="offline", silent=True, console="off", disable_git=True, disable_code=True, save_code=False,
                x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
            ),
        )
        entry["run_id"] = run_id
        try:
            run.define_metric("round")
            run.define_metric("*", step_metric="round")
            step = int(entry.get("next_step", 0))
            for point in points:
                run.log({"round": point.round, **point.values}, step=step)
                step += 1
        finally:
            run.finish()
    entry.update(next_step=step, settings=entry.get("settings") or config is not None)


WRITERS = {"tensorboard": _log_tensorboard, "mlflow": _log_mlflow, "wandb": _log_wandb}


# -- the entry point --------------------------------------------------------------------------


def log_round(store: str | Path, round_: int, targets: Sequence[str], metrics: Sequence[tuple[str, str, str]] | None = None) -> dict[str, list[int]]:
    """Log complete round `round_` of the local store `store` to each of `targets`
    (`check_targets`), with the starting checkpoints' evaluation (round -1) first when it was
    never logged there. Rounds a target already has are skipped (`<store>/tracking.json`), so a
    second call logs nothing. `metrics`: see `collect_round`.

    Returns target -> the rounds this call logged. A target that fails does not stop the others;
    its error is raised (a `MaxitError` naming every failed target) after they ran."""
    targets = check_targets(targets)
    store = Path(store)
    if not st.Tables(store).exists(round_, "evaluation"):
        raise DataError(f"round {round_} of {store} is not complete (no evaluation table); log a round after it finished")
    state = _read_state(store)
    settings: dict | None = None
    cache: dict[int, RoundScalars] = {}
    done: dict[str, list[int]] = {}
    failed: list[str] = []
    for target in targets:
        entry = dict(state.get(target, {}))
        rounds = _todo(store, round_, entry.get("rounds", []))
        done[target] = []
        if not rounds:
            continue
        if settings is None:
            settings = settings_values(read_experiment(store))
        for r in rounds:
            if r not in cache:
                cache[r] = collect_round(store, r, metrics)
        points = [cache[r] for r in rounds]
        try:
            WRITERS[target](store, points, entry, settings)
        except Exception as err:  # noqa: BLE001 - one tracker's failure must not hide the others' rounds
            failed.append(f"{target}: {type(err).__name__}: {err}")
            if entry.get("run_id") and entry["run_id"] != state.get(target, {}).get("run_id"):
                state[target] = {**state.get(target, {}), "run_id": entry["run_id"]}  # the run it made, for the next call
                _write_state(store, state)
            continue
        entry["rounds"] = sorted({*entry.get("rounds", []), *rounds})
        state[target] = entry
        _write_state(store, state)
        done[target] = rounds
    if failed:
        raise MaxitError(f"logging round {round_} of {store} failed for " + "; ".join(failed))
    return done
