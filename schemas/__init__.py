"""Arrow schemas of every maxit table, and `validate`.

A table may carry more columns than its schema lists (other tools add their own); the listed
ones must be present with the listed type, and non-nullable ones must hold no nulls. Nothing is
coerced: a wrong type is an error that names the column, a null where none may be is an error
that names the rows (by their row-id column, `step_id` for the rollout tables).

String and list columns compare by kind: `string`, `large_string` and `string_view` are one
type here, as are `list` and `large_list` (Polars writes the large variants).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa

__all__ = [
    "STEPS",
    "ADVANTAGES",
    "TRAINING_VIEW",
    "EVALUATION",
    "RATIO_DIAGNOSTICS",
    "TIMINGS",
    "BASELINES",
    "ROLLOUT_SHARDS",
    "PROBLEMS",
    "SCHEMAS",
    "TableSchema",
    "polars_schema",
    "SchemaError",
    "validate",
    "validate_columns",
    "duplicates_problem",
    "to_arrow",
]

MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])


@dataclass(frozen=True)
class TableSchema:
    """A named table contract: its Arrow schema, the column that identifies a row in error
    messages, and the columns whose values must be unique."""

    name: str
    schema: pa.Schema
    row_id: str | None = None
    unique: tuple[str, ...] = ()


def _f(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


_STEPS_FIELDS = [
    _f("round", pa.int32()),
    _f("step_id", pa.string()),
    _f("strategy", pa.string()),
    _f("uid", pa.string()),
    _f("traj_uid", pa.string()),
    _f("sample_idx", pa.int32()),
    _f("agent_id", pa.string()),
    _f("policy_id", pa.string()),
    _f("turn", pa.int32()),
    _f("step", pa.int32()),
    _f("node_id", pa.string()),
    _f("parent_node_id", pa.string(), nullable=True),
    _f("selected", pa.bool_()),
    _f("active", pa.bool_()),
    _f("sampling_messages", pa.list_(MESSAGE)),
    _f("prompt_hash", pa.string()),
    _f("prompt_ids", pa.list_(pa.int32())),
    _f("completion_ids", pa.list_(pa.int32())),
    _f("completion_logprobs", pa.list_(pa.float32())),
    _f("completion_text", pa.string()),
    _f("finish_reason", pa.string()),
    _f("global_reward", pa.float64(), nullable=True),
    _f("local_reward", pa.float64(), nullable=True),
    _f("reward", pa.float64(), nullable=True),
    _f("reward_error", pa.string(), nullable=True),
    # Verifier rows: the parsed verdict (True approves); null on Solver rows and when unparsable
    _f("verdict", pa.bool_(), nullable=True),
    _f("model_version", pa.string()),
    # the round of the checkpoint that sampled the row (-1: the starting model), and how many
    # rounds older it is than the checkpoint the row's round trains (0 in synchronous rounds;
    # --max-staleness K: K); null where unknown (rows not sampled by a registered checkpoint)
    _f("policy_round", pa.int32(), nullable=True),
    _f("staleness", pa.int32(), nullable=True),
    _f("engine", pa.string()),
    _f("seed", pa.int64()),
    _f("temperature", pa.float64()),
]

STEPS = TableSchema("steps", pa.schema(_STEPS_FIELDS), row_id="step_id", unique=("step_id",))

ADVANTAGES = TableSchema(
    "advantages",
    pa.schema(
        _STEPS_FIELDS
        + [
            _f("group_size", pa.int32()),
            _f("group_mean", pa.float64(), nullable=True),
            _f("group_std", pa.float64(), nullable=True),
            _f("advantage", pa.float64()),
            _f("sample_weight", pa.float64()),
        ]
    ),
    row_id="step_id",
    unique=("step_id",),
)

TRAINING_VIEW = TableSchema(
    "training_view",
    pa.schema(
        [
            _f("step_id", pa.string()),
            _f("policy_id", pa.string()),
            _f("agent_id", pa.string()),
            _f("strategy", pa.string()),
            _f("train_prompt_ids", pa.list_(pa.int32())),
            _f("completion_ids", pa.list_(pa.int32())),
            _f("sampling_logprobs", pa.list_(pa.float32())),
            _f("advantage", pa.float64()),
            _f("sample_weight", pa.float64()),
            _f("reward", pa.float64(), nullable=True),
            _f("context_swapped", pa.bool_()),
            _f("round", pa.int32()),
            _f("turn", pa.int32()),
            # the sampling temperature: p_train must be computed at it (the trainer checks)
            _f("temperature", pa.float64()),
        ]
    ),
    row_id="step_id",
    unique=("step_id",),
)

PROBLEMS = TableSchema(
    "problems",
    pa.schema(
        [
            _f("round", pa.int32()),
            _f("uid", pa.string()),
            _f("question", pa.string()),
            _f("answer", pa.string()),
            _f("split", pa.string()),
            _f("hint", pa.string(), nullable=True),
        ]
    ),
    row_id="uid",
    unique=("uid",),
)

EVALUATION = TableSchema(
    "evaluation",
    pa.schema(
        [
            _f("round", pa.int32()),
            _f("policy_id", pa.string()),
            _f("agent_id", pa.string()),
            _f("split", pa.string()),
            _f("metric", pa.string()),
            _f("value", pa.float64()),
            _f("n", pa.int64()),
        ]
    ),
)

RATIO_DIAGNOSTICS = TableSchema(
    "ratio_diagnostics",
    pa.schema(
        [
            _f("round", pa.int32()),
            _f("policy_id", pa.string()),
            # "*" = all agents / all strategies of the policy
            _f("agent_id", pa.string()),
            _f("strategy", pa.string()),
            _f("rows", pa.int64()),
            _f("tokens", pa.int64()),
            # mean over tokens of log p_train - log q_sample over the whole update, and at its
            # first optimizer step (before any weight changed: ~0 on rows whose context was kept)
            _f("mean_log_ratio", pa.float64()),
            _f("first_step_log_ratio", pa.float64(), nullable=True),
            _f("clip_fraction", pa.float64()),
            _f("masked_fraction", pa.float64()),
            _f("truncated_fraction", pa.float64()),
            # tokens whose weight token-level TIS truncated (--off-policy-correction token-tis)
            _f("truncated_token_fraction", pa.float64(), nullable=True),
            _f("ess_fraction", pa.float64()),
            _f("kl", pa.float64()),
            # rounds between the checkpoint that sampled the round's rows and the one trained (null: unknown)
            _f("staleness", pa.int32(), nullable=True),
        ]
    ),
)

# Seconds each stage of a round took (problems, rollouts, advantages, training_view, policy,
# evaluation, "other": the rest of the round's wall time, e.g. Dagster and the checks; and the
# parts of stages' time: sandbox, engine_start, engine_swap), one row per stage.
TIMINGS = TableSchema(
    "timings",
    pa.schema([_f("round", pa.int32()), _f("stage", pa.string()), _f("seconds", pa.float64())]),
    row_id="stage",
    unique=("stage",),
)

# One row per shard of a round's rollouts: its problems and rows, the process and host that
# sampled it, and when (Unix seconds).
ROLLOUT_SHARDS = TableSchema(
    "rollout_shards",
    pa.schema(
        [
            _f("round", pa.int32()),
            _f("shard", pa.int64()),
            _f("problems", pa.int64()),
            _f("rows", pa.int64()),
            _f("pid", pa.int64()),
            _f("host", pa.string()),
            _f("started", pa.float64()),
            _f("finished", pa.float64()),
        ]
    ),
    row_id="shard",
    unique=("shard",),
)

# The team's untrained budget-matched baselines on the held-out problems (round -1, once per store;
# pipeline.rollout.budget_matched): one row per (baseline, metric); a baseline that does not apply to the
# workflow has null values and a note saying why.
BASELINES = TableSchema(
    "baselines",
    pa.schema(
        [
            _f("round", pa.int32()),
            _f("baseline", pa.string()),
            _f("agent_id", pa.string()),
            _f("metric", pa.string()),
            _f("value", pa.float64(), nullable=True),
            _f("n", pa.int64()),
            _f("calls_per_call", pa.int64()),
            _f("team_calls", pa.float64()),
            _f("calls_source", pa.string()),
            _f("note", pa.string(), nullable=True),
        ]
    ),
)

SCHEMAS: dict[str, TableSchema] = {
    s.name: s for s in (PROBLEMS, STEPS, ADVANTAGES, TRAINING_VIEW, EVALUATION, RATIO_DIAGNOSTICS, TIMINGS, ROLLOUT_SHARDS)
}
SCHEMAS[BASELINES.name] = BASELINES


def polars_schema(schema: "TableSchema | str"):
    """The table's columns as a Polars schema, for building a frame of this table in code (the
    one declaration of its columns stays here)."""
    import polars as pl

    return pl.from_arrow(_schema_of(schema).schema.empty_table()).schema


class SchemaError(ValueError):
    """A table does not meet its contract. `problems` lists every finding, one line each;
    `source` names where the table came from (its file), when known."""

    def __init__(self, table: str, problems: list[str], source: str | None = None):
        self.table = table
        self.problems = problems
        self.source = source
        where = f" ({source})" if source else ""
        super().__init__(f"table {table!r}{where} does not match its schema:\n  - " + "\n  - ".join(problems))

    def with_source(self, source: str) -> "SchemaError":
        """The same findings, naming `source` (e.g. the file the table was read from)."""
        return SchemaError(self.table, self.problems, source)


def _canonical(t: pa.DataType) -> pa.DataType:
    """Fold the large/view variants onto their plain types, recursively."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(_canonical(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _canonical(f.type)) for f in t])
    if pa.types.is_dictionary(t):
        return _canonical(t.value_type)
    return t


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    return _canonical(actual).equals(_canonical(expected))


