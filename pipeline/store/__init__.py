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
import fcntl
import glob
import logging
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

log = logging.getLogger(__name__)

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
    "fetch_dir",
    "write_bytes",
    "cache_root",
    "canonical_url",
    "working_copy",
    "check_store_url",
    "UrlStore",
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
    from fsspec.registry import registry

    if not scheme or (scheme not in known_implementations and scheme not in registry):
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


def write_bytes(url: str, body: bytes) -> str:
    """`body` as the object (file) at `url`, all or nothing: one `open(..., "wb")` whose close
    commits it (one PUT or completed multipart upload on s3/gs, a file committed on close on
    fsspec's memory filesystem); on the local filesystem (`file://`) a temporary sibling, fsync
    and rename."""
    fs, p = filesystem(url)
    if any(proto in LOCAL_PROTOCOLS for proto in _protocols(fs)):
        atomic_write_bytes(p, body)
        return url
    parent = p.rsplit("/", 1)[0]
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(p, "wb") as fh:
        fh.write(body)
    return url


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
    return write_bytes(url, sink.getvalue().to_pybytes())


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


def clear_dead_builds(path: str | Path) -> list[Path]:
    """Remove what `atomic_dir(path)` leaves when its process is killed before it can clean up
    (SIGKILL, the OOM killer: a model build, a checkpoint). A build holds an exclusive `flock` on
    its `<tmp>.lock` file from before that file has its name until the build ends, and the kernel
    drops the lock with the process, so a lock that can be taken is a dead build's: its
    temporary folder is removed, and the previous `path` it moved aside (`<tmp>.old`) too once
    `path` exists again. A `<tmp>.old` while `path` is missing is the only whole copy (the build
    died between its two renames): it is kept, for a person to move back; the sweep never writes
    `path`, so it cannot collide with a live build's swap. A live build's lock cannot be taken,
    whatever host or container runs it, so its folders are left alone; so are temporary folders
    without a lock file (a build killed before it made one, or an older maxit). Returns the
    temporary folders removed."""
    path = Path(path)
    removed = []
    for lock in path.parent.glob(f".{glob.escape(path.name)}.tmp-*.lock"):
        stem = lock.with_name(lock.name[: -len(".lock")])
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:  # its build just ended
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino != os.stat(lock).st_ino:  # unlinked by its build as it ended
                    continue
            except OSError:  # a live build (or the file went away)
                continue
            old = stem.with_name(stem.name + ".old")
            if stem.exists():
                shutil.rmtree(stem, ignore_errors=True)
                removed.append(stem)
            if old.is_dir() and not path.exists():  # the lock stays: the next sweep removes `old` once `path` is back
                log.warning("%s: a build died between its two renames; the previous %s is kept at %s", path, path.name, old)
            else:
                shutil.rmtree(old, ignore_errors=True)
                lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return removed


