"""SQL and Polars over a run's tables, across rounds.

Every table of a store (`<store>/round=<r>/<table>.parquet`) is exposed as a DuckDB view of the
same name over all rounds, with `round` from the Hive partition path."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.errors import MaxitError

__all__ = ["tables_in_store", "connect", "run_sql"]


def tables_in_store(store: str | Path) -> list[str]:
    store = Path(store)
    return sorted({p.stem for p in store.glob("round=*/*.parquet")})


def connect(store: str | Path):
    """A DuckDB connection with one view per table of the store."""
    import duckdb

    store = Path(store)
    if not store.exists():
        raise MaxitError(f"--store {store}: no such folder")
    con = duckdb.connect()
    for name in tables_in_store(store):
        pattern = (store / "round=*" / f"{name}.parquet").as_posix().replace("'", "''")
        con.execute(f"CREATE VIEW \"{name}\" AS SELECT * FROM read_parquet('{pattern}', hive_partitioning = true, union_by_name = true)")
    return con


def run_sql(query: str, store: str | Path) -> pl.DataFrame:
    con = connect(store)
    try:
        return con.sql(query).pl()
    except Exception as err:  # duckdb raises its own error classes
        known = ", ".join(tables_in_store(store)) or "none"
        raise MaxitError(f"{err}\n(tables in {store}: {known})") from None
    finally:
        con.close()
