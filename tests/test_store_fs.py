"""The store on any filesystem: the same writes, reads and Hive-partitioned scans on the local
filesystem (a folder, and a file:// URL) and on fsspec's in-memory filesystem (memory://)."""

from __future__ import annotations

import uuid

import fsspec
import polars as pl
import pytest

from pipeline import store as st
from pipeline.errors import ConfigError, DataError
from pipeline.rollout.synthetic import synthetic_steps
from schemas import SchemaError

STORES = ["local", "file", "memory"]


@pytest.fixture(params=STORES)
def store(request, tmp_path):
    if request.param == "local":
        yield tmp_path / "store"
    elif request.param == "file":
        yield f"file://{tmp_path}/store"
    else:
        url = f"memory://maxit-test-{uuid.uuid4().hex}"
        yield url
        fs, path = fsspec.core.url_to_fs(url)
        if fs.exists(path):
            fs.rm(path, recursive=True)


@pytest.fixture(scope="module")
def steps():
    return synthetic_steps(n_problems=3, samples=2, full=True)


def test_tables_round_trip_and_scan_as_hive_partitions(store, steps):
    df = steps
    for r in (0, 1, 2):
        part = df.with_columns(pl.lit(r, pl.Int32).alias("round"))
        path = st.write_table(part, st.table_path(store, r, "steps"), "steps")
        assert st.exists(path)
        back = st.read_table(st.table_path(store, r, "steps"), "steps")
        assert back.equals(part)
    assert st.exists(st.round_dir(store, 1)) and not st.exists(st.table_path(store, 3, "steps"))
    scanned = st.scan_table(store, "steps").collect()
    assert scanned.height == 3 * df.height
    assert sorted(scanned["round"].unique().to_list()) == [0, 1, 2]
    # the scan's rows are the written rows
    key = ["round", "step_id"]
    written = pl.concat([df.with_columns(pl.lit(r, pl.Int32).alias("round")) for r in (0, 1, 2)])
    assert scanned.select(key).with_columns(pl.col("round").cast(pl.Int32)).sort(key).equals(written.select(key).sort(key))


def test_a_rewrite_replaces_the_table_and_leaves_nothing_beside_it(store, steps):
    df = steps
    path = st.table_path(store, 0, "steps")
    st.write_table(df, path, "steps")
    st.write_table(df.head(3), path, "steps")
    assert st.read_table(path).height == 3
    if st.is_url(store):
        fs, base = st.filesystem(str(st.round_dir(store, 0)))
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
    else:
        names = [p.name for p in st.round_dir(store, 0).iterdir()]
    assert names == ["steps.parquet"]


def test_bad_tables_are_named_errors(store, steps):
    df = steps
    with pytest.raises(SchemaError):
        st.write_table(df.drop("step_id"), st.table_path(store, 0, "steps"), "steps")
    assert not st.exists(st.table_path(store, 0, "steps"))  # nothing half-written
    with pytest.raises(FileNotFoundError, match="--steps"):
        st.read_table(st.table_path(store, 5, "steps"), flag="--steps")
    if st.is_url(store):
        fs, p = st.filesystem(str(st.table_path(store, 0, "junk")))
        fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(p, "wb") as fh:
            fh.write(b"not parquet")
        with pytest.raises(DataError, match="not a readable Parquet file"):
            st.read_table(st.table_path(store, 0, "junk"))


def test_checkpoints_upload_marker_last_and_load_through_a_local_copy(store, tmp_path):
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "config.json").write_text("{}")
    (local / "sub").mkdir()
    (local / "sub" / "weights.bin").write_bytes(b"\0" * 1000)
    (local / "maxit_checkpoint.json").write_text('{"round": 0}')
    target = st.checkpoint_dir(store, 0, "shared")
    st.upload_dir(local, target)
    copy = st.local_copy(target, tmp_path / "cache")
    assert (copy / "sub" / "weights.bin").read_bytes() == b"\0" * 1000
    assert (copy / "maxit_checkpoint.json").read_text() == '{"round": 0}'
    assert st.local_copy(target, tmp_path / "cache") == copy  # reused, not copied again
    if st.is_url(store) and not str(store).startswith("file://"):
        order = []
        fs, _ = st.filesystem(str(target))
        real_open = fs.open

        def recording_open(path, mode="rb", **kw):
            if "w" in mode:
                order.append(path.rsplit("/", 1)[-1])
            return real_open(path, mode, **kw)

        fs.open = recording_open
        try:
            st.upload_dir(local, st.checkpoint_dir(store, 1, "shared"))
        finally:
            del fs.open
        assert order[-1] == "maxit_checkpoint.json" and len(order) == 3
        # an upload without its marker is not a checkpoint
        fs.rm(st.filesystem(str(st.checkpoint_dir(store, 1, "shared")))[1] + "/maxit_checkpoint.json")
        with pytest.raises(DataError, match="not a complete checkpoint"):
            st.local_copy(st.checkpoint_dir(store, 1, "shared"), tmp_path / "cache")


def test_unknown_scheme_is_a_named_error():
    with pytest.raises(ConfigError, match=r"--store nosuchfs://x: unknown filesystem scheme 'nosuchfs'"):
        st.filesystem("nosuchfs://x", "--store")
