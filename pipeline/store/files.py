"""Parquet files: written atomically and validated (`write_table`), read with errors that name
the file (`read_table`, `read_tables`, `check_table_file`), scanned across a store's rounds
(`scan_table`); and `jsonable`, what the store's JSON records are made of."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import DataError
from pipeline.store.atomic import atomic_write
from pipeline.store.paths import filesystem, is_url
from pipeline.store.url import write_bytes
from schemas import SchemaError, TableSchema, validate, validate_columns

__all__ = ["write_table", "read_table", "read_tables", "check_table_file", "scan_table", "jsonable"]


def write_table(
    data: pa.Table | pl.DataFrame | pl.LazyFrame,
    path: str | Path,
    schema: TableSchema | str | None = None,
    compression: str = "zstd",
) -> Path:
    """Validate `data` against `schema` (if given) and write it to `path` atomically: a local
    file through a temporary sibling, fsynced and renamed over `path` (`atomic_write`; on any
    error `path` is left as it was); on a URL, one object built in memory and written in one
    upload (`write_bytes`), which readers see whole or not at all."""
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if schema is not None:
        validate(data, schema)
    table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
    if is_url(path):
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression=compression)
        return write_bytes(str(path), sink.getvalue().to_pybytes())
    return atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression=compression))


# what Polars, pyarrow and the OS raise on a file that is not (or no longer) a Parquet file
_READ_ERRORS = (pl.exceptions.PolarsError, pa.ArrowException, OSError)


def _label(flag: str | None, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _unreadable(path: Path, flag: str | None, err: BaseException) -> DataError:
    reason = " ".join(str(err).split()) or type(err).__name__
    return DataError(f"{_label(flag, path)}: not a readable Parquet file (corrupt or truncated?): {reason}")


def check_table_file(path: str | Path, schema: TableSchema | str | None = None, flag: str | None = None) -> pa.Schema:
    """The Arrow schema of the Parquet file at `path`, read from its footer only (no rows).

    A missing file is a `FileNotFoundError`, a file that is not Parquet (or was cut short: its
    footer is at the end) a `DataError`, and with `schema` a missing or mistyped contract column
    a `SchemaError`; every message names the file (and `flag`, the option that gave it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{_label(flag, path)}: no such file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        arrow_schema = pq.read_schema(path)
    except _READ_ERRORS as err:
        raise _unreadable(path, flag, err) from None
    if schema is not None:
        validate_columns(arrow_schema, schema, source=_label(flag, path))
    return arrow_schema


def read_table(path: str | Path, schema: TableSchema | str | None = None, flag: str | None = None, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """Read a Parquet table into Polars, validating it when a schema is given. An unreadable
    file is a `DataError` and a table that breaks the contract a `SchemaError`, both naming the
    file (and `flag`, the option that gave it). `path` may be a URL (`filesystem`). With
    `columns`, only those are read (a column the file lacks is a `DataError` naming it and the
    file), and the schema check is left out: a part of a table is not the table."""
    cols = None if columns is None else list(columns)
    if is_url(path):
        fs, p = filesystem(str(path), flag)
        exists, read = fs.exists(p), lambda: pl.from_arrow(pq.read_table(p, filesystem=fs, columns=cols))
        names = lambda: pq.read_schema(p, filesystem=fs).names  # noqa: E731
    else:
        path = Path(path)
        exists, read = path.exists(), lambda: pl.read_parquet(path, columns=cols)
        names = lambda: pq.read_schema(path).names  # noqa: E731
    if not exists:
        raise FileNotFoundError(f"no table at {path}" if flag is None else f"{flag} {path}: no such file")
    if cols is not None:
        try:
            have = set(names())
        except _READ_ERRORS as err:
            raise _unreadable(path, flag, err) from None
        missing = [c for c in cols if c not in have]
        if missing:
            raise DataError(f"{_label(flag, Path(str(path)))}: no column {', '.join(map(repr, missing))}")
    try:
        df = read()
    except _READ_ERRORS as err:
        raise _unreadable(path, flag, err) from None
    if schema is not None and cols is None:
        try:
            validate(df, schema)
        except SchemaError as err:
            raise err.with_source(_label(flag, path)) from None
    return df


def read_tables(
    paths: list[str | Path], schema: TableSchema | str | None = None, flag: str | None = None, hive_partitioning: bool = False
) -> pl.DataFrame:
    """Several Parquet files as one Polars frame (e.g. every round's steps). Each file's footer
    is checked first (`check_table_file`: readable, and with `schema` the contract's columns and
    types), so a bad file is named before any rows are read; a file whose rows turn out
    unreadable is named too. Values (nulls, duplicate ids) are the caller's to check."""
    paths = [Path(p) for p in paths]
    for path in paths:
        check_table_file(path, schema, flag)
    try:
        return pl.scan_parquet([str(p) for p in paths], hive_partitioning=hive_partitioning).collect()
    except _READ_ERRORS as err:
        for path in paths:  # which file? (only on this error path: each is read on its own)
            try:
                pl.read_parquet(path)
            except _READ_ERRORS as file_err:
                raise _unreadable(path, flag, file_err) from None
        raise DataError(f"{flag or 'tables'} {', '.join(map(str, paths))}: cannot be read together: {' '.join(str(err).split())}") from None


def scan_table(store: str | Path, table: str) -> pl.LazyFrame:
    """All rounds of one table as one LazyFrame, with the `round` partition column (a Hive
    partition scan, locally with Polars, on a URL's filesystem with a pyarrow dataset)."""
    if is_url(store):
        import pyarrow.dataset as ds

        fs, base = filesystem(str(store))
        base = base.rstrip("/")
        files = sorted(f for f in fs.glob(f"{base}/round=*/{table}.parquet"))
        if not files:
            raise FileNotFoundError(f"no {table} table under {store}")
        in_file = "round" in pq.read_schema(files[0], filesystem=fs).names  # a column of most tables already
        partitioning = None if in_file else ds.partitioning(pa.schema([("round", pa.int64())]), flavor="hive")
        dataset = ds.dataset(files, filesystem=fs, format="parquet", partitioning=partitioning, partition_base_dir=base)
        return pl.from_arrow(dataset.to_table()).lazy()
    pattern = str(Path(store) / "round=*" / f"{table}.parquet")
    return pl.scan_parquet(pattern, hive_partitioning=True)


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
