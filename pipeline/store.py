"""Where tables and checkpoints live, and atomic writes.

Layout: `<store>/round=<r>/<table>.parquet` (Hive-style, so Polars' and DuckDB's
`hive_partitioning` see every round), checkpoints under `<store>/checkpoints/`.
Every write goes to a temporary sibling first and is renamed into place, so a reader (or a
resumed run after a kill -9) sees the old file or the new one, never half of one.

A store may also be a URL of an fsspec filesystem (`s3://bucket/run`, `gs://bucket/run`,
`memory://run`; `file://` is the local filesystem): `table_path` and friends then return URL
strings, `write_table` writes each table as one object in one upload (atomic on s3 and gs, whose
PUT or completed multipart upload is seen whole or not at all, and on fsspec's memory filesystem,
which commits a file on close; there is no rename to make it so elsewhere), `read_table` and
`scan_table` read through the filesystem (`scan_table`: a Hive-partitioned pyarrow dataset), and
checkpoints are uploaded file by file with their marker file last (`upload_dir`) and read
through a local cache copy (`local_copy`), since the engines and the trainer load local folders.
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

from pipeline.errors import ConfigError, DataError
from schemas import SchemaError, TableSchema, validate, validate_columns

__all__ = [
    "round_dir",
    "table_path",
    "write_table",
    "read_table",
    "read_tables",
    "check_table_file",
    "check_writable",
    "scan_table",
    "atomic_dir",
    "atomic_write_text",
    "fsync_dir",
    "checkpoint_dir",
    "jsonable",
    "is_url",
    "filesystem",
    "exists",
    "upload_dir",
    "local_copy",
]


def is_url(path: str | Path) -> bool:
    """True for a URL of an fsspec filesystem (`scheme://...`); local paths are not URLs."""
    return isinstance(path, str) and "://" in path


def filesystem(url: str, flag: str | None = None):
    """(fsspec filesystem, path inside it) of `url`. An unknown scheme, or one whose package is
    not installed (s3fs for s3://, gcsfs for gs://), is a `ConfigError` naming `flag` and the URL."""
    import fsspec
    from fsspec.registry import known_implementations

    scheme = url.split("://", 1)[0]
    label = f"{flag} {url}" if flag else url
    if not scheme or scheme not in known_implementations:
        raise ConfigError(f"{label}: unknown filesystem scheme {scheme!r} (e.g. file, memory, s3, gs)")
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as err:
        raise ConfigError(f"{label}: the {scheme!r} filesystem needs a package that is not installed ({err})") from None


def _join(base: str | Path, *parts: str) -> str | Path:
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *parts])
    return Path(base).joinpath(*parts)


def exists(path: str | Path) -> bool:
    """Whether a table or folder exists, locally or on the URL's filesystem."""
    if is_url(path):
        fs, p = filesystem(path)
        return fs.exists(p)
    return Path(path).exists()


def round_dir(store: str | Path, round_: int) -> Path:
    """`<store>/round=<r>` (a URL string when the store is a URL)."""
    return _join(store, f"round={int(round_)}")


def table_path(store: str | Path, round_: int, table: str) -> Path:
    return _join(round_dir(store, round_), f"{table}.parquet")


def checkpoint_dir(store: str | Path, round_: int, policy_id: str) -> Path:
    """The folder of the checkpoint trained for `policy_id` in `round_`."""
    return _join(store, "checkpoints", f"round={int(round_)}", policy_id)


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
    if isinstance(data, pl.LazyFrame):
        data = data.collect()
    if schema is not None:
        validate(data, schema)
    table = data.to_arrow() if isinstance(data, pl.DataFrame) else data
    if is_url(path):
        return _write_table_url(table, str(path), compression)
    path = Path(path)
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


def _write_table_url(table: pa.Table, url: str, compression: str) -> str:
    """One object written in one upload: the Parquet file is built in memory, then written with a
    single `open(..., "wb")` whose close commits it (a PUT or a completed multipart upload on
    s3/gs: readers see the old object or the new one)."""
    fs, p = filesystem(url)
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:  # the local filesystem: temporary sibling, fsync, rename
        return str(write_table(table, p, compression=compression))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    body = sink.getvalue().to_pybytes()
    parent = p.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(p, "wb") as fh:
        fh.write(body)
    return url


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