T = TypeVar("T")


def to_arrow(data) -> pa.Table:
    """A pyarrow Table of a pyarrow Table/RecordBatch or a Polars DataFrame/LazyFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        import polars as pl
    except ImportError:  # pragma: no cover - polars is a core dependency
        pl = None
    if pl is not None:
        if isinstance(data, pl.LazyFrame):
            data = data.collect()
        if isinstance(data, pl.DataFrame):
            return data.to_arrow()
    raise TypeError(f"expected a pyarrow Table or a Polars DataFrame/LazyFrame, got {type(data).__name__}")


def _row_ids(table: pa.Table, mask: pa.Array, row_id: str | None, limit: int = 10) -> str:
    import pyarrow.compute as pc

    idx = pc.indices_nonzero(mask).to_pylist()
    if row_id is not None and row_id in table.column_names:
        ids = table.column(row_id).take(idx[:limit]).to_pylist()
        shown = ", ".join(repr(i) for i in ids)
        label = row_id
    else:
        shown = ", ".join(str(i) for i in idx[:limit])
        label = "row index"
    more = f" and {len(idx) - limit} more" if len(idx) > limit else ""
    return f"{len(idx)} row(s) ({label} {shown}{more})"


def _nested_nulls(arr: pa.Array, expected: pa.DataType, path: str, out: list[tuple[str, "np.ndarray"]]) -> None:
    """Rows of `arr` (one array chunk) holding a null where `expected` allows none: an element of
    a list (token ids, logprobs and messages are never null) or a non-nullable struct field.
    Appends (where, row mask) pairs to `out`."""
    import numpy as np
    import pyarrow.compute as pc

    if pa.types.is_list(expected) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        values = arr.flatten()
        if len(values) == 0:
            return
        inner: list = []
        if values.null_count:
            inner.append((f"{path}[]", np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)))
        _nested_nulls(values, expected.value_type, f"{path}[]", inner)
        if not inner:  # the common case: nothing more to compute
            return
        parents = pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)
        for where, mask in inner:
            rows = np.zeros(len(arr), dtype=bool)
            rows[parents[mask]] = True
            out.append((where, rows))
    elif pa.types.is_struct(expected) and pa.types.is_struct(arr.type):
        for f in expected:
            child = arr.field(f.name)
            if not f.nullable and child.null_count:
                valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                out.append((f"{path}.{f.name}", valid & np.asarray(child.is_null().to_numpy(zero_copy_only=False), dtype=bool)))
            _nested_nulls(child, f.type, f"{path}.{f.name}", out)


def _nested_null_problems(table: pa.Table, field: pa.Field, row_id: str | None) -> list[str]:
    import numpy as np

    if not (pa.types.is_list(field.type) or pa.types.is_struct(field.type)):
        return []
    found: dict[str, np.ndarray] = {}
    offset = 0
    col = table.column(field.name)
    for chunk in col.chunks:
        pieces: list = []
        _nested_nulls(chunk, field.type, field.name, pieces)
        for where, mask in pieces:
            full = found.setdefault(where, np.zeros(len(col), dtype=bool))
            full[offset : offset + len(chunk)] |= mask
        offset += len(chunk)
    return [f"{where} holds a null in {_row_ids(table, pa.array(mask), row_id)}" for where, mask in found.items() if mask.any()]


def duplicates_problem(data, column: str, within: str | None = None, limit: int = 10) -> str | None:
    """None if `column` of `data` (a pyarrow Table or a Polars DataFrame) holds no value twice
    (with `within`, e.g. "round": twice for one value of that column), else a line naming the
    column and the first `limit` duplicated values. Cheap when there are none (the common case):
    one pass counting distinct 64-bit hashes; only when two hashes are equal are the values
    themselves compared."""
    import polars as pl

    cols = [column] + ([within] if within else [])
    frame = data.select(cols) if isinstance(data, pl.DataFrame) else pl.from_arrow(to_arrow(data).select(cols))
    hashes = frame[column].hash(seed=0x5EED)
    if within:
        hashes = hashes ^ frame[within].hash(seed=0x5EED2)
    if hashes.n_unique() == frame.height:
        return None
    dup = frame.filter(frame.is_duplicated()).unique(maintain_order=True)
    if dup.height == 0:  # different values shared a hash
        return None
    shown = ", ".join(repr(r[0]) + (f" ({within} {r[1]})" if within else "") for r in dup.head(limit).iter_rows())
    more = f" and {dup.height - limit} more" if dup.height > limit else ""
    return f"column {column!r} must be unique{f' per {within}' if within else ''}; duplicated: {shown}{more}"


def _schema_of(schema: TableSchema | str) -> TableSchema:
    if isinstance(schema, str):
        if schema not in SCHEMAS:
            raise KeyError(f"unknown table {schema!r}; known: {sorted(SCHEMAS)}")
        schema = SCHEMAS[schema]
    return schema


def _column_problems(actual: pa.Schema, schema: TableSchema) -> list[str]:
    problems: list[str] = []
    for field in schema.schema:
        if field.name not in actual.names:
            problems.append(f"missing column {field.name!r} ({field.type})")
        elif not _same_type(actual.field(field.name).type, field.type):
            problems.append(f"column {field.name!r} has type {actual.field(field.name).type}, expected {field.type}")
    return problems


def validate_columns(actual: pa.Schema, schema: TableSchema | str, source: str | None = None) -> pa.Schema:
    """Return `actual` if it has every column of `schema` with its type, else raise `SchemaError`
    naming each missing or mistyped column (and `source`). Only the columns are checked, not
    the values: a Parquet file's schema (its footer) can be checked this way before its rows are
    read."""
    schema = _schema_of(schema)
    problems = _column_problems(actual, schema)
    if problems:
        raise SchemaError(schema.name, problems, source)
    return actual


def validate(data: T, schema: TableSchema | str) -> T:
    """Return `data` unchanged if it meets `schema`, else raise `SchemaError` listing every
    missing column, every column of the wrong type, every null in a non-nullable column or
    inside a list or a non-nullable struct field (with the offending row ids) and every
    duplicated unique key.

    `data` is a pyarrow Table or a Polars DataFrame/LazyFrame (a LazyFrame is collected to be
    checked, and returned as it was given)."""
    schema = _schema_of(schema)
    import pyarrow.compute as pc

    table = to_arrow(data)
    problems = _column_problems(table.schema, schema)
    for field in schema.schema:
        if field.name not in table.column_names or not _same_type(table.schema.field(field.name).type, field.type):
            continue
        col = table.column(field.name)
        if not field.nullable and col.null_count:
            problems.append(f"column {field.name!r} is null in {_row_ids(table, pc.is_null(col), schema.row_id)}")
        problems.extend(_nested_null_problems(table, field, schema.row_id))
    for key in schema.unique:
        if key in table.column_names and table.num_rows:
            problem = duplicates_problem(table, key)
            if problem:
                problems.append(problem)
    if problems:
        raise SchemaError(schema.name, problems)
    return data
