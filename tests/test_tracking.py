"""`pipeline.reporting.tracking`: a finished round logged to TensorBoard, MLflow and W&B (offline), read
back with each tool's own reader and compared with the store's tables.

One real round (`maxit run --rounds 1` on the default model, the smallest budget the other
end-to-end tests use) makes the store; each test logs into its own copy of it. Expected values
are computed here from the tables, not by the module under test."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest

from pipeline import store as st
from pipeline.errors import ConfigError, DataError, MaxitError
from pipeline.reporting.round_scalars import ratio_scalars, reward_scalars
from pipeline.reporting.tracking import STATE_FILE, check_targets, log_round

ROOT = Path(__file__).resolve().parents[1]
ALL = ("tensorboard", "mlflow", "wandb")


# -- the store --------------------------------------------------------------------------------


RUN_FLAGS = [
    "--engine", "hf", "--problems", "4", "--samples", "2", "--strategies", "iid", "tree", "--max-loop-num", "1",
    "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1", "--minibatch-size", "64", "--micro-batch-size", "32",
]


@pytest.fixture(scope="module")
def one_round(tmp_path_factory) -> Path:
    """A store after `maxit run --rounds 1`: round -1 (the starting model's evaluation) and round 0."""
    from maxit.cli import main
    from pipeline.models import default_cache_dir
    from pipeline.workflows.math.model import default_model

    store = tmp_path_factory.mktemp("tracking") / "store"
    argv = ["run", "--rounds", "1", "--store", str(store), "--model-dir", str(default_model(default_cache_dir())), *RUN_FLAGS]
    assert main(argv) == 0
    return store


@pytest.fixture
def store(one_round, tmp_path) -> Path:
    """A copy of the one-round store of this test's own (its Dagster instance left out)."""
    copy = tmp_path / "store"
    shutil.copytree(one_round, copy, ignore=shutil.ignore_patterns(".dagster"))
    return copy


@pytest.fixture
def no_network(monkeypatch):
    """Every connection this process opens to anything but loopback or a local socket is refused
    and recorded (W&B talks to its helper process over one of those)."""
    attempts: list = []
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"test: no network ({address})")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


def expected(store: Path, round_: int) -> dict[str, float]:
    """Names and values round `round_` should log, computed here from its tables (plain Python
    over rows where the module uses Polars expressions)."""
    out: dict[str, float] = {}
    for row in pl.read_parquet(st.table_path(store, round_, "evaluation")).iter_rows(named=True):
        out[f"{row['split']}/{row['agent_id']}/{row['metric']}"] = row["value"]
    from pipeline.workflows.math import MathWorkflow  # the one-round store runs the default math workflow

    from pipeline.reporting.report import round_summary
    summary = round_summary(store, [round_], MathWorkflow.table_metrics).row(0, named=True)
    for _agent, _metric, column in MathWorkflow.table_metrics:
        if summary.get(column) is not None:
            out[f"summary/{column}"] = summary[column]
    if round_ < 0:
        return out
    steps = pl.read_parquet(st.table_path(store, round_, "steps")).filter(pl.col("active")).to_dicts()
    for agent in {r["agent_id"] for r in steps}:
        rewards = [r["local_reward"] for r in steps if r["agent_id"] == agent and r["local_reward"] is not None]
        globals_ = [r["global_reward"] for r in steps if r["agent_id"] == agent and r["global_reward"] is not None]
        out[f"rollout/agent/{agent}/local_reward"] = sum(rewards) / len(rewards)
        out[f"rollout/agent/{agent}/global_reward"] = sum(globals_) / len(globals_)
        out[f"rollout/agent/{agent}/success"] = sum(x >= 0.5 for x in rewards) / len(rewards)
        out[f"rollout/agent/{agent}/calls"] = sum(r["agent_id"] == agent for r in steps)
    for strategy in {r["strategy"] for r in steps}:
        rewards = [r["local_reward"] for r in steps if r["strategy"] == strategy and r["local_reward"] is not None]
        out[f"rollout/strategy/{strategy}/local_reward"] = sum(rewards) / len(rewards)
        out[f"rollout/strategy/{strategy}/calls"] = sum(r["strategy"] == strategy for r in steps)
        out[f"summary/success_{strategy}"] = summary[f"success_{strategy}"]
        out[f"rollout/strategy/{strategy}/success"] = summary[f"success_{strategy}"]
    for row in pl.read_parquet(st.table_path(store, round_, "ratio_diagnostics")).iter_rows(named=True):
        cell = f"ratio/{row['policy_id']}/{row['agent_id'].replace('*', 'all')}/{row['strategy'].replace('*', 'all')}"
        out[f"{cell}/mean_log_ratio"] = row["mean_log_ratio"]
        out[f"{cell}/ess_fraction"] = row["ess_fraction"]
        out[f"{cell}/rows"] = row["rows"]
    for row in pl.read_parquet(st.table_path(store, round_, "timings")).iter_rows(named=True):
        out[f"time/{row['stage']}"] = row["seconds"]
    for entry in (store / "checkpoints" / "registry" / f"round={round_}").glob("*.json"):
        record = json.loads(entry.read_text())
        for key, value in record["metrics"].items():
            out[f"train/{record['policy_id']}/{key}"] = value
    return out


