"""Table contracts and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import store
from pipeline.rollout.synthetic import synthetic_steps
from schemas import STEPS, SchemaError, duplicates_problem, validate, validate_columns


@pytest.fixture
def steps() -> pl.DataFrame:
    return synthetic_steps(n_problems=3, samples=2, full=True)


def test_synthetic_full_table_is_a_valid_steps_table(steps):
    assert validate(steps, STEPS) is steps
    assert validate(steps.lazy(), "steps") is not None
    validate(STEPS.schema.empty_table(), "steps")


def test_validate_names_every_problem(steps):
    bad = steps.drop("uid").with_columns(pl.col("turn").cast(pl.Int64), pl.col("completion_ids").cast(pl.List(pl.Int64)))
    bad = bad.with_columns(pl.when(pl.col("step_id").is_in(["3", "7"])).then(None).otherwise(pl.col("agent_id")).alias("agent_id"))
    bad = pl.concat([bad, bad.head(1)])
    with pytest.raises(SchemaError) as err:
        validate(bad, STEPS)
    msg = str(err.value)
    assert "missing column 'uid'" in msg
    assert "column 'turn' has type int64, expected int32" in msg
    assert "'completion_ids'" in msg
    assert "column 'agent_id' is null in 2 row(s) (step_id '3', '7')" in msg
    assert "must be unique; duplicated: '0'" in msg
    assert len(err.value.problems) == 5


def test_nulls_inside_lists_and_structs_are_named(steps):
    ids = steps["step_id"].to_list()
    bad = steps.with_columns(
        pl.when(pl.col("step_id") == ids[1]).then(pl.lit([5, None], dtype=pl.List(pl.Int32))).otherwise(pl.col("completion_ids")).alias("completion_ids"),
        pl.when(pl.col("step_id") == ids[2])
        .then(pl.lit([{"role": "user", "content": None}], dtype=pl.List(pl.Struct({"role": pl.String, "content": pl.String}))))
        .otherwise(pl.col("sampling_messages"))
        .alias("sampling_messages"),
    )
    with pytest.raises(SchemaError) as err:
        validate(bad, STEPS)
    msg = str(err.value)
    assert f"completion_ids[] holds a null in 1 row(s) (step_id {ids[1]!r})" in msg
    assert f"sampling_messages[].content holds a null in 1 row(s) (step_id {ids[2]!r})" in msg
    assert len(err.value.problems) == 2
    # sliced and multi-chunk input: rows are still named right
    table = pa.concat_tables([bad.head(2).to_arrow(), bad.slice(2).to_arrow()])
    with pytest.raises(SchemaError, match=f"step_id {ids[2]!r}"):
        validate(table, STEPS)


def test_large_string_and_list_variants_are_accepted(steps):
    table = steps.to_arrow()  # polars writes large_string / large_list
    assert pa.types.is_large_string(table.schema.field("uid").type) or pa.types.is_string_view(table.schema.field("uid").type)
    validate(table, STEPS)


def test_a_parquet_footer_is_checked_against_the_contract_without_its_rows(tmp_path, steps):
    path = tmp_path / "steps.parquet"
    steps.drop("traj_uid").with_columns(pl.col("turn").cast(pl.Int64)).write_parquet(path)
    with pytest.raises(SchemaError) as err:
        validate_columns(pq.read_schema(path), "steps", source=str(path))
    assert err.value.problems == ["missing column 'traj_uid' (string)", "column 'turn' has type int64, expected int32"]
    assert f"table 'steps' ({path}) does not match" in str(err.value)
    with pytest.raises(SchemaError, match=f"--steps {path}"):
        store.check_table_file(path, STEPS, flag="--steps")
    steps.write_parquet(path)
    assert store.check_table_file(path, STEPS).names == steps.columns


def test_duplicates_are_named_over_chunks_and_nulls():
    table = pa.table({"step_id": pa.chunked_array([["a", "b", None], ["c", "a", None]]), "round": pa.chunked_array([[0, 0, 0], [0, 1, 0]])})
    assert duplicates_problem(table, "step_id") == "column 'step_id' must be unique; duplicated: 'a', None"
    assert duplicates_problem(table, "step_id", within="round") == "column 'step_id' must be unique per round; duplicated: None (round 0)"
    assert duplicates_problem(pl.DataFrame({"step_id": [f"s{i}" for i in range(15)] * 2}), "step_id", limit=3).endswith("'s0', 's1', 's2' and 12 more")
    assert duplicates_problem(pl.DataFrame({"step_id": ["a", "b"]}), "step_id") is None


def test_write_table_is_atomic_and_validated(tmp_path, steps):
    path = store.table_path(tmp_path, 0, "steps")
    store.write_table(steps, path, STEPS)
    before = path.read_bytes()
    with pytest.raises(SchemaError):
        store.write_table(steps.drop("uid"), path, STEPS)
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["steps.parquet"]  # no temp file left behind
    assert store.read_table(path, STEPS).height == steps.height
    assert store.scan_table(tmp_path, "steps").select("round").collect()["round"].unique().to_list() == [0]


def test_write_table_leaves_no_partial_file_when_interrupted(tmp_path, steps, monkeypatch):
    path = tmp_path / "t.parquet"
    store.write_table(steps, path)
    import pyarrow.parquet as pq

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(KeyboardInterrupt):
        store.write_table(steps.head(1), path)
    assert pl.read_parquet(path).height == steps.height
    assert os.listdir(tmp_path) == ["t.parquet"]


def test_atomic_dir_replaces_or_keeps(tmp_path):
    target = tmp_path / "ckpt"
    with store.atomic_dir(target) as d:
        (d / "w").write_text("one")
    with pytest.raises(RuntimeError):
        with store.atomic_dir(target) as d:
            (d / "w").write_text("two")
            raise RuntimeError("crash mid-write")
    assert (target / "w").read_text() == "one"
    with store.atomic_dir(target) as d:
        (d / "w").write_text("three")
    assert (target / "w").read_text() == "three"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_dir_clears_what_a_killed_build_left_and_only_that(tmp_path):
    """A build killed mid-way (SIGKILL) leaves its temporary folder; the next atomic_dir of the
    same path removes it, but not a live build's (its lock held), a folder without a lock file,
    or another target's."""
    import fcntl
    import subprocess
    import sys

    target = tmp_path / "model"
    child = subprocess.run(
        [sys.executable, "-c", "import os, sys; sys.path.insert(0, sys.argv[1]); from pipeline import store\n"
         "with store.atomic_dir(sys.argv[2]) as d:\n    (d / 'w').write_text('half')\n    os.kill(os.getpid(), 9)",
         str(Path(__file__).resolve().parents[1]), str(target)],
        capture_output=True, text=True, timeout=120)
    assert child.returncode == -9
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and left[0].startswith(".model.tmp-") and left[1] == left[0] + ".lock"  # the killed build's
    live = tmp_path / ".model.tmp-live"
    unlocked = tmp_path / ".model.tmp-older"  # no lock file: not known to be dead
    other = tmp_path / ".models.tmp-x"  # another target's
    for p in (live, unlocked, other):
        p.mkdir()
    (tmp_path / ".models.tmp-x.lock").touch()
    fd = os.open(tmp_path / ".model.tmp-live.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with store.atomic_dir(target) as d:
            (d / "w").write_text("whole")
    finally:
        os.close(fd)
    assert (target / "w").read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["model", live.name, live.name + ".lock", unlocked.name, other.name, other.name + ".lock"])
    # the live build ended without cleaning up (killed): the next sweep takes its folder too
    assert store.clear_dead_builds(target) == [live]


