"""One writer per store (pipeline/store/lock.py): a second writer is refused at once with an error
naming the first, a killed writer's lock does not outlive it, one process and the processes of
one run share the lock, and `maxit run` and Dagster materializations take it."""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from assets import instance as store_instance
from assets.instance import dagster_home, instance_at
from assets.resources import PolicyRegistryResource, StoreResource
from pipeline.store.lock import LOCK_FILE, TOKEN_ENV, StoreLocked, acquire, command_line, holder, token_in_env, writer_lock

PROJECT = Path(__file__).resolve().parents[1]
MAXIT = str(Path(sys.executable).with_name("maxit"))

HOLD = """
import sys, time
sys.path.insert(0, {project!r})
from pipeline.store.lock import acquire, StoreLocked
try:
    lock = acquire({store!r}, command={command!r}, token={token!r})
except StoreLocked as err:
    print("refused:", err, flush=True)
    sys.exit(3)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin (or kills us)
lock.release()
"""


def hold(store: Path, command: str = "a test's holder", token: str | None = None) -> subprocess.Popen:
    """A process that takes the store's lock and keeps it until its stdin closes; returns once
    it holds the lock (or was refused: then it has exited with code 3)."""
    code = HOLD.format(project=str(PROJECT), store=str(store), command=command, token=token)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # a writer of its own unless `token` says otherwise
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    first = proc.stdout.readline()
    assert first.startswith(("held", "refused")), first
    if first.startswith("refused"):
        proc.wait(timeout=30)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=30)


def free(store: Path) -> bool:
    """True when another process can take the lock now (asked from a fresh process, so this
    process's own hold does not answer for it)."""
    probe = hold(store, command="probe")
    refused = probe.poll() is not None
    stop(probe)
    return not refused


# -- the lock ---------------------------------------------------------------------------------


def test_the_lock_names_its_holder_and_is_released(tmp_path):
    store = tmp_path / "store"
    with writer_lock(store, command="maxit run --rounds 5") as lock:
        h = holder(store)
        assert h is not None and h.pid == os.getpid() and h.host == socket.gethostname()
        assert h.command == "maxit run --rounds 5" and h.token == lock.token
        assert abs(dt.datetime.fromisoformat(h.since) - dt.datetime.now().astimezone()) < dt.timedelta(minutes=1)
        # the file holds the details for the error of a process that is refused
        assert json.loads((store / LOCK_FILE).read_text())["pid"] == os.getpid()
        assert not free(store)
    assert holder(store) is None and free(store)


def test_a_second_process_is_refused_with_a_one_line_error_naming_the_first(tmp_path):
    store = tmp_path / "store"
    first = hold(store, command="maxit run --rounds 5 --store runs/x")
    try:
        with pytest.raises(StoreLocked) as refused:
            acquire(store)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(f"store {store} is being written by pid {first.pid} on {socket.gethostname()} (maxit run --rounds 5 --store runs/x), since ")
        assert refused.value.holder.pid == first.pid
    finally:
        stop(first)
    with writer_lock(store):  # free again once the first let go
        assert holder(store).pid == os.getpid()


def test_a_killed_holder_does_not_block_the_next_writer(tmp_path):
    store = tmp_path / "store"
    first = hold(store)
    assert holder(store).pid == first.pid
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    # its details are still in the file, but the kernel released its flock when it died
    assert json.loads((store / LOCK_FILE).read_text())["pid"] == first.pid
    assert holder(store) is None
    with writer_lock(store, command="the next run"):
        assert holder(store).command == "the next run"


def test_re_entrant_within_one_process(tmp_path):
    store = tmp_path / "store"
    outer = acquire(store, command="outer")
    inner = acquire(store, command="inner")  # maxit run's own Dagster resources do this
    assert inner.token == outer.token and holder(store).command == "outer"
    inner.release()
    assert not free(store)  # the outer hold remains
    inner.release()  # a second release of one hold changes nothing
    assert not free(store)
    outer.release()
    assert free(store)


