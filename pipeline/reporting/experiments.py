"""The experiments under some folders (`maxit runs`): each store found there, its complete rounds,
its last round's held-out numbers and the settings it changed from the defaults."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import polars as pl

from pipeline import store as st
from pipeline.run.experiment_record import complete_rounds, is_store, read_experiment
from pipeline.run.settings import Settings

__all__ = ["find_stores", "changed_settings", "experiments_table"]


def find_stores(roots: Iterable[str | Path], max_depth: int = 3) -> list[Path]:
    """Stores under `roots` (each root itself, or folders up to `max_depth` levels below it),
    sorted by path; a store's own sub-folders are not searched."""
    found: list[Path] = []

    def walk(path: Path, depth: int) -> None:
        if is_store(path):
            found.append(path)
            return
        if depth >= max_depth or not path.is_dir():
            return
        for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            walk(child, depth + 1)

    for root in roots:
        walk(Path(root), 0)
    return sorted(set(found))


def changed_settings(values: Mapping) -> str:
    """The settings that differ from `Settings()`'s defaults, as "name=value" pairs."""
    defaults = st.jsonable(Settings())
    changed = [f"{f.name}={values[f.name]}" for f in fields(Settings) if f.name in values and values[f.name] != defaults.get(f.name)]
    unknown = sorted(set(values) - set(defaults))  # settings of an older or newer maxit
    changed += [f"{k}={values[k]}" for k in unknown]
    return " ".join(changed) or "(defaults)"


def experiments_table(roots: Sequence[str | Path]) -> pl.DataFrame:
    """One row per store under `roots`: its complete rounds, the last one's held-out accuracy
    (math: the Solver's; other workflows: team success) and balanced verdict accuracy, when it last ran, and its settings (those that
    differ from the defaults)."""
    rows = []
    for store in find_stores(roots):
        rec = read_experiment(store) or {}
        done = complete_rounds(store)
        last = done[-1] if done else None
        acc = bal = None
        if last is not None:
            ev = st.Tables(store).read(last, "evaluation")
            get = lambda m: ev.filter(pl.col("metric") == m)["value"]  # noqa: E731
            acc = next((float(get(m)[0]) for m in ("accuracy", "success") if get(m).len()), None)
            bal = float(get("verdict_balanced_accuracy")[0]) if get("verdict_balanced_accuracy").len() else None
        rows.append(
            {
                "store": str(store),
                "rounds": len(done),
                "last_round": last,
                "heldout": acc,
                "verifier_bal_acc": bal,
                "updated": rec.get("updated", ""),
                "engine": rec.get("engine", ""),
                "settings": changed_settings(rec["settings"]) if "settings" in rec else "(no experiment.json)",
            }
        )
    schema = {"store": pl.String, "rounds": pl.Int64, "last_round": pl.Int64, "heldout": pl.Float64, "verifier_bal_acc": pl.Float64,
              "updated": pl.String, "engine": pl.String, "settings": pl.String}
    return pl.DataFrame(rows, schema=schema)
