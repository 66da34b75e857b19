"""Where tables and checkpoints live, and atomic writes.

Layout: `<store>/round=<r>/<table>.parquet` (Hive-style, so Polars' and DuckDB's
`hive_partitioning` see every round), checkpoints under `<store>/checkpoints/`.
Every write goes to a temporary sibling first and is renamed into place, so a reader (or a
resumed run after a kill -9) sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from schemas import TableSchema, validate

__all__ = [
    "round_dir",
    "table_path",
    "write_table",
    "read_table",
    "scan_table",
    "atomic_dir",
    "atomic_write_text",
    "fsync_dir",
    "checkpoint_dir",
    "jsonable",
]


def round_dir(store: str | Path, round_: int) -> Path:
    return Path(store) / f"round={int(round_)}"


def table_path(store: str | Path, round_: int, table: str) -> Path:
    return round_dir(store, round_) / f"{table}.parquet"


def checkpoint_dir(store: str | Path, round_: int, policy_id: str) -> Path:
    """The folder of the checkpoint trained for `policy_id` in `round_`."""
    return Path(store) / "checkpoints" / f"round={int(round_)}" / policy_id


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_table(
    data: pa.Table | pl.DataFrame | pl.LazyFrame,
    path: str | Path,
    schema: TableSchema | str | None = None,
    compression: str = "zstd",
) -> Path:
    """Validate `data` against `schema` (if given) and write it to `path` atomically.

    The data is written to `<path>.tmp-<random>` in the same folder, fsynced, then renamed over
    `path`. On any error the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if schema is not None:
        validate(data, schema)
    table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, _mode(0o666))  # mkstemp makes it owner-only; a table is as readable as any file
        pq.write_table(table, tmp, compression=compression)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def read_table(path: str | Path, schema: TableSchema | str | None = None) -> pl.DataFrame:
    """Read a Parquet table into Polars, validating it when a schema is given."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no table at {path}")
    df = pl.read_parquet(path)
    if schema is not None:
        validate(df, schema)
    return df


def scan_table(store: str | Path, table: str) -> pl.LazyFrame:
    """All rounds of one table as one LazyFrame, with the `round` partition column."""
    pattern = str(Path(store) / "round=*" / f"{table}.parquet")
    return pl.scan_parquet(pattern, hive_partitioning=True)


def _mode(base: int) -> int:
    """`base` as the process umask lets a new file or directory have it."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Build a directory atomically: yields a temporary sibling to fill; on success it replaces
    `path` (an existing `path` is moved aside first and removed after), on error it is deleted
    and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        os.chmod(tmp, _mode(0o777))  # mkdtemp makes it owner-only
        yield tmp
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the previous directory back
                os.replace(old, path)
            raise
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.chmod(tmp, _mode(0o666))
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def jsonable(obj: Any) -> Any:
    """`obj` as plain JSON values: dataclass instances become dicts of their fields, mappings
    dicts with string keys, lists and tuples lists, paths strings, and a non-finite float None
    (strict JSON has no NaN or Infinity); anything else is returned as it is."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
