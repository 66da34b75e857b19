"""Where tables and checkpoints live, and writes a reader sees whole or not at all.

Layout: `<store>/round=<r>/<table>.parquet` (Hive-style, so Polars' and DuckDB's
`hive_partitioning` see every round), checkpoints under `<store>/checkpoints/`. A store may be a
URL of an fsspec filesystem (`s3://bucket/run`, `gs://bucket/run`, `memory://run`).

- `tables.py`: `Tables`, the one owner of a store's round tables (read, write atomically and
  validated, scan across rounds, pull/publish for URL stores, what an asset reports);
- `paths.py`: where things are (`table_path`, `checkpoint_dir`, `cache_root`, URLs);
- `atomic.py`: whole-or-nothing files and folders (`atomic_write`, `atomic_dir`);
- `files.py`: Parquet files read and written with errors naming the file;
- `url.py`: URL stores (`UrlStore`, its working copy, checkpoint uploads);
- `lock.py` (the writer lock), `lease.py` (a URL store's writer lease across machines, by conditional
  puts), `registry.py` (the checkpoint registry), `analysis.py` (SQL).

The names below are the package's face: `from pipeline import store; store.table_path(...)`.
"""

from pipeline.store.atomic import atomic_dir, atomic_write, atomic_write_bytes, atomic_write_text, clear_dead_builds, fsync_dir
from pipeline.store.files import check_table_file, jsonable, read_table, read_tables, scan_table, write_table
from pipeline.store.paths import (
    BASE_ROUND,
    cache_root,
    check_writable,
    checkpoint_dir,
    exists,
    filesystem,
    is_url,
    round_dir,
    table_path,
)
from pipeline.store.tables import TableInfo, Tables
from pipeline.store.url import UrlStore, canonical_url, check_store_url, fetch_dir, local_copy, upload_dir, working_copy, write_bytes

__all__ = [
    "BASE_ROUND",
    "Tables",
    "TableInfo",
    "round_dir",
    "table_path",
    "write_table",
    "read_table",
    "read_tables",
    "check_table_file",
    "check_writable",
    "scan_table",
    "atomic_dir",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
    "clear_dead_builds",
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