def test_expected_values_cover_every_kind_of_table(one_round):
    """The reference above is not empty where it matters: each table of the round gives values."""
    names = expected(one_round, 0)
    for prefix in ("heldout/", "summary/solver_acc", "rollout/agent/", "rollout/strategy/", "ratio/", "time/rollouts", "train/"):
        assert any(n.startswith(prefix) for n in names), prefix
    assert set(expected(one_round, -1)) >= {"heldout/solver/accuracy", "summary/solver_acc"}


# -- TensorBoard ------------------------------------------------------------------------------


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_scalars_equal_the_tables_once_per_round(store):
    from torch.utils.tensorboard import SummaryWriter

    # what an attempt interrupted before it recorded anything leaves: hidden by the next writer
    with SummaryWriter(log_dir=str(store / "tensorboard")) as junk:
        junk.add_scalar("heldout/solver/accuracy", 123.0, global_step=-1)
        junk.add_scalar("time/rollouts", 123.0, global_step=0)
    assert log_round(store, 0, ["tensorboard"]) == {"tensorboard": [-1, 0]}
    assert log_round(store, 0, ["tensorboard"]) == {"tensorboard": []}  # a second call logs nothing
    scalars = tensorboard_scalars(store / "tensorboard")
    for round_ in (-1, 0):
        for name, value in expected(store, round_).items():
            points = [v for step, v in scalars.get(name, []) if step == round_]
            assert len(points) == 1, (name, round_, scalars.get(name))
            assert points[0] == pytest.approx(value, rel=1e-6, abs=1e-7), (name, round_)  # TensorBoard keeps float32
    # every tag has one point per round it has, and round -1 has no training values
    assert all(len({s for s, _ in pts}) == len(pts) for pts in scalars.values())
    assert not [t for t, pts in scalars.items() if t.startswith(("train/", "rollout/")) and any(s == -1 for s, _ in pts)]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(store / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    info = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    settings = json.loads((store / "experiment.json").read_text())["settings"]
    assert info.session_start_info.hparams["settings/loss"].string_value == settings["loss"]
    assert info.session_start_info.hparams["settings/problems"].number_value == settings["problems"]
    text = acc.Tensors("settings/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"settings/seed = {settings['seed']}" in text


# -- MLflow -----------------------------------------------------------------------------------


def mlflow_client(store: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow' / 'mlflow.db'}")


def test_mlflow_history_per_step_equals_the_tables(store, no_network):
    assert log_round(store, 0, ["mlflow"]) == {"mlflow": [-1, 0]}
    assert log_round(store, 0, ["mlflow"]) == {"mlflow": []}
    client = mlflow_client(store)
    experiment = client.get_experiment_by_name("maxit")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == json.loads((store / STATE_FILE).read_text())["mlflow"]["run_id"]
    for round_ in (-1, 0):
        for name, value in expected(store, round_).items():
            points = [m.value for m in client.get_metric_history(run.info.run_id, name) if m.step == round_]
            assert points == [pytest.approx(value, rel=1e-12, abs=1e-15)], (name, round_)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "heldout/solver/accuracy")) == [-1, 0]
    settings = json.loads((store / "experiment.json").read_text())["settings"]
    assert run.data.params["settings/loss"] == settings["loss"]
    assert run.data.params["settings/strategies"] == json.dumps(settings["strategies"])
    assert run.info.status == "FINISHED"
    # the rounds reached the database but the state file lost them (interrupted before it was
    # written): logging them again adds no point
    state = json.loads((store / STATE_FILE).read_text())
    state["mlflow"]["rounds"] = []
    (store / STATE_FILE).write_text(json.dumps(state))
    assert log_round(store, 0, ["mlflow"]) == {"mlflow": [-1, 0]}
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "time/rollouts")) == [0]
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "heldout/solver/accuracy")) == [-1, 0]
    assert no_network == []