def test_processes_of_one_writer_share_the_lock_by_token(tmp_path):
    store = tmp_path / "store"
    first = hold(store, command="maxit run --shards 2", token="run-1")
    try:
        joined = acquire(store, token="run-1")  # a step process of the same run
        other = hold(store, token="run-2")
        assert other.wait(timeout=30) == 3  # another writer is refused
        # the first holder dies; the step that joined it still holds the lock, and the
        # error says the named holder has exited
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        third = subprocess.run(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(PROJECT)!r})\nfrom pipeline.store.lock import acquire\nacquire({str(store)!r}, token='run-3')"],
            capture_output=True, text=True, timeout=60,
        )
        assert third.returncode != 0 and "which has exited while processes it started still hold the lock" in third.stderr
        joined.release()
        assert free(store)
    finally:
        stop(first)


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    """A child forked while the lock is held (an engine worker, say) must not hold the store
    after its parent lets go."""
    store = tmp_path / "store"
    lock = acquire(store)
    pid = os.fork()
    if pid == 0:  # the child: outlive the parent's hold
        time.sleep(20)
        os._exit(0)
    try:
        lock.release()
        assert free(store)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_token_env_is_set_for_the_block_only(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with token_in_env("abc"):
        assert os.environ[TOKEN_ENV] == "abc"
    assert TOKEN_ENV not in os.environ
    monkeypatch.setenv(TOKEN_ENV, "outer")
    with token_in_env("inner"):
        assert os.environ[TOKEN_ENV] == "inner"
    assert os.environ[TOKEN_ENV] == "outer"


def test_command_line_names_the_program_not_its_path():
    assert command_line(["/work/main/.venv/bin/maxit", "run", "--rounds", "5"]) == "maxit run --rounds 5"


# -- Dagster materializations -------------------------------------------------------------------


@dg.asset
def probe(store: StoreResource, policy_registry: PolicyRegistryResource) -> str:
    """Who holds the store while a step runs (both resources hold it: the registry's nests the store)."""
    h = holder(store.root())
    return f"{h.pid} {h.command}" if h else "free"


def store_resources(store: Path) -> dict:
    res = StoreResource(path=str(store))
    return {"store": res, "policy_registry": PolicyRegistryResource(store=res)}


def test_a_materialization_holds_the_lock_while_it_runs(tmp_path):
    """As a run the UI starts: nothing holds the lock before; the step holds it, named as its
    Dagster run; it is free after."""
    store = tmp_path / "store"
    result = dg.materialize([probe], resources=store_resources(store))
    assert result.success
    assert result.output_for_node("probe") == f"{os.getpid()} Dagster run {result.run_id} of job __ephemeral_asset_job__"
    assert free(store)


def test_a_materialization_inside_maxit_runs_own_lock_does_not_deadlock(tmp_path):
    store = tmp_path / "store"
    with writer_lock(store, command="maxit run --rounds 1"):
        result = dg.materialize([probe], resources=store_resources(store))
        assert result.success and result.output_for_node("probe") == f"{os.getpid()} maxit run --rounds 1"
        assert not free(store)
    assert free(store)


def test_a_materialization_is_refused_while_another_process_writes_the_store(tmp_path):
    store = tmp_path / "store"
    other = hold(store, command="maxit run --rounds 5")
    try:
        result = dg.materialize([probe], resources=store_resources(store), raise_on_error=False)
    finally:
        stop(other)
    assert not result.success
    failures = " ".join(str(e.event_specific_data.error.to_string()) for e in result.all_events if e.is_failure and getattr(e.event_specific_data, "error", None))
    assert f"is being written by pid {other.pid}" in failures and "(maxit run --rounds 5)" in failures


def record_holder_beside(store: StoreResource, me: str, other: str) -> None:
    """Record who holds the store, once the other probe step holds it too: the two steps hold
    it at the same time (or the other never comes, and the test fails on its missing record)."""
    root = store.root()
    (root / f"started-{me}").touch()
    deadline = time.time() + 120
    while not (root / f"started-{other}").exists() and time.time() < deadline:
        time.sleep(0.1)
    h = holder(root)
    (root / f"seen-{me}-{os.getpid()}").write_text(json.dumps({"holder_pid": h.pid, "command": h.command, "both": (root / f"started-{other}").exists()}))


@dg.asset
def probe_a(store: StoreResource) -> None:
    record_holder_beside(store, "a", "b")


@dg.asset
def probe_b(store: StoreResource) -> None:
    record_holder_beside(store, "b", "a")


def multiprocess_probe_job():
    """Two probe steps on the multiprocess executor (each in its own process, both at once), on
    the store named by $PROBE_STORE."""
    defs = dg.Definitions(
        assets=[probe_a, probe_b], jobs=[dg.define_asset_job("probe_job", selection=["probe_a", "probe_b"])],
        resources={"store": StoreResource(path=os.environ["PROBE_STORE"])}, executor=dg.multiprocess_executor.configured({"max_concurrent": 2}),
    )
    return defs.resolve_job_def("probe_job")


def run_multiprocess_probe(store: Path, tmp_path: Path):
    os.environ["PROBE_STORE"] = str(store)
    try:
        instance = instance_at(dagster_home(tmp_path / "instance-store"))  # a run of its own, as a store's instance has
        try:
            # the step processes import this module by name from the tests folder
            job = dg.build_reconstructable_job("test_lock", "multiprocess_probe_job", reconstructor_working_directory=str(PROJECT / "tests"))
            result = dg.execute_job(job, instance=instance, raise_on_error=False)
            events = result.all_events
        finally:
            instance.dispose()
    finally:
        del os.environ["PROBE_STORE"]
    seen = [json.loads(p.read_text()) | {"pid": int(p.name.rsplit("-", 1)[1])} for p in sorted(store.glob("seen-*"))]
    return result, events, seen


def test_step_processes_of_maxit_run_join_its_lock(tmp_path):
    """`maxit run --shards N`: its steps run in processes of their own, which join the run's
    lock (the token it puts in the environment) instead of being refused."""
    store = tmp_path / "store"
    with writer_lock(store, command="maxit run --shards 2") as lock, token_in_env(lock.token):
        result, _events, seen = run_multiprocess_probe(store, tmp_path)
        assert not free(store)
    assert result.success
    assert len(seen) == 2 and all(s["pid"] != os.getpid() and s["both"] for s in seen)
    assert all(s["holder_pid"] == os.getpid() and s["command"] == "maxit run --shards 2" for s in seen)
    assert free(store)


def test_steps_of_one_dagster_run_share_the_lock_and_refuse_another_writer(tmp_path):
    """A UI run on the multiprocess executor: its two concurrent steps share the lock (by run
    id); a writer of another run is refused while they hold it."""
    store = tmp_path / "store"
    result, _events, seen = run_multiprocess_probe(store, tmp_path)
    assert result.success and len(seen) == 2 and all(s["both"] for s in seen)
    assert len({s["command"] for s in seen}) == 1 and seen[0]["command"] == f"Dagster run {result.run_id} of job probe_job"
    assert free(store)
    other = hold(store, command="maxit run --rounds 5")
    try:
        refused, events, _seen = run_multiprocess_probe(store, tmp_path)
    finally:
        stop(other)
    assert not refused.success
    errors = " ".join(e.event_specific_data.error.to_string() for e in events if e.is_failure and getattr(e.event_specific_data, "error", None))
    assert f"is being written by pid {other.pid}" in errors


# -- maxit run ----------------------------------------------------------------------------------


def run_cmd(store: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        MAXIT, "run", "--rounds", "1", "--store", str(store), "--engine", "hf", "--model-dir", str(model_dir),
        "--problems", "4", "--samples", "2", "--eval-problems", "6", "--eval-samples", "1", "--epochs", "1", *extra,
    ]


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_second_maxit_run_exits_2_naming_the_writer_and_writes_nothing(tmp_path, default_model_dir):
    store = tmp_path / "store"
    (store / "round=0").mkdir(parents=True)
    (store / "experiment.json").write_text('{"settings": {}}\n')  # what a first run left
    first = hold(store, command="maxit run --rounds 5 --store runs/x")
    try:
        since = holder(store).since
        before = snapshot(store)
        proc = subprocess.run(run_cmd(store, default_model_dir), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        after = snapshot(store)
    finally:
        stop(first)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [
        f"maxit run: error: store {store} is being written by pid {first.pid} on {socket.gethostname()} (maxit run --rounds 5 --store runs/x), "
        f"since {since}; wait for it to finish, or stop it"
    ]
    assert after == before  # no log, no Dagster instance, no experiment record, no table
    assert not (store / ".dagster").exists() and not (store / "maxit.log").exists()


@pytest.fixture(scope="module")
def killed_then_run(tmp_path_factory, default_model_dir):
    """A real `maxit run` that holds the store, a second one refused while it does, the first
    killed (SIGKILL, its whole process group) mid-run, and a third that then runs to the end."""
    root = tmp_path_factory.mktemp("lock-runs")
    store = root / "store"
    console = root / "first.console"
    with open(console, "w") as out:
        first = subprocess.Popen(run_cmd(store, default_model_dir), cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while (h := holder(store)) is None or h.pid != first.pid:
            assert first.poll() is None, f"the first maxit run ended before it held the store:\n{console.read_text()[-3000:]}"
            assert time.time() < deadline, "the first maxit run did not take the store within 5 minutes"
            time.sleep(0.2)
        second = subprocess.run(run_cmd(store, default_model_dir), cwd=root, capture_output=True, text=True, timeout=300)
        assert first.poll() is None, f"the first run ended while the second was refused (the test proves nothing):\n{console.read_text()[-3000:]}"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    third = subprocess.run(run_cmd(store, default_model_dir), cwd=root, capture_output=True, text=True, timeout=900)
    return store, first, second, third


def test_a_live_maxit_run_refuses_a_second(killed_then_run):
    store, first, second, _third = killed_then_run
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"maxit run: error: store {store} is being written by pid {first.pid} on {socket.gethostname()} (maxit run --rounds 1 --store {store} " in second.stderr
    assert "Traceback" not in second.stderr
    # the log's run headers: the first run's and the third's, none of the refused one
    headers = re.findall(r"^=== .* pid (\d+): ", (store / "maxit.log").read_text(), re.M)
    assert len(headers) == 2 and headers[0] == str(first.pid)


def test_a_killed_maxit_runs_lock_does_not_block_the_next(killed_then_run):
    store, _first, _second, third = killed_then_run
    assert third.returncode == 0, third.stderr[-3000:]
    assert (store / "round=0" / "evaluation.parquet").is_file()
    assert holder(store) is None  # released at the end


def test_the_next_run_prints_one_line_per_round_and_the_table_once(killed_then_run):
    """The console of the run after the killed one (a normal run: this saves a run of its own):
    one line per finished round that fits 120 columns, the table once at the end (the numbers a
    user watches, within 120 columns too)."""
    _store, _first, _second, third = killed_then_run
    lines = third.stdout.splitlines()
    rounds = [line for line in lines if line.startswith("round ") and " | " in line]  # not the table's header
    assert len(rounds) == 1 and len(rounds[0]) <= 120, rounds
    assert re.fullmatch(r"round 0 \| solver_acc \d+\.\d% \([+-]\d+\.\d since start\) \| greedy \d+\.\d% \| \d+ rows/\d+ steps? \| \d+s, \d+s in all \| peak \d+ MB", rounds[0])
    assert not any(line.startswith("after round") for line in lines)
    table_top = [i for i, line in enumerate(lines) if line.startswith("maxit run: 1 round(s)")]
    assert len(table_top) == 1 and table_top[0] > lines.index(rounds[0])
    header = lines[table_top[0] + 1]  # the title, the table's header
    for column in ("round", "solver_acc", "verifier_bal_acc", "train_rows", "seconds"):
        assert column in header.split(), header
    assert max(map(len, lines)) <= 120


def test_an_instance_half_created_by_a_killed_run_is_created_again(tmp_path):
    """A run killed while Dagster was creating the store's event index (its tables made, its schema
    version not yet stamped) must not leave every later run failing on a missing table; the
    databases already stamped, with their runs, stay as they are."""
    import sqlite3

    home = dagster_home(tmp_path / "store")
    instance = instance_at(home)
    instance.add_dynamic_partitions("rounds", ["0"])
    instance.run_storage.set_cursor_values({"kept": "yes"})  # a row in the runs database, which is complete
    instance.dispose()
    with contextlib.closing(sqlite3.connect(home / "history/runs/index.db")) as conn:  # the killed run's state
        conn.execute("drop table dynamic_partitions")
        conn.execute("drop table alembic_version")
        conn.commit()
    instance = instance_at(home)
    try:
        assert not instance.has_dynamic_partition("rounds", "0")
        instance.add_dynamic_partitions("rounds", ["0"])
        assert instance.has_dynamic_partition("rounds", "0")
        assert instance.run_storage.get_cursor_values({"kept"}) == {"kept": "yes"}
    finally:
        instance.dispose()
    # an unstamped database that holds rows (written by a Dagster that did not stamp) is kept
    kept = tmp_path / "other" / ".dagster"
    (kept / "history/runs").mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(kept / "history/runs/index.db")) as conn:
        conn.execute("create table event_logs (id integer)")
        conn.execute("insert into event_logs values (1)")
        conn.commit()
    (kept / "schedules").mkdir()
    (kept / "schedules/schedules.db").write_text("not a database")
    store_instance._drop_half_created(kept)
    assert (kept / "history/runs/index.db").exists() and not (kept / "schedules/schedules.db").exists()
