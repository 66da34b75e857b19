"""URL stores on a real S3 API: moto's S3 server on 127.0.0.1, started and stopped by this module
(tests/s3server.py), reached through `AWS_ENDPOINT_URL` as a user's run reaches S3, MinIO or R2.

The writer's lease first (seconds each): conditional puts make one lease of a race, the holder
renews it while it lives, a second writer from another cache folder (another machine) is refused
with the lock's one-line error naming the holder's host and process, and takes over once the
holder's lease expires, or at once when it is released, or when the dead holder was on this
machine's same working copy. Then whole rounds (integration): a round completes to
`s3://bucket/run` with every table and checkpoint in the bucket, its evaluation last; a resume
from an empty working copy keeps it; a writer killed with SIGKILL while its round's completion
marker is in flight, then a rerun, leaves the same rows as the clean run, none missing or twice."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import polars as pl
import pytest

from pipeline import store as st
from pipeline.store import lease as leases
from pipeline.store.lock import TOKEN_ENV, StoreLocked, acquire, holder
from s3server import S3Server
from test_lock import HOLD

PROJECT = Path(__file__).resolve().parents[1]
MAXIT = str(Path(sys.executable).with_name("maxit"))
BUCKET = "bucket"


@pytest.fixture(scope="module")
def s3():
    """The S3 server, this process pointed at it; one bucket. Afterwards fsspec forgets s3fs
    (its class and its instances, which name this server), as later tests expect to find it."""
    from fsspec.registry import _registry

    known = {p: _registry[p] for p in ("s3", "s3a") if p in _registry}
    try:
        with S3Server() as server, server.environ():
            server.create_bucket(BUCKET)
            yield server
    finally:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        for protocol in ("s3", "s3a"):
            _registry.pop(protocol, None)
        _registry.update(known)


def fresh_url() -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"


def child_env(s3: S3Server, cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env.update(s3.env(), MAXIT_CACHE_DIR=str(cache), **{k: str(v) for k, v in extra.items()})
    return env


def hold(s3: S3Server, url: str, cache: Path, command: str = "maxit run --rounds 9", lease: float = 60, token: str | None = None) -> subprocess.Popen:
    """A process (of its own machine: cache folder `cache`) that takes the store's writer lock and
    keeps it until its stdin closes; returns once it holds it (or exited refused, code 3)."""
    code = HOLD.format(project=str(PROJECT), store=url, command=command, token=token)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env(s3, cache, MAXIT_LEASE_SECONDS=lease))
    first = proc.first_line = proc.stdout.readline()
    assert first.startswith(("held", "refused")), first
    if first.startswith("refused"):
        proc.wait(timeout=60)
    return proc


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


# -- the lease ----------------------------------------------------------------------------------


def record(token: str) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": f"writer {token}", "since": "now", "token": token}


def test_conditional_puts_make_one_lease_of_a_race(s3):
    url = st.canonical_url(fresh_url())
    won, refused = [], []
    start = threading.Barrier(8)

    def contend(i: int) -> None:
        start.wait()
        try:
            won.append(leases.take(url, record(f"t{i}"), seconds=30))
        except leases.LeaseHeld as err:
            refused.append(err.record["token"])

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(won) == 1 and len(refused) == 7, (won, refused)
        # every loser names the winner, whose record the object holds
        assert set(refused) == {won[0].token} and leases.read(url)[0]["token"] == won[0].token
    finally:
        for lease in won:
            lease.release(last=True)


def test_a_lease_is_renewed_while_held_and_taken_over_once_it_expires(s3, tmp_path):
    url = st.canonical_url(fresh_url())
    first = leases.take(url, record("first"), seconds=1.5)
    etag, expires = first.etag, first.record["expires"]
    time.sleep(2.5)  # longer than the lease: only the renewals keep it
    current, now_etag = leases.read(url)
    assert current["token"] == "first" and now_etag != etag and current["expires"] > expires
    with pytest.raises(leases.LeaseHeld):
        leases.take(url, record("second"), seconds=1.5)

    first._stop.set()  # the holder stops renewing (as a paused or dead one would)
    time.sleep(1.6)
    second = leases.take(url, record("second"), seconds=30)
    try:
        assert leases.read(url)[0]["token"] == "second"
        assert not first.renew() and "writer second" in first.lost  # If-Match on its old ETag fails
        # the first writer uploads nothing more: its next publish stops on the lost lease
        leases._HELD.setdefault(url, []).append(first)
        store = st.UrlStore(url, local=tmp_path / "copy")
        (tmp_path / "copy" / "round=0").mkdir(parents=True)
        pl.DataFrame({"a": [1]}).write_parquet(tmp_path / "copy" / "round=0" / "steps.parquet")
        with pytest.raises(leases.LeaseLost, match="lost the store's writer lease to pid .* \\(writer second\\)"):
            store.push([0])
        assert not s3.objects(BUCKET, url.split("/", 3)[3] + "/round=0")
    finally:
        leases._HELD.pop(url, None)
        second.release(last=True)


def fake_model(folder: Path) -> Path:
    """A folder that passes `maxit run`'s model check (nothing is loaded before the lock)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def second_run(s3: S3Server, url: str, cache: Path, model: Path) -> subprocess.CompletedProcess:
    return subprocess.run([MAXIT, "run", "--rounds", "1", "--store", url, "--engine", "hf", "--model-dir", str(model)],
                          capture_output=True, text=True, env=child_env(s3, cache), timeout=300)


