"""The round tables of one store, and their one owner.

`Tables` does for maxit's tables what a Dagster IO manager does for an asset's output: it knows
where each table of each round lives (`<store>/round=<r>/<table>.parquet`), writes it atomically
after checking it against its schema (and that its rows are the round's), reads it back, scans
it across rounds, says whether it exists, keeps a URL store's working copy and the URL in step
(`pull`, `publish`), and gives the metadata an asset reports (`info`: where, how many rows). The
stages, the Dagster assets, the CLI and the report reach tables only through it, so each table
is written once per round by the stage that makes it, and no one assembles a table's path by hand.

A stage split over processes (the rollouts of several shards) writes its parts with `part=`
(`<store>/round=<r>/shards/shard=<k>/<table>.parquet`, outside the round's Hive layout, so no
scan of the store sees them); whoever merges them writes the round's table once and removes the
parts (`remove_parts`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import polars as pl

from pipeline.errors import DataError
from pipeline.store.files import check_table_file, read_table, scan_table, write_table
from pipeline.store.paths import BASE_ROUND, is_url, round_dir, table_path
from pipeline.store.url import UrlStore, check_store_url
from schemas import SCHEMAS, to_arrow

__all__ = ["Tables", "TableInfo", "MIXED_ROUND_TABLES", "PARTS_DIR"]

MIXED_ROUND_TABLES = frozenset({"training_view"})
"""Tables whose rows may come from other rounds than the one they are stored under (a training
view replays a checking agent's rows of earlier rounds); in every other table with a `round`
column each row must be of its round."""

PARTS_DIR = "shards"
"""`<store>/round=<r>/shards/shard=<k>/`: the parts of a round's tables written by its shards."""


@dataclass(frozen=True)
class TableInfo:
    """What an asset reports of a table it wrote: where it is kept and how many rows it has."""

    path: str
    """The table's file, or its object's URL on a URL store."""
    rows: int


class Tables:
    """The tables of the store at `store`: a folder, or the URL of a store on an fsspec filesystem
    (`s3://bucket/run`, `memory://run`), whose tables are then read and written in its local
    working copy (`root`) and uploaded by `publish`."""

    def __init__(self, store: str | Path):
        self.url = UrlStore(str(store)) if is_url(store) else None
        self.location: str | Path = self.url.url if self.url is not None else Path(store)
        """The store of record: its folder, or its URL."""
        self.root: Path = self.url.local if self.url is not None else Path(store)
        """The folder the tables are read and written in: the store, or a URL store's working copy."""

    def __repr__(self) -> str:
        return f"Tables({str(self.location)!r})"

    # -- where ------------------------------------------------------------------------------
    def path(self, round_: int, table: str, part: int | None = None) -> Path:
        """The local file of round `round_`'s `table` (or of its part `part`)."""
        if part is None:
            return table_path(self.root, round_, table)
        return round_dir(self.root, round_) / PARTS_DIR / f"shard={int(part)}" / f"{table}.parquet"

    def location_of(self, round_: int, table: str) -> str:
        """Where round `round_`'s `table` is kept: its file, or its URL on a URL store."""
        return str(table_path(self.location, round_, table))

    def exists(self, round_: int, table: str) -> bool:
        return self.path(round_, table).exists()

    def info(self, round_: int, table: str, rows: int) -> TableInfo:
        return TableInfo(self.location_of(round_, table), int(rows))

    # -- reading ----------------------------------------------------------------------------
    def read(self, round_: int, table: str, *, validate: bool = False, columns: Sequence[str] | None = None) -> pl.DataFrame:
        """Round `round_`'s `table`; with `validate`, checked against its schema; with `columns`,
        only those (a column the file lacks is an error naming it). A missing or unreadable file,
        and a table that breaks its contract, are errors naming the file."""
        return read_table(self.path(round_, table), table if validate and table in SCHEMAS else None, columns=columns)

    def columns(self, round_: int, table: str) -> list[str]:
        """The column names of round `round_`'s `table`, read from its footer (no rows): a table
        written before a column existed lacks it."""
        return list(check_table_file(self.path(round_, table)).names)

    def scan(self, table: str) -> pl.LazyFrame:
        """Every round's `table` as one LazyFrame, with the `round` partition column."""
        return scan_table(self.root, table)

    def has_any(self, table: str) -> bool:
        """Whether any round of the store has `table`."""
        return any(self.root.glob(f"round=*/{table}.parquet"))

    def read_parts(self, round_: int, table: str) -> list[pl.DataFrame]:
        """The parts of round `round_`'s `table` its shards wrote, in shard order, each checked
        against the table's schema."""
        folder = round_dir(self.root, round_) / PARTS_DIR
        paths = sorted(folder.glob(f"shard=*/{table}.parquet"), key=lambda p: int(p.parent.name.split("=", 1)[1]))
        return [read_table(p, table if table in SCHEMAS else None) for p in paths]

    # -- writing ----------------------------------------------------------------------------
    def write(self, round_: int, table: str, data, *, part: int | None = None) -> TableInfo:
        """Write round `round_`'s `table` (or its part `part`) atomically, after checking it
        against the table's schema (`schemas.SCHEMAS`) and, outside `MIXED_ROUND_TABLES`, that
        every row is of round `round_`. A table that fails either check is not written."""
        data = to_arrow(data)
        if table not in MIXED_ROUND_TABLES and "round" in data.column_names and data.num_rows:
            rounds = set(data.column("round").unique().to_pylist())
            if rounds - {int(round_)}:
                raise DataError(f"table {table!r} of round {round_}: holds rows of round(s) {sorted(rounds)}")
        write_table(data, self.path(round_, table, part), SCHEMAS.get(table))
        return self.info(round_, table, data.num_rows)

    def remove(self, round_: int, table: str) -> None:
        """Delete round `round_`'s `table`, at the URL too (a round made incomplete again)."""
        if self.url is not None:
            self.url.remove(f"round={int(round_)}/{table}.parquet")
        self.path(round_, table).unlink(missing_ok=True)

    def remove_parts(self, round_: int) -> None:
        """Delete the parts of round `round_`'s tables (merged, or left by a crashed attempt)."""
        rel = f"round={int(round_)}/{PARTS_DIR}"
        if self.url is not None:
            self.url.remove(rel)
        else:
            shutil.rmtree(self.root / rel, ignore_errors=True)

    def remove_temporary(self, round_: int) -> list[Path]:
        """Delete the temporary files a process killed mid-write left in round `round_`'s folder."""
        stale = sorted(round_dir(self.root, round_).glob(".*.tmp-*"))
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return stale

    # -- a URL store ------------------------------------------------------------------------
    def check(self, flag: str = "--store") -> None:
        """A URL store: usable (scheme, package, bucket, reachable), nothing written."""
        if self.url is not None:
            check_store_url(self.url.url, flag)

    def pull(self, reconcile: bool = False) -> None:
        """A URL store: download the tables the working copy lacks or holds another version of
        (with `reconcile`, also drop the tables the URL does not hold)."""
        if self.url is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.url.pull(reconcile=reconcile)

    def publish(self, *rounds: int, files: tuple[str, ...] = ()) -> list[str]:
        """A URL store: upload what changed of the tables of `rounds` and of round -1 (the
        starting checkpoints' evaluation), and `files` (paths relative to the store); a round's
        `evaluation` table, its completion marker, last. Returns the paths uploaded."""
        if self.url is None:
            return []
        return self.url.push(sorted({BASE_ROUND, *map(int, rounds)}) if rounds else [], files=list(files))

