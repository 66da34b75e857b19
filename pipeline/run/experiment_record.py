"""A store as an experiment: its record (`experiment.json`: the settings `maxit run` last ran it
with), the settings a new run changes, and which rounds it completed. The list of experiments
under some folders (`maxit runs`) is `pipeline.reporting.experiments`.

A store is one experiment: its tables (`round=<r>/*.parquet`), checkpoints, policy registry,
Dagster instance (`.dagster/`), console log (`maxit.log`) and `experiment.json`."""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import fields
from pathlib import Path
from typing import Mapping


from pipeline import store as st
from pipeline.errors import ConfigError, DataError

__all__ = [
    "EXPERIMENT_FILE",
    "now_iso",
    "LOG_FILE",
    "record_experiment",
    "read_experiment",
    "stored_settings",
    "settings_changes",
    "is_store",
    "complete_rounds",
]

EXPERIMENT_FILE = "experiment.json"
"""The store's experiment record: settings, engine, when it was created and last run."""

LOG_FILE = "maxit.log"
"""The store's log of engine and library output (warnings, vLLM and Dagster log lines)."""

MOVED_WORKFLOWS = {
    "pipeline.run.baselines:arm_workflow": "pipeline.run.arms:arm_workflow",
    "pipeline.run.baselines:single_workflow": "pipeline.run.arms:single_workflow",
}
"""Workflow paths that records written by earlier versions hold, and where each lives now: an arm's
store records the factory its workflow was built with (`pipeline.run.arms`, once `baselines`)."""


def now_iso() -> str:
    """The local time now, ISO 8601 to the second, with its UTC offset."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def record_experiment(store: str | Path, settings, engine: str) -> dict:
    """Write `<store>/experiment.json` with `settings` (a `pipeline.run.settings.Settings`), the
    values in effect of the settings left to the loss's preset (`effective`: a preset may change
    between versions) and the engine; the creation time of the first record is kept. Returns the
    record. When the settings or the values in effect differ from those recorded before, the
    record keeps the earlier ones under `previous_settings` and `previous_effective` (the store's
    earlier rounds were made with them)."""
    from pipeline.run.settings import Settings

    if not isinstance(settings, Settings):
        raise ConfigError(f"record_experiment: settings must be pipeline.run.settings.Settings, got {type(settings).__name__}")
    root = Path(store)
    old = read_experiment(root) or {}
    values, effective = st.jsonable(settings), st.jsonable(settings.preset_values())
    record = {
        "store": str(root.resolve()),
        "created": old.get("created", now_iso()),
        "updated": now_iso(),
        "engine": engine,
        "settings": values,
        "effective": effective,
    }
    # a record from before `effective` was kept cannot show a preset change: judged by its settings
    changed = old.get("settings") not in (None, values) or old.get("effective", effective) != effective
    for key in ("settings", "effective"):
        if changed and key in old:
            record[f"previous_{key}"] = old[key]
        elif not changed and f"previous_{key}" in old:
            record[f"previous_{key}"] = old[f"previous_{key}"]
    root.mkdir(parents=True, exist_ok=True)
    st.atomic_write_text(root / EXPERIMENT_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def read_experiment(store: str | Path) -> dict | None:
    """The store's experiment record, or None when it has none (a store made before records, or
    by hand)."""
    path = Path(store) / EXPERIMENT_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    # a workflow path of an earlier version is read as where it lives now, so the store's team can
    # be rebuilt and a resumed run does not see its own workflow as a changed setting
    for key in ("settings", "previous_settings"):
        workflow = (record.get(key) or {}).get("workflow") if isinstance(record, dict) else None
        if workflow in MOVED_WORKFLOWS:
            record[key]["workflow"] = MOVED_WORKFLOWS[workflow]
    return record


def stored_settings(record: Mapping) -> "Settings":
    """The `Settings` an experiment record (`read_experiment`) holds; settings this maxit does not
    know (a record from another version) are left out."""
    from pipeline.run.settings import Settings

    known = {f.name for f in fields(Settings)}
    return Settings(**{k: v for k, v in record["settings"].items() if k in known})


def settings_changes(store: str | Path, settings) -> list[str]:
    """What a run of `settings` (a `pipeline.run.settings.Settings`) changes against the settings the
    store last ran with (its experiment record), when it holds complete rounds: `--flag new (was
    old)` per setting that differs (a boolean by the flag that sets it: `--separate-policies`,
    `--no-x`), then one line per value the presets give differently (`effective`). Empty for a
    new store, a store without a record, or the same settings. A setting a record of another
    version does not hold, or this version does not know, is left out; so is the cache of the
    starting model's evaluation, which changes no round's rows."""
    from pipeline.run.settings import Settings, setting_flag

    root = Path(store)
    record = read_experiment(root) if root.is_dir() else None
    if not record or "settings" not in record or not complete_rounds(root):
        return []
    old, new = record["settings"], st.jsonable(settings)

    def shown(value) -> str:  # None: left to the preset or the default
        if value is None:
            return "unset"
        return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    out = []
    for f in fields(Settings):
        if f.name == "base_eval_cache" or f.name not in old or f.name not in new or old[f.name] == new[f.name]:
            continue
        negative = f.metadata.get("negative_flag")
        if isinstance(new[f.name], bool) or isinstance(old[f.name], bool):
            # a switch: on, off, or unset (None: left to the preset); shared_policy False is
            # --separate-policies on
            flag = negative[0] if negative else setting_flag(f.name)

            def state(value) -> str:
                return "unset" if value is None else ("on" if bool(value) != bool(negative) else "off")

            out.append(f"{flag} {state(new[f.name])} (was {state(old[f.name])})")
        else:
            out.append(f"{setting_flag(f.name)} {shown(new[f.name])} (was {shown(old[f.name])})")
    effective_old, effective_new = record.get("effective"), st.jsonable(settings.preset_values())
    if isinstance(effective_old, dict):
        out += [f"the preset's {k} {shown(v)} (was {shown(effective_old[k])})"
                for k, v in effective_new.items() if k in effective_old and effective_old[k] != v and old.get(k) == new.get(k)]
    return out


def is_store(path: Path) -> bool:
    """A folder is a store when it has an experiment record or a round folder."""
    return path.is_dir() and ((path / EXPERIMENT_FILE).is_file() or any(path.glob("round=*")))


def complete_rounds(store: Path) -> list[int]:
    """The store's complete rounds (those with an `evaluation` table), from 0 up."""
    return sorted(
        int(p.parent.name.split("=", 1)[1])
        for p in store.glob("round=*/evaluation.parquet")
        if p.parent.name.split("=", 1)[1].lstrip("-").isdigit() and int(p.parent.name.split("=", 1)[1]) >= 0
    )