@pytest.mark.integration  # processes of their own, each importing the library
def test_a_second_writer_from_another_machine_exits_2_naming_the_holder_and_takes_over_once_its_lease_expires(s3, tmp_path, monkeypatch):
    url = fresh_url()
    first = hold(s3, url, tmp_path / "machine-a", lease=1)
    try:
        time.sleep(3.5)  # three leases: the holder's renewals keep it
        run = second_run(s3, url, tmp_path / "machine-b", fake_model(tmp_path / "model"))
        assert run.returncode == 2, run.stderr
        error = run.stderr.strip().splitlines()[-1]
        assert error.startswith(f"maxit run: error: store {url} is being written by pid {first.pid} on {socket.gethostname()} (maxit run --rounds 9)"), error
        assert "its lease at the URL, renewed while it runs" in error and error.endswith("; wait for it to finish, or stop it")
        assert list(s3.objects(BUCKET, url.split("/", 3)[3])) == [f"{url.split('/', 3)[3]}/{leases.LEASE_OBJECT}"]  # nothing written
    finally:
        kill(first)
    # machine b takes over once the dead holder's lease has run out (a second at most)
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "machine-b"))
    deadline = time.time() + 30
    while True:
        try:
            lock = acquire(url, command="machine b")
            break
        except StoreLocked as err:
            assert err.holder.pid == first.pid and time.time() < deadline
            time.sleep(0.2)
    try:
        assert leases.read(st.canonical_url(url))[0]["command"] == "machine b" and holder(url).pid == os.getpid()
    finally:
        lock.release()
    assert leases.read(st.canonical_url(url))[0]["expires"] == 0  # released: the next writer need not wait


@pytest.mark.integration  # processes of their own, each importing the library
def test_a_writer_killed_on_this_machine_is_taken_over_at_once_from_its_working_copy(s3, tmp_path, monkeypatch):
    url = fresh_url()
    first = hold(s3, url, tmp_path / "machine-a", lease=600)
    kill(first)
    # another machine must wait the lease out: the dead holder may be on a machine it cannot see
    other = hold(s3, url, tmp_path / "machine-b")
    assert other.returncode == 3
    refusal = other.first_line
    assert f"pid {first.pid} on {socket.gethostname()}" in refusal and "which has exited here; its lease at the URL runs out by" in refusal
    # on its own working copy the flock shows that no process of that writer lives: no wait
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "machine-a"))
    with acquire(url, command="the rerun"):
        assert leases.read(st.canonical_url(url))[0]["command"] == "the rerun"


@pytest.mark.integration  # processes of their own, each importing the library
def test_the_processes_of_one_writer_share_its_lease(s3, tmp_path, monkeypatch):
    url = fresh_url()
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "machine-a"))
    with acquire(url, command="maxit run --shards 2") as lock:
        step = hold(s3, url, tmp_path / "machine-a", token=lock.token)  # a step process: same machine, same token
        try:
            assert step.returncode is None
            assert leases.read(st.canonical_url(url))[0]["token"] == lock.token
        finally:
            step.stdin.close()
            step.wait(timeout=60)
        # the step let go while the run still holds it: the lease stays the run's
        assert leases.read(st.canonical_url(url))[0]["expires"] > time.time()


# -- whole rounds (integration: `maxit run` on the default model, in processes of their own) -------