def read_table(path: str | Path, schema: TableSchema | str | None = None, flag: str | None = None) -> pl.DataFrame:
    """Read a Parquet table into Polars, validating it when a schema is given. An unreadable
    file is a `DataError` and a table that breaks the contract a `SchemaError`, both naming the
    file (and `flag`, the option that gave it). `path` may be a URL (`filesystem`)."""
    if is_url(path):
        fs, p = filesystem(str(path), flag)
        exists, read = fs.exists(p), lambda: pl.from_arrow(pq.read_table(p, filesystem=fs))
    else:
        path = Path(path)
        exists, read = path.exists(), lambda: pl.read_parquet(path)
    if not exists:
        raise FileNotFoundError(f"no table at {path}" if flag is None else f"{flag} {path}: no such file")
    try:
        df = read()
    except _READ_ERRORS as err:
        raise _unreadable(path, flag, err) from None
    if schema is not None:
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


def check_writable(path: str | Path, flag: str, kind: str = "file") -> Path:
    """Check, before any work, that `path` can be written, without writing anything. `kind`:
    "file" (a table or report written atomically beside it), "folder" (a store: entries are
    added inside it) or "atomic folder" (a checkpoint: built beside it and renamed into place).
    `path` must not be the other kind of entry, and the folder the new entries go in (or its
    nearest existing ancestor, when it is still to be created) must be a writable folder.
    Raises `ConfigError` naming `flag` and the path."""
    path = Path(path)
    if kind not in ("file", "folder", "atomic folder"):
        raise ValueError(f"kind must be 'file', 'folder' or 'atomic folder', got {kind!r}")
    if kind == "file" and path.is_dir():
        raise ConfigError(f"{flag} {path}: is a folder; give the path of a file")
    if kind != "file" and path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path}: is an existing file, not a folder")
    parent = path if kind == "folder" and path.exists() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: cannot be created, {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot be written, folder {parent} is not writable")
    return path


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


def upload_dir(local: str | Path, url: str, marker: str = "maxit_checkpoint.json") -> str:
    """Copy the folder `local` to `url` file by file, `marker` (the checkpoint's own record) last,
    so a reader that finds the marker finds every other file. An object store has no folder
    rename: an interrupted upload leaves files without the marker, which `local_copy` refuses.
    A local `url` is written with `atomic_dir` instead."""
    local = Path(local)
    if not is_url(url):
        with atomic_dir(url) as tmp:
            shutil.copytree(local, tmp, dirs_exist_ok=True)
        return str(url)
    fs, base = filesystem(url)
    base = base.rstrip("/")
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == marker)  # the marker last
    for f in files:
        target = f"{base}/{f.relative_to(local).as_posix()}"
        parent = target.rsplit("/", 1)[0]
        fs.makedirs(parent, exist_ok=True)
        with open(f, "rb") as src, fs.open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return url


def local_copy(url: str | Path, cache: str | Path, marker: str | None = "maxit_checkpoint.json") -> Path:
    """A local folder holding the folder at `url` (the engines and the trainer load local
    folders): `url` itself when it is local, else a copy under `cache` (one folder per URL, made
    atomically, reused once complete). With `marker`, a folder without it (an upload still under
    way or interrupted) is a `DataError`."""
    if not is_url(url):
        return Path(url)
    import hashlib

    fs, base = filesystem(str(url))
    base = base.rstrip("/")
    if marker is not None and not fs.exists(f"{base}/{marker}"):
        raise DataError(f"{url}: no {marker}: not a complete checkpoint (an upload still under way or interrupted?)")
    target = Path(cache) / hashlib.blake2b(str(url).encode(), digest_size=8).hexdigest()
    if target.is_dir():
        return target
    with atomic_dir(target) as tmp:
        for f in fs.find(base):
            rel = f[len(base) :].lstrip("/")
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with fs.open(f, "rb") as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return target


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
