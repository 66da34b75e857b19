"""`maxit run --store URL`: the URL is the store of record, the run works in a local working copy.

End to end on fsspec's in-memory filesystem (in-process: it is one process's) and on `file://`:
the tables read back from the URL equal a local-store run's with the same seed, and a run resumed
with its working copy wiped (a fresh machine) keeps the complete round the URL holds, fetches its
checkpoint and runs only the next round. Then the pieces: what is uploaded and in which order,
what a crash mid-upload leaves, the registry on a URL, and bad URLs refused before anything is
written. s3 and gs are not installed here: their logic (one object per table, no rename, a
bucket) is exercised through memory:// and a registered object-store-like filesystem."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import fsspec
import polars as pl
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from pipeline import store as st
from pipeline.store import url as stu
from pipeline.errors import ConfigError, DataError
from pipeline.store.registry import PolicyRegistry

TABLES = ("problems", "steps", "advantages", "training_view", "ratio_diagnostics", "evaluation", "rollout_shards", "timings")
VARYING = {"rollout_shards": ("pid", "host", "started", "finished"), "timings": ("seconds",)}
"""Columns that record the machine and the clock, not the run's results."""


def run_args(store: str, model_dir: Path, rounds: int) -> list[str]:
    return [
        "run", "--rounds", str(rounds), "--store", store, "--engine", "hf", "--model-dir", str(model_dir),
        "--problems", "4", "--samples", "2", "--strategies", "iid", "tree", "--max-loop-num", "1",
        "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1", "--minibatch-size", "64", "--micro-batch-size", "32",
    ]


def memory_url() -> str:
    return f"memory://maxit-run-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A project cache of the test's own (working copies go under it)."""
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def results(store, rounds) -> dict:
    """The tables of `rounds`, without what records the machine and the clock. The timings keep
    their stages, not the engine starts and swaps, which depend on what the process had before
    (a resumed run on a fresh machine builds an engine a one-process run already has; round -1
    taken from the evaluation cache builds none)."""
    from pipeline.run.timings import SUBSTAGES

    out = {}
    for r in rounds:
        for t in TABLES:
            path = st.table_path(store, r, t)
            if st.exists(path):
                table = st.read_table(path).drop(VARYING.get(t, ()))
                out[(r, t)] = table.filter(~pl.col("stage").is_in(SUBSTAGES)) if t == "timings" else table
    return out


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, default_model_dir):
    from maxit.cli import main

    store = tmp_path_factory.mktemp("local") / "store"
    assert main(run_args(str(store), default_model_dir, 2)) == 0
    return results(store, (-1, 0, 1))


def cat(url: str) -> bytes:
    fs, path = st.filesystem(url)
    return fs.cat_file(path)


def object_versions(url: str, prefix: str) -> dict:
    fs, base = st.filesystem(url)
    return {k: stu._fingerprint(v) for k, v in fs.find(f"{base.rstrip('/')}/{prefix}", detail=True).items()}


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_run_on_a_url_store_equals_a_local_run_and_resumes_on_a_fresh_machine(kind, tmp_path, cache, local_run, default_model_dir):
    from maxit.cli import main

    url = memory_url() if kind == "memory" else f"file://{tmp_path}/url-store"
    assert main(run_args(url, default_model_dir, 1)) == 0
    copy = st.working_copy(url)
    assert copy.is_relative_to(cache) and (copy / ".dagster").is_dir()  # the Dagster instance is local
    round0 = object_versions(url, "round=0")
    entry0 = cat(f"{url}/checkpoints/registry/round=0/shared.json")
    assert json.loads(entry0)["path"] == f"{st.canonical_url(url)}/checkpoints/round=0/shared"
    assert st.exists(f"{url}/checkpoints/round=0/shared/maxit_checkpoint.json")
    assert json.loads(cat(f"{url}/experiment.json"))["store"] == st.canonical_url(url)

    shutil.rmtree(copy)  # a fresh machine: no working copy, no Dagster instance, no checkpoint
    assert main(run_args(url, default_model_dir, 2)) == 0
    assert object_versions(url, "round=0") == round0, "the complete round 0 was not re-run"
    assert cat(f"{url}/checkpoints/registry/round=0/shared.json") == entry0
    # round 1 sampled with round 0's checkpoint, fetched from the URL into the working copy
    assert (copy / "checkpoints" / "round=0" / "shared" / "maxit_checkpoint.json").is_file()
    got = results(url, (-1, 0, 1))
    assert got.keys() == local_run.keys()
    for key, table in local_run.items():
        assert got[key].equals(table), f"{key} differs from the local run's"


