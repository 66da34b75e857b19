"""A store's own Dagster instance, `<store>/.dagster/`: its folder and dagster.yaml (written from
the project's), and its sqlite storage opened after removing a database that a killed run left
half-created."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

log = logging.getLogger("maxit")

PROJECT_ROOT = Path(__file__).resolve().parents[1]

INSTANCE_DIR = ".dagster"
"""The folder of a store's Dagster instance, inside the store."""


def dagster_home(store: str | Path, path: str | Path | None = None) -> Path:
    """The Dagster instance folder of `store`: `<store>/.dagster/` (or `path`), holding the
    project's dagster.yaml (sqlite storage inside the folder, telemetry off, one run at a
    time), rewritten when the project's copy changes."""
    home = Path(path if path is not None else Path(store) / INSTANCE_DIR).resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    source = PROJECT_ROOT / "dagster.yaml"
    if source.exists() and (not target.exists() or target.read_bytes() != source.read_bytes()):
        shutil.copyfile(source, target)
    return home


SQLITE_STORAGES = ("history/runs.db", "history/runs/index.db", "schedules/schedules.db")
"""The instance's sqlite databases that Dagster creates once, when their file is missing."""
BOOKKEEPING = ("alembic_version", "secondary_indexes", "instance_info")
"""Tables Dagster fills while it creates a database: rows there are no runs or events."""


def instance_at(home: Path):
    import dagster as dg

    _drop_half_created(home)
    return dg.DagsterInstance.from_config(str(home))


def _drop_half_created(home: Path) -> None:
    """Remove a storage database that a killed run left half-created: Dagster creates its tables
    and then stamps the schema version, and opens an existing index database as it is, so a run
    killed between the two would leave every later run of the store failing on a missing table.
    Only an unstamped database without a row goes (the stamp comes before any run is recorded)."""
    for name in SQLITE_STORAGES:
        path = home / name
        if path.exists() and _unstamped_and_empty(path):
            log.warning("Dagster storage %s was left half-created by an interrupted run; creating it again", path)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def _unstamped_and_empty(path: Path) -> bool:
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            tables = [t for (t,) in conn.execute("select name from sqlite_master where type = 'table'")]
            if "alembic_version" in tables and conn.execute("select count(*) from alembic_version").fetchone()[0]:
                return False
            return not any(conn.execute(f'select 1 from "{t}" limit 1').fetchone() for t in tables if t not in BOOKKEEPING)
    except sqlite3.Error as e:  # a file that is no database goes; a busy or unreadable one stays
        return "not a database" in str(e)