# -- W&B offline ------------------------------------------------------------------------------


def wandb_records(path: Path):
    """The records of a W&B transaction log (`run-<id>.wandb`): its 7-byte header (":W&B",
    0xBEE1, version 0), then LevelDB's log format (32 KiB blocks; each chunk a 7-byte header of
    CRC, length, type; FULL = 1, FIRST 2, MIDDLE 3, LAST 4; a block's tail shorter than a header
    is padding), each record a `wandb_internal_pb2.Record`. wandb 0.31 ships no Python reader of
    these files, only their protobuf definitions."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, data[:7]
    i, chunks = 7, b""
    while i + 7 <= len(data):
        left = 32768 - i % 32768
        if left < 7:
            i += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[i : i + 7])
        if kind == 0:  # zero fill at the end of a file
            break
        assert kind in (1, 2, 3, 4), (path, i, kind)
        chunks += data[i + 7 : i + 7 + length]
        i += 7 + length
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(chunks)
            chunks = b""


def item_value(item) -> tuple[str, object]:
    """(key, value) of a history or config item: the key is `key` or, in newer wandb, the
    one-element `nested_key`; the value JSON text, or a typed field where one is set."""
    key = item.key or "/".join(item.nested_key)
    typed = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    return key, (getattr(item, typed) if typed not in (None, "none") else json.loads(item.value_json) if item.value_json else None)


def wandb_history(store: Path) -> list[tuple[str, dict]]:
    """(run id, {key: value}) of every history row of the store's offline runs, in file order."""
    rows = []
    for path in sorted((store / "wandb").glob("offline-run-*/run-*.wandb")):
        run_id = None
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run_id = record.run.run_id
            elif kind == "history":
                rows.append((run_id, dict(item_value(item) for item in record.history.item)))
    return rows