def test_a_restart_stopped_mid_round_leaves_the_round_incomplete_at_the_url(tmp_path, cache, default_model_dir, monkeypatch):
    """--restart re-runs a complete round; stopped before its evaluation, the URL must not show the
    old evaluation beside the new tables: the round is incomplete and the next run re-runs it."""
    import assets.evaluation
    from maxit.cli import main

    url = memory_url()
    assert main(run_args(url, default_model_dir, 1)) == 0
    before = object_versions(url, "round=0")

    def stopped(ctx, round_):
        raise RuntimeError("stopped before the evaluation")

    with monkeypatch.context() as m:
        m.setattr(assets.evaluation, "stage_evaluation", stopped)
        assert main([*run_args(url, default_model_dir, 1), "--restart"]) == 2
    after = object_versions(url, "round=0")
    evaluation = next(k for k in before if k.endswith("round=0/evaluation.parquet"))
    steps = next(k for k in before if k.endswith("round=0/steps.parquet"))
    assert evaluation not in after and after[steps] != before[steps]
    assert main(run_args(url, default_model_dir, 1)) == 0  # not complete: re-run
    assert st.exists(st.table_path(url, 0, "evaluation"))


def fill(copy: Path, r: int, tables=("problems", "steps", "timings", "evaluation")) -> None:
    for t in tables:
        st.write_table(pl.DataFrame({"round": [r], "x": [t]}), st.table_path(copy, r, t))


def test_push_uploads_what_changed_one_object_each_with_the_evaluation_last(tmp_path):
    url = st.UrlStore(memory_url(), tmp_path / "copy")
    fill(url.local, -1, ("evaluation", "timings"))
    fill(url.local, 0)
    order = []
    real = stu.write_bytes

    def recording(target, body):
        order.append(target.split("/", 3)[-1])
        return real(target, body)

    stu.write_bytes = recording
    try:
        assert url.push([-1, 0]) == order
        assert order[-2:] == ["round=-1/evaluation.parquet", "round=0/evaluation.parquet"]
        assert len(order) == 6
        assert url.push([-1, 0]) == []  # nothing changed, nothing uploaded
        st.write_table(pl.DataFrame({"round": [0], "x": ["again"]}), st.table_path(url.local, 0, "steps"))
        assert url.push([-1, 0]) == ["round=0/steps.parquet"]
    finally:
        stu.write_bytes = real
    assert st.read_table(st.table_path(url.url, 0, "steps"))["x"].to_list() == ["again"]
    # a fresh working copy downloads everything; an unchanged one nothing
    other = st.UrlStore(url.url, tmp_path / "fresh")
    assert other.pull()["downloaded"] == 6
    assert other.pull() == {"downloaded": 0, "deleted": 0, "kept": 6}
    assert st.read_table(st.table_path(other.local, 0, "steps"))["x"].to_list() == ["again"]


def test_a_crash_mid_upload_leaves_the_round_incomplete_and_a_resume_drops_the_unsent_tables(tmp_path):
    """The URL never holds a round's evaluation without its other tables; what the working copy
    had and the URL did not is dropped when a run starts (the URL is the store of record)."""
    from pipeline.run.rounds import round_complete

    url = st.UrlStore(memory_url(), tmp_path / "copy")
    fill(url.local, 0)
    real = stu.write_bytes

    def failing(target, body):
        if target.endswith("round=0/timings.parquet"):
            raise ConnectionError("connection reset")
        return real(target, body)

    stu.write_bytes = failing
    try:
        with pytest.raises(ConnectionError):
            url.push([0])
    finally:
        stu.write_bytes = real
    assert st.exists(st.table_path(url.url, 0, "problems"))
    assert not st.exists(st.table_path(url.url, 0, "evaluation"))  # the marker goes last: never sent
    assert round_complete(st.Tables(url.local), 0)  # the working copy believes it...
    counts = url.pull(reconcile=True)  # ...until a run starts and makes it the URL's again
    assert counts["deleted"] == 2 and not round_complete(st.Tables(url.local), 0)
    assert sorted(p.name for p in (url.local / "round=0").glob("*.parquet")) == ["problems.parquet", "steps.parquet"]