def run_round(s3: S3Server, url: str, cache: Path, model_dir: Path, rounds: int = 1) -> subprocess.Popen:
    from test_store_url import run_args

    return subprocess.Popen([MAXIT, *run_args(url, model_dir, rounds)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env(s3, cache))


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return out


def key(url: str, rel: str = "") -> str:
    """The object key of `rel` in the store at `url` (`s3://bucket/<prefix>`)."""
    prefix = url.split("/", 3)[3]
    return f"{prefix}/{rel}" if rel else prefix


def puts(s3: S3Server, since: int, url: str) -> list[str]:
    """Keys of the store put since request `since`, in order (the lease object's aside)."""
    head = f"{BUCKET}/{key(url)}/"
    return [k[len(head):] for m, k in s3.requests[since:] if m == "PUT" and k.startswith(head) and not k.endswith(leases.LEASE_OBJECT)]


@pytest.fixture(scope="module")
def first_round(s3, tmp_path_factory, default_model_dir):
    """`maxit run --rounds 1` to s3://bucket/run from machine A: (url, its working copy, the keys
    it put in order, the tables read back from the bucket)."""
    from test_store_url import results

    url, cache = f"s3://{BUCKET}/run", tmp_path_factory.mktemp("machine-a")
    since = len(s3.requests)
    finish(run_round(s3, url, cache, default_model_dir))
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MAXIT_CACHE_DIR", str(cache))
        copy = st.working_copy(url)
    return url, copy, puts(s3, since, url), results(url, (-1, 0))


def test_a_round_completes_to_s3_with_every_table_and_checkpoint_in_the_bucket(s3, first_round):
    url, copy, put, _ = first_round
    bucket = {k[len(key(url)) + 1:] for k in s3.objects(BUCKET, key(url))}
    tables = {p.relative_to(copy).as_posix() for p in copy.glob("round=*/*.parquet")}
    checkpoint = {p.relative_to(copy).as_posix() for p in (copy / "checkpoints" / "round=0").rglob("*") if p.is_file()}
    assert {"round=0/steps.parquet", "round=0/training_view.parquet", "round=0/evaluation.parquet", "round=-1/evaluation.parquet"} <= tables
    assert "checkpoints/round=0/shared/model.safetensors" in checkpoint
    assert tables | checkpoint | {"experiment.json", "checkpoints/registry/round=-1/shared.json", "checkpoints/registry/round=0/shared.json"} <= bucket
    for rel in tables | checkpoint:  # what the bucket holds is what the run wrote
        assert s3.client().get_object(Bucket=BUCKET, Key=key(url, rel))["Body"].read() == (copy / rel).read_bytes(), rel
    # published so that a reader never sees half a round: the checkpoint's files, its marker, its
    # registry entry, then the round's tables with its evaluation (the completion marker) last
    again = sorted({rel for rel in put if put.count(rel) > 1})
    assert all(rel.endswith("/timings.parquet") for rel in again), f"uploaded twice: {again}"  # timings grow stage by stage
    order = {rel: put.index(rel) for rel in put}  # the first upload of each
    files = [order[rel] for rel in checkpoint if not rel.endswith("maxit_checkpoint.json")]
    marker, entry = order["checkpoints/round=0/shared/maxit_checkpoint.json"], order["checkpoints/registry/round=0/shared.json"]
    evaluation = order["round=0/evaluation.parquet"]
    assert max(files) < marker < entry < evaluation
    assert max(i for rel, i in order.items() if rel.startswith("round=0/") and rel != "round=0/evaluation.parquet") < evaluation
    # after it, only the round's timings again, with the run's own row (as on a local store)
    assert put[evaluation + 1:] == ["round=0/timings.parquet"], put[evaluation:]


def test_a_resume_from_an_empty_working_copy_on_another_machine_keeps_the_complete_round(s3, first_round, tmp_path, default_model_dir):
    url = first_round[0]
    before = s3.objects(BUCKET, key(url))
    since = len(s3.requests)
    out = finish(run_round(s3, url, tmp_path / "machine-b", default_model_dir, rounds=2))
    after = s3.objects(BUCKET, key(url))
    redone = [rel for rel in puts(s3, since, url) if "round=0/" in rel or rel.startswith("round=-1/")]
    assert not redone, f"the complete round 0 was uploaded again: {redone}"
    kept = [k for k in before if not k.endswith((leases.LEASE_OBJECT, "/experiment.json"))]  # each run records itself
    assert {k: after.get(k) for k in kept} == {k: before[k] for k in kept}
    assert key(url, "round=1/evaluation.parquet") in after and key(url, "checkpoints/round=1/shared/maxit_checkpoint.json") in after
    assert "round 1 |" in out and "round 0 |" not in out  # only round 1 ran


def test_a_writer_killed_mid_upload_then_a_rerun_leaves_no_missing_or_duplicated_rows(s3, first_round, tmp_path, monkeypatch, default_model_dir):
    from pipeline.run.rounds import round_complete
    from test_store_url import results

    url, machine = f"s3://{BUCKET}/crash", tmp_path / "machine-c"
    writer = run_round(s3, url, machine, default_model_dir)
    marker = f"{BUCKET}/{key(url, 'round=0/evaluation.parquet')}"

    def kill_on_the_marker(method: str, path: str) -> str | None:
        if method == "PUT" and path == marker:  # the round's completion marker is in flight: kill -9
            os.kill(writer.pid, signal.SIGKILL)
            return "503 Slow Down"
        return None

    s3.hook = kill_on_the_marker
    try:
        writer.communicate(timeout=900)
    finally:
        s3.hook = None
    assert writer.returncode == -signal.SIGKILL
    held = s3.objects(BUCKET, key(url))
    assert key(url, "round=0/steps.parquet") in held and key(url, "round=0/evaluation.parquet") not in held
    # a reader on another machine sees an incomplete round, not half of one
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "reader"))
    reader = st.Tables(url)
    reader.pull(reconcile=True)
    assert reader.exists(0, "steps") and not round_complete(reader, 0)

    finish(run_round(s3, url, machine, default_model_dir))  # the rerun, on the killed writer's machine
    st.filesystem(url)[0].invalidate_cache()  # this process listed the killed run's objects
    got, clean = results(url, (-1, 0)), first_round[3]
    assert got.keys() == clean.keys()
    for name, table in clean.items():
        assert got[name].equals(table), f"{name} differs from the uninterrupted run's"
    steps = got[(0, "steps")]
    assert steps.height == clean[(0, "steps")].height and steps.unique().height == steps.height
