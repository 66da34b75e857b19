"""The IO manager of a round's tables: how a table moves between the assets through Dagster.

The stages write their tables themselves, through the store's one table owner
(`pipeline.store.Tables`: atomic, validated, each table once per round); an asset returns the
receipt of the table its stage wrote (a `TableInfo`). This IO manager does the rest of each
table's I/O around the stage:

- `handle_output` publishes the round's tables (a URL store: what changed goes up, the round's
  evaluation last) and records the table's materialization metadata, read from the stored file's
  footer: its row count (`dagster/row_count`), its column schema (`dagster/column_schema`, each
  column's name and Arrow type) and where it is kept;
- `load_input` makes the working copy current (`Tables.pull`) and reads the upstream table of the
  partition's round, only the columns an `AssetIn`'s metadata names under "columns" when it does;
- `setup_for_execution` pulls when the resources are set up (in each step's process, or once for
  a run whose steps share one process), for what a stage reads besides its input (earlier
  rounds' tables, round -1's evaluation).

Which table an asset's output is: its definition metadata's `TABLE_KEY` (`table_of`). The
manager holds the store resource, whose setup (the store's writer lock) comes first."""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
import polars as pl
import pyarrow.parquet as pq

from assets.partitions import round_from_key
from assets.resources import StoreResource
from pipeline.errors import DataError
from pipeline.store import TableInfo, Tables

TABLE_KEY = "maxit/table"
"""The definition metadata key naming the store table an asset's output is."""

IO_MANAGER_KEY = "round_tables"
"""The resource key of `RoundTablesIOManager`; the round's assets name it as their io_manager_key
(the ops inside the rollouts graph keep Dagster's default IO manager for their shard payloads)."""


def table_of(metadata: Mapping, asset_key: dg.AssetKey) -> str:
    """The store table named by an asset's definition `metadata`; an asset without one is an
    error naming it (the IO manager never guesses which file an asset is)."""
    table = metadata.get(TABLE_KEY)
    if isinstance(table, dg.TextMetadataValue):
        table = table.value
    if not isinstance(table, str) or not table:
        raise dg.Failure(f"asset {asset_key.to_user_string()!r} has no {TABLE_KEY!r} in its definition metadata: the "
                         f"{IO_MANAGER_KEY} IO manager does not know which table it is")
    return table


def column_schema(schema) -> dg.TableSchema:
    """A stored table's columns (an Arrow schema) as Dagster's `TableSchema`: name, Arrow type and
    whether it may hold nulls."""
    return dg.TableSchema(columns=[
        dg.TableColumn(name=field.name, type=str(field.type), constraints=dg.TableColumnConstraints(nullable=field.nullable)) for field in schema
    ])


def stored_table_metadata(tables: Tables, round_: int, table: str) -> dict:
    """The materialization metadata of round `round_`'s `table`, from its file's footer (no rows
    read): row count, column schema and where it is kept."""
    path = tables.path(round_, table)
    if not path.is_file():
        raise DataError(f"round {round_}: the {table!r} table was not written ({path} is missing)")
    footer = pq.ParquetFile(path)
    return {
        "dagster/row_count": int(footer.metadata.num_rows),
        "dagster/column_schema": column_schema(footer.schema_arrow),
        "path": dg.MetadataValue.path(tables.location_of(round_, table)),
    }


class RoundTablesIOManager(dg.ConfigurableIOManager):
    """Publishes and describes the table each round asset's stage wrote; loads a round's upstream
    table for the asset that reads it (module docstring)."""

    store: StoreResource

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.store.tables().pull()

    def handle_output(self, context: dg.OutputContext, obj: TableInfo) -> None:
        asset_key = context.asset_key
        table, r = table_of(context.definition_metadata, asset_key), round_from_key(context.asset_partition_key)
        tables = self.store.tables()
        if not isinstance(obj, TableInfo):
            raise dg.Failure(f"asset {asset_key.to_user_string()!r} returned {type(obj).__name__}, not the TableInfo of its {table!r} table")
        if obj.path != tables.location_of(r, table):
            raise dg.Failure(f"asset {asset_key.to_user_string()!r} of round {r} returned the receipt of {obj.path}, not of its {table!r} table "
                             f"({tables.location_of(r, table)})")
        metadata = stored_table_metadata(tables, r, table)
        if metadata["dagster/row_count"] != obj.rows:
            raise DataError(f"round {r}: the {table!r} table holds {metadata['dagster/row_count']} rows, its stage wrote {obj.rows}")
        tables.publish(r)  # a URL store: round -1's evaluation, then the round's tables, its evaluation last
        context.add_output_metadata(metadata)

    def load_input(self, context: dg.InputContext) -> pl.DataFrame:
        upstream = context.upstream_output
        table = table_of(upstream.definition_metadata, upstream.asset_key)
        r = round_from_key(context.asset_partition_key)
        tables = self.store.tables()
        tables.pull()  # a step in another process, or on another machine, reads what the URL holds
        columns = (context.definition_metadata or {}).get("columns")
        return tables.read(r, table, columns=list(columns) if columns is not None else None)