def checkpoint(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(tag.encode() * 100)
    (path / "maxit_checkpoint.json").write_text(json.dumps({"created": tag}))
    return path


def test_registry_on_a_url_uploads_checkpoints_and_fetches_them_on_another_machine(tmp_path):
    url = memory_url()
    base = checkpoint(tmp_path / "base", "base")
    here = PolicyRegistry(url, local=tmp_path / "here")
    here.base("shared", base)
    trained = checkpoint(tmp_path / "here" / "checkpoints" / "round=0" / "shared", "r0")
    rec = here.register(0, "shared", trained, parent=base, data_hash="h")
    assert Path(rec.path) == trained
    entry = json.loads(cat(f"{url}/checkpoints/registry/round=0/shared.json"))
    assert entry["path"] == f"{url}/checkpoints/round=0/shared" and entry["parent"] == str(base.resolve())

    there = PolicyRegistry(url, local=tmp_path / "there")  # another machine: an empty working copy
    assert [r.round for r in there.records("shared")] == [-1, 0]
    assert not (tmp_path / "there" / "checkpoints").exists()  # listing fetches nothing
    path = there.latest("shared", 1)
    assert path == tmp_path / "there" / "checkpoints" / "round=0" / "shared"
    assert (path / "model.safetensors").read_bytes() == b"r0" * 100
    assert there.latest("shared", 0) == base.resolve()  # the base model is not uploaded

    # round 0 re-trained elsewhere: the stale copy is replaced (its marker differs from the URL's)
    again = checkpoint(tmp_path / "elsewhere", "r0-again")
    here.register(0, "shared", again)
    assert (there.get(0, "shared") and (path / "model.safetensors").read_bytes() == b"r0-again" * 100)

    # an upload cut short (files without the marker) is not followed, and nothing is registered
    fs, p = st.filesystem(url)
    real_open = fs.open

    def dying_open(name, mode="rb", **kw):
        if "w" in mode and name.endswith("maxit_checkpoint.json"):
            raise ConnectionError("connection reset")
        return real_open(name, mode, **kw)

    fs.open = dying_open
    try:
        with pytest.raises(ConnectionError):
            here.register(1, "shared", checkpoint(tmp_path / "r1", "r1"))
    finally:
        del fs.open
    assert here.get(1, "shared") is None and here.latest("shared", 2) == trained
    with pytest.raises(DataError, match="not a complete checkpoint"):
        st.fetch_dir(f"{url}/checkpoints/round=1/shared", tmp_path / "r1-copy")


class UnreachableFileSystem(MemoryFileSystem):
    """An object store whose endpoint does not answer."""

    protocol = "unreachablefs"

    @classmethod
    def _strip_protocol(cls, path):
        return "/" + path.split("://", 1)[-1].lstrip("/")

    @staticmethod
    def split_path(path):
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, None

    def exists(self, path, **kwargs):
        raise ConnectionError("Could not connect to the endpoint URL")


class BucketlessFileSystem(UnreachableFileSystem):
    """An object store that answers, where no bucket exists."""

    protocol = "bucketlessfs"

    def exists(self, path, **kwargs):
        return False


@pytest.fixture
def fake_object_stores():
    fsspec.register_implementation("unreachablefs", UnreachableFileSystem, clobber=True)
    fsspec.register_implementation("bucketlessfs", BucketlessFileSystem, clobber=True)


BAD_STORES = [
    ("nosuchfs://bucket/run", [], "--store nosuchfs://bucket/run: unknown filesystem scheme 'nosuchfs'"),
    ("s3://bucket/run", [], "--store s3://bucket/run: the 's3' filesystem needs a package that is not installed"),
    ("gs://bucket/run", [], "--store gs://bucket/run: the 'gs' filesystem needs a package that is not installed"),
    ("unreachablefs://bucket/run", [], "--store unreachablefs://bucket/run: cannot be reached (ConnectionError: Could not connect to the endpoint URL)"),
    ("bucketlessfs://bucket/run", [], "--store bucketlessfs://bucket/run: bucket 'bucket' does not exist"),
    ("memory://run", ["--shards", "2"], "--store memory://run: the memory filesystem is one process's"),
]


@pytest.mark.parametrize(
    "command, store, extra, message",
    [("run", *case) for case in BAD_STORES] + [("rollout", *case) for case in BAD_STORES if not case[1]],  # --shards: maxit run's
)
def test_bad_store_urls_are_one_line_errors_and_nothing_is_written(command, store, extra, message, cache, monkeypatch, capsys, fake_object_stores):
    from maxit.cli import main

    # s3fs and gcsfs as if not installed, whatever this machine has
    monkeypatch.setitem(sys.modules, "s3fs", None)
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    assert main([command, "--store", store, "--problems", "2", "--samples", "2", "--engine", "hf", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not cache.exists()  # no working copy
    memory = MemoryFileSystem()
    assert not memory.exists("/run") and not memory.exists("/bucket")  # nothing at the URL


def test_the_store_url_check_names_a_file_and_a_bare_memory_root(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=f"--store file://{tmp_path}/f: is an existing file, not a folder"):
        st.check_store_url(f"file://{tmp_path}/f")
    with pytest.raises(ConfigError, match="give a folder"):
        st.check_store_url("memory://")


def test_the_working_copy_is_one_folder_per_store_under_the_project_cache(cache):
    from pipeline.models import default_cache_dir

    assert st.cache_root() == default_cache_dir()  # the one rule, repeated without importing the models
    a = st.working_copy("memory://run")
    assert a == st.working_copy("memory://run/") and a.parent == cache / "stores" and a.name.startswith("memory-run-")
    assert st.working_copy("s3://bucket/run") != st.working_copy("gs://bucket/run")
    assert st.working_copy("file:///tmp/a/../b") == st.working_copy("file:///tmp/b")


def test_rollout_and_sql_on_a_url_store(tmp_path, cache, default_model_dir, capsys):
    """`maxit rollout --store URL` uploads the round's tables (the same rows as on a local store);
    `maxit sql --store URL` queries them through the working copy."""
    from maxit.cli import main

    flags = ["--round", "0", "--problems", "3", "--samples", "2", "--strategies", "iid", "--engine", "hf", "--model-dir", str(default_model_dir)]
    url = memory_url()
    assert main(["rollout", "--store", url, *flags]) == 0
    assert main(["rollout", "--store", str(tmp_path / "local"), *flags]) == 0
    for table in ("problems", "steps"):
        assert st.read_table(st.table_path(url, 0, table)).equals(st.read_table(st.table_path(tmp_path / "local", 0, table)))
    shutil.rmtree(st.working_copy(url))
    capsys.readouterr()
    assert main(["sql", "SELECT count(*) AS n FROM steps", "--store", url]) == 0
    rows = st.read_table(st.table_path(url, 0, "steps")).height
    assert f"│ {rows} " in capsys.readouterr().out


def test_a_pull_never_reverts_a_table_written_here_and_not_yet_uploaded(tmp_path):
    """The trainer lane pulls the working copy while the sampler has rewritten a table there and
    not uploaded it yet: the pull keeps the newer local table; a run's start (`reconcile`) takes
    the URL's, which is the store of record."""
    url = st.UrlStore(memory_url(), tmp_path / "copy")
    fill(url.local, 0)
    url.push([0])
    path = st.table_path(url.local, 0, "steps")
    st.write_table(pl.DataFrame({"round": [0], "x": ["newer"]}), path)  # rewritten, not yet pushed
    other = st.UrlStore(url.url, url.local)  # another process of the same run
    counts = other.pull()
    assert st.read_table(path)["x"].to_list() == ["newer"]
    assert counts["downloaded"] == 0
    assert other.push([0]) == ["round=0/steps.parquet"]  # still seen as changed: uploaded next
    assert st.read_table(st.table_path(url.url, 0, "steps"))["x"].to_list() == ["newer"]
    st.write_table(pl.DataFrame({"round": [0], "x": ["unsent"]}), path)
    assert url.pull(reconcile=True)["downloaded"] == 1
    assert st.read_table(path)["x"].to_list() == ["newer"]


def test_pulls_and_pushes_of_one_working_copy_keep_every_manifest_entry(tmp_path):
    """Threads of one run pushing different tables of one working copy at once: each upload
    stays in the manifest (its read-modify-write is under the working copy's sync lock), so a
    later pull downloads none of them again."""
    import threading

    url = st.UrlStore(memory_url(), tmp_path / "copy")
    real_save = st.UrlStore._save_manifest

    def slow_save(self, manifest):  # widen the window between reading the manifest and writing it
        import time

        time.sleep(0.05)
        real_save(self, manifest)

    st.UrlStore._save_manifest = slow_save
    try:
        for r in range(4):
            fill(url.local, r)
        threads = [threading.Thread(target=st.UrlStore(url.url, url.local).push, args=([r],)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        st.UrlStore._save_manifest = real_save
    manifest = json.loads((url.local / stu.SYNC_MANIFEST).read_text())
    assert len(manifest) == 4 * 4
    assert url.pull()["downloaded"] == 0 and url.push() == []