def settled_wandb_history(store: Path, n: int, wait_s: float = 60.0) -> list[tuple[str, dict]]:
    """`wandb_history` once it holds `n` rows (or after `wait_s`): wandb's service process may
    still be writing the transaction log when `finish` has returned on a loaded machine."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            rows = wandb_history(store)
        except Exception:  # a record half-written
            rows = []
        if len(rows) >= n or time.monotonic() > deadline:
            return wandb_history(store)
        time.sleep(0.5)


def wandb_config(store: Path) -> dict:
    config = {}
    for path in sorted((store / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "run":
                config.update(dict(item_value(item) for item in record.run.config.update))
            elif record.WhichOneof("record_type") == "config":
                config.update(dict(item_value(item) for item in record.config.update))
    return config


def test_wandb_offline_run_holds_the_tables_once_per_round(store, no_network):
    before = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT")}
    assert log_round(store, 0, ["wandb"]) == {"wandb": [-1, 0]}
    assert log_round(store, 0, ["wandb"]) == {"wandb": []}
    assert {k: os.environ.get(k) for k in before} == before  # the offline switches were put back
    run_id = json.loads((store / STATE_FILE).read_text())["wandb"]["run_id"]
    folders = list((store / "wandb").glob("offline-run-*"))
    assert len(folders) == 1 and folders[0].name.endswith(f"-{run_id}")  # the second call opened no run
    rows = settled_wandb_history(store, 2)
    assert [(rid, row["round"], row["_step"]) for rid, row in rows] == [(run_id, -1, 0), (run_id, 0, 1)]
    for (_rid, row), round_ in zip(rows, (-1, 0)):
        for name, value in expected(store, round_).items():
            assert row.get(name) == pytest.approx(value, rel=1e-12, abs=1e-15), (name, round_)
    settings = json.loads((store / "experiment.json").read_text())["settings"]
    assert wandb_config(store)["settings/loss"] == settings["loss"]
    assert no_network == []


# -- resume, bad input ------------------------------------------------------------------------


def test_a_resumed_process_appends_the_next_round_to_the_same_runs(store):
    assert log_round(store, -1, ALL) == {t: [-1] for t in ALL}
    state = json.loads((store / STATE_FILE).read_text())
    code = textwrap.dedent(
        f"""
        from pipeline.reporting.tracking import log_round
        print(log_round({str(store)!r}, 0, {list(ALL)!r}))
        """
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str({t: [0] for t in ALL})
    after = json.loads((store / STATE_FILE).read_text())
    assert {t: after[t].get("run_id") for t in ALL} == {t: state[t].get("run_id") for t in ALL}
    assert all(after[t]["rounds"] == [-1, 0] for t in ALL)

    scalars = tensorboard_scalars(store / "tensorboard")
    assert len(list((store / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert [s for s, _ in scalars["heldout/solver/accuracy"]] == [-1, 0]
    assert [s for s, _ in scalars["time/rollouts"]] == [0]

    client = mlflow_client(store)
    runs = client.search_runs([client.get_experiment_by_name("maxit").experiment_id])
    assert [r.info.run_id for r in runs] == [state["mlflow"]["run_id"]]
    assert sorted(m.step for m in client.get_metric_history(state["mlflow"]["run_id"], "heldout/solver/accuracy")) == [-1, 0]

    # W&B: one offline folder per process, one run id, its own step going on from the first
    rows = settled_wandb_history(store, 2)
    assert [(rid, row["round"], row["_step"]) for rid, row in rows] == [(state["wandb"]["run_id"], -1, 0), (state["wandb"]["run_id"], 0, 1)]
    assert len(list((store / "wandb").glob(f"offline-run-*-{state['wandb']['run_id']}"))) == 2
    assert wandb_config(store)["settings/loss"]  # the settings were given with the first process's run


def test_bad_targets_are_one_line_config_errors_naming_the_flag(store, monkeypatch):
    with pytest.raises(ConfigError) as err:
        check_targets(["tensorboard", "tensorbord"])
    assert str(err.value).startswith("--report-to tensorbord: unknown target") and "\n" not in str(err.value)
    assert check_targets(["none"]) == () and check_targets(["wandb", "wandb"]) == ("wandb",)
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        log_round(store, 0, ["tensorboard", "wandb"])
    assert str(err.value) == "--report-to wandb: package wandb is not installed; pip install 'maxit[track]'"
    assert not (store / STATE_FILE).exists() and not (store / "tensorboard").exists()  # checked before anything is written
    with pytest.raises(DataError, match="round 1 of .* is not complete"):
        log_round(store, 1, ["tensorboard"])
    assert not (store / STATE_FILE).exists()


def test_a_failing_target_does_not_stop_the_others(store):
    (store / "mlflow").write_text("not a folder")  # MLflow cannot make its database folder
    with pytest.raises(MaxitError, match=r"logging round 0 of .* failed for mlflow: FileExistsError"):
        log_round(store, 0, ["mlflow", "tensorboard"])
    state = json.loads((store / STATE_FILE).read_text())
    assert state["tensorboard"]["rounds"] == [-1, 0] and "mlflow" not in state
    assert [s for s, _ in tensorboard_scalars(store / "tensorboard")["heldout/solver/accuracy"]] == [-1, 0]


# -- the pure parts, on small frames ----------------------------------------------------------


def test_reward_scalars_count_active_rows_and_leave_null_rewards_out():
    rows = [
        # strategy, agent, traj, selected, active, local, global
        ("iid", "a", "t0", True, True, 1.0, 1.0),
        ("iid", "b", "t0", True, True, 0.0, 1.0),
        ("iid", "a", "t1", True, True, None, 0.0),
        ("iid", "b", "t1", True, False, 1.0, 0.0),  # inactive: left out of every mean
        ("tree", "a", "u0", True, True, 0.25, 0.0),
        ("tree", "a", "u0", False, True, 1.0, 1.0),  # a tree's unselected candidate
    ]
    steps = pl.DataFrame(
        [
            {"round": 0, "strategy": s, "agent_id": a, "traj_uid": t, "uid": "u0", "turn": 0, "selected": sel, "active": act, "local_reward": lr, "global_reward": gr}
            for s, a, t, sel, act, lr, gr in rows
        ]
    )
    out = reward_scalars(steps)
    assert out["rollout/agent/a/local_reward"] == pytest.approx((1.0 + 0.25 + 1.0) / 3)
    assert out["rollout/agent/a/calls"] == 4 and out["rollout/agent/b/calls"] == 1
    assert out["rollout/agent/a/success"] == pytest.approx(2 / 3)  # 1.0 and 1.0 of the three scored
    assert out["rollout/agent/b/global_reward"] == 1.0
    assert out["rollout/strategy/iid/success"] == pytest.approx(0.5)  # t0 ends at 1, t1 at 0
    assert out["rollout/strategy/tree/success"] == 0.0  # the selected path's reward, not the best candidate's


def test_ratio_scalars_name_the_all_rows_and_skip_null_and_nan():
    ratio = pl.DataFrame(
        {"round": [0, 0], "policy_id": ["p", "p"], "agent_id": ["*", "a"], "strategy": ["*", "iid"], "rows": [3, 2],
         "first_step_log_ratio": [None, 0.5], "kl": [math.nan, 0.0]}
    )
    assert ratio_scalars(ratio) == {
        "ratio/p/all/all/rows": 3.0,
        "ratio/p/a/iid/rows": 2.0,
        "ratio/p/a/iid/first_step_log_ratio": 0.5,
        "ratio/p/a/iid/kl": 0.0,
    }


# -- maxit run --report-to ----------------------------------------------------------------------


def test_maxit_run_report_to_logs_a_resumed_round_and_a_new_one_to_every_tracker(store, no_network):
    """`maxit run --rounds 2 --report-to ...` on a store with round 0 done: round -1 and round 0
    are logged as the run resumes them, round 1 as it finishes; each tracker reads back one point
    per round, equal to the store's tables."""
    from maxit.cli import main
    from pipeline.models import default_cache_dir
    from pipeline.workflows.math.model import default_model

    argv = ["run", "--rounds", "2", "--store", str(store), "--model-dir", str(default_model(default_cache_dir())), *RUN_FLAGS, "--report-to", *ALL]
    assert main(argv) == 0
    assert pl.read_parquet(st.table_path(store, 1, "evaluation")).height  # round 1 ran
    state = json.loads((store / STATE_FILE).read_text())
    assert all(state[t]["rounds"] == [-1, 0, 1] for t in ALL)
    want = expected(store, 1)
    assert want
    scalars = tensorboard_scalars(store / "tensorboard")
    for name, value in want.items():
        assert [v for step, v in scalars.get(name, []) if step == 1] == [pytest.approx(value, rel=1e-6, abs=1e-7)], name
    assert [s for s, _ in scalars["heldout/solver/accuracy"]] == [-1, 0, 1]
    client = mlflow_client(store)
    history = client.get_metric_history(state["mlflow"]["run_id"], "heldout/solver/accuracy")
    assert sorted(m.step for m in history) == [-1, 0, 1]
    assert [row["round"] for _, row in settled_wandb_history(store, 3)] == [-1, 0, 1]
    assert not no_network  # nothing tried to reach the network


def test_maxit_run_refuses_an_unknown_tracker_before_it_writes_anything(tmp_path, capsys):
    from maxit.cli import main

    store = tmp_path / "store"
    assert main(["run", "--rounds", "1", "--store", str(store), "--report-to", "tensorboard", "neptune"]) == 2
    assert "--report-to neptune: unknown target" in capsys.readouterr().err
    assert not store.exists()