def _lock_build(tmp: Path) -> int | None:
    """Take the build's lock (`clear_dead_builds`): made under a name the sweep does not match,
    locked, then renamed, so no sweep ever sees it unlocked. None where the filesystem has no
    `flock` (the build then runs unmarked, as before locks)."""
    staging = tmp.with_name(tmp.name + ".lock.new")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, tmp.with_name(tmp.name + ".lock"))
        return fd
    except OSError:
        os.close(fd)
        staging.unlink(missing_ok=True)
        return None


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Build a directory atomically: yields a temporary sibling to fill; on success it replaces
    `path` (an existing `path` is moved aside first and removed after), on error it is deleted
    and `path` is untouched. The build holds a lock on `<tmp>.lock` while it runs, so a later
    `atomic_dir` of the same path removes what a killed one left (`clear_dead_builds`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_dead_builds(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    lock = tmp.with_name(tmp.name + ".lock")
    fd = _lock_build(tmp)
    try:
        os.chmod(tmp, _mode(0o777))  # mkdtemp makes it owner-only
        yield tmp
        old = None
        if path.exists():
            old = tmp.with_name(tmp.name + ".old")
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
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)  # before the lock goes: a sweep that opened it sees another inode or none
            os.close(fd)


def upload_dir(local: str | Path, url: str, marker: str = "maxit_checkpoint.json") -> str:
    """Copy the folder `local` to `url` file by file, `marker` (the checkpoint's own record) last,
    so a reader that finds the marker finds every other file. An object store has no folder
    rename: an interrupted upload leaves files without the marker, which `local_copy` refuses.
    A folder already at `url` (an earlier upload) is deleted first, its marker before its other
    files, so no reader sees the old marker beside new files.
    A local `url` (a path, or a `file://` URL) is written with `atomic_dir` instead."""
    local = Path(local)
    fs, base = filesystem(url) if is_url(url) else (None, str(url))
    if fs is None or any(p in LOCAL_PROTOCOLS for p in _protocols(fs)):
        with atomic_dir(base) as tmp:
            shutil.copytree(local, tmp, dirs_exist_ok=True)
        return str(url)
    base = base.rstrip("/")
    if fs.exists(base):  # an earlier upload: it stops being a checkpoint (marker first), then goes
        if fs.exists(f"{base}/{marker}"):
            fs.rm(f"{base}/{marker}")
        fs.rm(base, recursive=True)
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
    atomically, reused while its marker file matches the URL's). With `marker`, a folder without
    it (an upload still under way or interrupted) is a `DataError`."""
    if not is_url(url):
        return Path(url)
    import hashlib

    target = Path(cache) / hashlib.blake2b(str(url).encode(), digest_size=8).hexdigest()
    return fetch_dir(str(url), target, marker)


def fetch_dir(url: str, target: str | Path, marker: str | None = "maxit_checkpoint.json") -> Path:
    """Download the folder at `url` to the local folder `target`, atomically (`atomic_dir`), and
    return `target`. A `target` that already holds it is kept: with `marker`, when its marker file
    has the same bytes as the URL's (a checkpoint records its creation time there); without, when
    it exists. With `marker`, a folder at `url` without it (an upload still under way or
    interrupted) is a `DataError`."""
    fs, base = filesystem(str(url))
    base = base.rstrip("/")
    target = Path(target)
    if marker is not None:
        try:
            remote_marker = fs.cat_file(f"{base}/{marker}")
        except FileNotFoundError:
            raise DataError(f"{url}: no {marker}: not a complete checkpoint (an upload still under way or interrupted?)") from None
        local_marker = target / marker
        if local_marker.is_file() and local_marker.read_bytes() == remote_marker:
            return target
    elif target.is_dir():
        return target
    with atomic_dir(target) as tmp:
        for f in fs.find(base):
            rel = f[len(base) :].lstrip("/")
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with fs.open(f, "rb") as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst)
        if marker is not None and (tmp / marker).read_bytes() != remote_marker:
            raise DataError(f"{url}: the checkpoint changed while it was downloaded (re-uploaded by another run?); try again")
    return target


def atomic_write_bytes(path: str | Path, body: bytes) -> Path:
    """`body` as the local file `path`, all or nothing: a temporary sibling, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.chmod(tmp, _mode(0o666))
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`text` (UTF-8) as the local file `path`, all or nothing."""
    return atomic_write_bytes(path, text.encode("utf-8"))


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


# -- a URL store and its local working copy ---------------------------------------------------
#
# `maxit run --store s3://bucket/run` keeps the URL as the store of record and works in a local
# folder (the engines and the trainer load local model folders; the Dagster instance is local):
# each stage writes its tables locally as on a local store, then `UrlStore.push` uploads every
# table that changed, one object per table, the round's `evaluation` table (its completion
# marker) last; checkpoints and registry entries go through `PolicyRegistry` (files first,
# `maxit_checkpoint.json` last, the entry after it). `UrlStore.pull` makes the working copy hold
# what the URL holds, so a run resumed on a fresh machine (an empty working copy) finds its
# complete rounds there; checkpoints are fetched when a round needs them.

SYNC_MANIFEST = ".maxit-sync.json"
"""In a working copy: what was last uploaded or downloaded, per file (local size and mtime, the
object's fingerprint), so unchanged tables are neither uploaded nor downloaded again."""

LOCAL_PROTOCOLS = ("file", "local")


def cache_root() -> Path:
    """The project's cache: $MAXIT_CACHE_DIR, else ./.cache/maxit (the rule of
    `pipeline.models.default_cache_dir`, repeated here so the store does not import the models)."""
    return Path(os.environ.get("MAXIT_CACHE_DIR") or Path.cwd() / ".cache" / "maxit").resolve()


def canonical_url(url: str) -> str:
    """`url` with its scheme, one form per store (no trailing slash, `file://` paths absolute)."""
    scheme, rest = str(url).split("://", 1)
    rest = rest.rstrip("/")
    if scheme in LOCAL_PROTOCOLS:
        rest = str(Path("/" + rest.lstrip("/")).resolve())
    return f"{scheme}://{rest}"


def working_copy(url: str) -> Path:
    """The local working copy of the URL store `url`: `<cache>/stores/<scheme>-<name>-<hash>`,
    one folder per store (the hash of the canonical URL; the name for people)."""
    import hashlib
    import re

    url = canonical_url(url)
    scheme, rest = url.split("://", 1)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", rest.strip("/"))[-40:].strip("_.") or "root"
    digest = hashlib.blake2b(url.encode(), digest_size=6).hexdigest()
    return cache_root() / "stores" / f"{scheme}-{name}-{digest}"


def _protocols(fs) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def check_store_url(url: str, flag: str = "--store") -> None:
    """Before any work: the URL store can be used, without writing anything. Its scheme must be
    known and its package installed (`filesystem`), its bucket must exist (object stores:
    s3fs, gcsfs, adlfs name it `split_path`), the filesystem must answer, and the store must not
    be a file. Every failure is a `ConfigError` naming `flag` and the URL."""
    fs, path = filesystem(url, flag)
    label = f"{flag} {url}"
    try:
        split = getattr(fs, "split_path", None)
        if split is not None:
            bucket = split(path)[0]
            if not bucket:
                raise ConfigError(f"{label}: no bucket in the URL (give scheme://bucket/folder)")
            if not fs.exists(bucket):
                raise ConfigError(f"{label}: bucket {bucket!r} does not exist (or these credentials cannot see it)")
        if "memory" in _protocols(fs) and path.strip("/") == "":
            raise ConfigError(f"{label}: give a folder (memory://name), not the filesystem's root")
        if fs.exists(path) and not fs.isdir(path):
            raise ConfigError(f"{label}: is an existing file, not a folder")
    except ConfigError:
        raise
    except Exception as err:  # network, credentials, permissions: the filesystem's own error
        reason = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"{label}: cannot be reached ({type(err).__name__}: {reason})") from None
    if any(p in LOCAL_PROTOCOLS for p in _protocols(fs)):
        check_writable(path, flag, "folder")


def _fingerprint(info: Mapping) -> str:
    """What identifies one version of an object in a listing: its size and whichever of the
    filesystem's version fields it reports (ETag, generation, modification times)."""
    import datetime as _dt

    parts = []
    for key in ("size", "ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, _dt.datetime):
            value = value.timestamp()
        parts.append(f"{key}={value}")
    return ";".join(parts)


def _synced(rel: str) -> bool:
    """Whether a path relative to the store is one of the files `UrlStore` mirrors: the round
    tables (`round=<r>/<table>.parquet`, and a shard's tables below `round=<r>/shards/`) and the
    experiment record; not temporary files, checkpoints (the registry's) or logs."""
    parts = rel.split("/")
    if any(p.startswith(".") for p in parts):
        return False
    if rel == "experiment.json":
        return True
    return parts[0].startswith("round=") and parts[-1].endswith(".parquet")


class UrlStore:
    """A store at a URL (the store of record) with its local working copy (`working_copy`)."""

    def __init__(self, url: str, local: str | Path | None = None):
        self.url = canonical_url(url)
        self.fs, base = filesystem(self.url)
        self.base = base.rstrip("/")
        self.local = Path(local) if local is not None else working_copy(self.url)

    def __repr__(self) -> str:
        return f"UrlStore({self.url!r}, local={str(self.local)!r})"

    # -- the manifest ------------------------------------------------------------------------
    def _manifest(self) -> dict:
        import json

        try:
            return json.loads((self.local / SYNC_MANIFEST).read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _save_manifest(self, manifest: dict) -> None:
        import json

        atomic_write_text(self.local / SYNC_MANIFEST, json.dumps(manifest, sort_keys=True))

    def _remote_files(self) -> dict[str, Mapping]:
        """rel path -> listing entry of every mirrored object under the URL."""
        if not self.fs.exists(self.base):
            return {}
        out = {}
        for name, info in self.fs.find(self.base, detail=True).items():
            rel = name[len(self.base) :].lstrip("/")
            if info.get("type", "file") == "file" and _synced(rel):
                out[rel] = info
        return out

    @staticmethod
    def _stat(path: Path) -> list[int] | None:
        try:
            s = path.stat()
        except FileNotFoundError:
            return None
        return [s.st_size, s.st_mtime_ns]

    # -- down -------------------------------------------------------------------------------
    def pull(self, reconcile: bool = False) -> dict[str, int]:
        """Download to the working copy every mirrored object it lacks or holds another version
        of. With `reconcile`, also delete the working copy's round tables the URL does not hold
        (left by a run that stopped before uploading them): afterwards the working copy's tables
        are the URL's. Returns counts ("downloaded", "deleted", "kept")."""
        remote = self._remote_files()
        manifest = self._manifest()
        counts = {"downloaded": 0, "deleted": 0, "kept": 0}
        for rel, info in sorted(remote.items()):
            local = self.local / rel
            fp = _fingerprint(info)
            entry = manifest.get(rel)
            if entry and entry.get("remote") == fp and entry.get("local") == self._stat(local):
                counts["kept"] += 1
                continue
            local.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{local.name}.tmp-", dir=local.parent)
            os.close(fd)
            try:
                with self.fs.open(f"{self.base}/{rel}", "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.chmod(tmp, _mode(0o666))
                os.replace(tmp, local)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            manifest[rel] = {"remote": fp, "local": self._stat(local)}
            counts["downloaded"] += 1
        if reconcile and self.local.is_dir():
            for path in sorted(self.local.glob("round=*/**/*.parquet")):
                rel = path.relative_to(self.local).as_posix()
                if _synced(rel) and rel not in remote:
                    path.unlink()
                    manifest.pop(rel, None)
                    counts["deleted"] += 1
        if counts["downloaded"] or counts["deleted"]:
            self._save_manifest(manifest)
        return counts

    # -- up ---------------------------------------------------------------------------------
    def _put(self, local: Path, rel: str) -> None:
        """One object, written in one upload (a local URL: temporary sibling and rename)."""
        write_bytes(f"{self.url}/{rel}", local.read_bytes())

    def push(self, rounds: list[int] | None = None, files: list[str] = ()) -> list[str]:
        """Upload the working copy's mirrored files that changed since they were last uploaded or
        downloaded: the tables of `rounds` (every round when None) and `files` (paths relative
        to the store). Each is one object in one upload; `evaluation.parquet`, a round's
        completion marker, goes after every other table (round -1's before round r's), so a
        round the URL holds as complete has every table. Returns the uploaded paths."""
        manifest = self._manifest()
        candidates = [self.local / f for f in files]
        if self.local.is_dir():
            if rounds is None:
                candidates += sorted(self.local.glob("round=*/**/*.parquet"))
            else:
                for r in rounds:
                    candidates += sorted((self.local / f"round={int(r)}").glob("**/*.parquet"))

        def order(path: Path):
            rel = path.relative_to(self.local).as_posix()
            r = int(rel.split("/", 1)[0].split("=", 1)[1]) if rel.startswith("round=") else -2
            return (path.name == "evaluation.parquet", r, rel)

        uploaded = []
        for path in sorted(set(candidates), key=order):
            rel = path.relative_to(self.local).as_posix()
            stat = self._stat(path)
            if stat is None or not _synced(rel):
                continue
            entry = manifest.get(rel)
            if entry and entry.get("local") == stat:
                continue
            self._put(path, rel)
            manifest[rel] = {"remote": _fingerprint(self.fs.info(f"{self.base}/{rel}")), "local": stat}
            uploaded.append(rel)
        if uploaded:
            self._save_manifest(manifest)
        return uploaded

    def remove(self, rel: str) -> None:
        """Delete a folder or file of the store, at the URL and in the working copy (a round's
        shard files once they are merged)."""
        target = f"{self.base}/{rel.strip('/')}"
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)
        local = self.local / rel
        if local.is_dir():
            shutil.rmtree(local, ignore_errors=True)
        elif local.exists():
            local.unlink()
        manifest = self._manifest()
        gone = [k for k in manifest if k == rel or k.startswith(rel.rstrip("/") + "/")]
        for k in gone:
            manifest.pop(k)
        if gone:
            self._save_manifest(manifest)