def test_a_build_killed_between_its_two_renames_keeps_the_previous_folder(tmp_path, caplog):
    """`<tmp>.old` is the only whole copy when a build died after moving `path` aside and before
    putting its own there: the sweep keeps it (and says where) until `path` exists again, and
    never writes `path` itself (a live build may be swapping it)."""
    target = tmp_path / "ckpt"
    old = tmp_path / ".ckpt.tmp-abc.old"
    old.mkdir()
    (old / "w").write_text("previous")
    (tmp_path / ".ckpt.tmp-abc").mkdir()  # the half-made new one
    (tmp_path / ".ckpt.tmp-abc.lock").touch()  # nobody holds it: the build is dead
    with caplog.at_level("WARNING"):
        assert store.clear_dead_builds(target) == [tmp_path / ".ckpt.tmp-abc"]
    assert f"the previous ckpt is kept at {old}" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.tmp-abc.lock", ".ckpt.tmp-abc.old"]
    with store.atomic_dir(target) as d:
        (d / "w").write_text("new")
    assert (target / "w").read_text() == "new"
    assert store.clear_dead_builds(target) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_build_runs_unmarked_where_the_filesystem_has_no_flock(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(store.atomic.fcntl, "flock", no_flock)
    with store.atomic_dir(tmp_path / "ckpt") as d:
        (d / "w").write_text("one")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_writes_get_ordinary_permissions(tmp_path, steps):
    old = os.umask(0o022)
    try:
        table = store.write_table(steps, tmp_path / "t.parquet")
        text = store.atomic_write_text(tmp_path / "x.json", "{}")
        with store.atomic_dir(tmp_path / "ckpt") as d:
            (d / "w").write_text("one")
    finally:
        os.umask(old)
    assert oct(table.stat().st_mode & 0o777) == oct(0o644)
    assert oct(text.stat().st_mode & 0o777) == oct(0o644)
    assert oct((tmp_path / "ckpt").stat().st_mode & 0o777) == oct(0o755)


def test_atomic_dir_puts_the_old_directory_back_when_the_swap_fails(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    with store.atomic_dir(target) as d:
        (d / "w").write_text("one")
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(src).find(".ckpt.tmp-") >= 0 and not str(src).endswith(".old"):
            raise OSError("disk went away")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk went away"):
        with store.atomic_dir(target) as d:
            (d / "w").write_text("two")
    monkeypatch.undo()
    assert (target / "w").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_polars_schema_is_the_contract_s_columns_in_order_for_every_table():
    import polars as pl

    from schemas import SCHEMAS, polars_schema

    for name, contract in SCHEMAS.items():
        frame = pl.DataFrame(schema=polars_schema(name))
        assert frame.columns == contract.schema.names, name
    assert dict(polars_schema("timings")) == {"round": pl.Int32, "stage": pl.String, "seconds": pl.Float64}
    assert polars_schema("evaluation")["n"] == pl.Int64 and polars_schema("problems")["hint"] == pl.String


def test_a_table_is_read_by_columns_and_a_missing_column_is_named(tmp_path):
    """`Tables.read(..., columns=)`: only those columns, in that order; one the file lacks is a
    one-line error naming the column and the file; `Tables.columns` reads the footer."""
    from pipeline.errors import DataError
    from pipeline.store import Tables

    tables = Tables(tmp_path / "store")
    path = tables.path(0, "notes")
    path.parent.mkdir(parents=True)
    pl.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, 1.5]}).write_parquet(path)
    assert tables.read(0, "notes", columns=["c", "a"]).columns == ["c", "a"]
    assert tables.columns(0, "notes") == ["a", "b", "c"]
    with pytest.raises(DataError, match=r"notes\.parquet: no column 'd'$"):
        tables.read(0, "notes", columns=["a", "d"])
