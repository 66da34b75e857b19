"""Experiments: two stores run from the same folder keep separate Dagster lineages (an instance
per store), `maxit runs` lists them with their settings, every round records seconds per stage,
and the console shows maxit's own output only (engine and library output goes to STORE/maxit.log).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from pipeline.engines import vllm_available
from pipeline.run import LINE_WIDTH
from pipeline.reporting.experiments import experiments_table
from pipeline.run.experiment_record import EXPERIMENT_FILE, LOG_FILE, read_experiment, record_experiment
from pipeline.run.timings import SUBSTAGES, TIMING_ROWS, record_timings
from pipeline.store import Tables, table_path
from schemas import validate

MAXIT = str(Path(sys.executable).with_name("maxit"))
WARNING_LINE = re.compile(r"warn", re.IGNORECASE)


def run_cmd(store: Path, model_dir: Path, engine: str, *extra: str) -> list[str]:
    return [
        MAXIT, "run", "--rounds", "1", "--store", str(store), "--engine", engine, "--model-dir", str(model_dir),
        "--problems", "4", "--samples", "2", "--eval-problems", "6", "--eval-samples", "1", "--epochs", "1", *extra,
    ]


@pytest.fixture(scope="module")
def two_stores(tmp_path_factory, default_model_dir):
    """Two one-round experiments started from the same folder: A on vLLM where it is installed
    (its engine logs warnings), B on transformers with another seed."""
    root = tmp_path_factory.mktemp("experiments")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    engine_a = "vllm" if vllm_available() else "hf"
    runs = {}
    for name, engine, extra in (("a", engine_a, ()), ("b", "hf", ("--seed", "1"))):
        store = root / "runs" / name
        # round -1 evaluated afresh: the timings test reads its engine start, which an evaluation
        # copied from the user's cache (an earlier test or run with the same model) does not have
        extra = (*extra, "--no-base-eval-cache")
        proc = subprocess.run(run_cmd(store, default_model_dir, engine, *extra), cwd=root, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[name] = (store, engine, proc)
    return root, runs


def test_each_store_has_its_own_dagster_instance(two_stores):
    root, runs = two_stores
    assert not (root / ".dagster_home").exists()
    for name, (store, _engine, _proc) in runs.items():
        home = store / ".dagster"
        assert (home / "dagster.yaml").read_text() == (Path(__file__).resolve().parents[1] / "dagster.yaml").read_text()
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            records = instance.fetch_materializations(dg.AssetKey("evaluation"), limit=100).records
            assert [r.partition_key for r in records] == ["0"], name
            meta = records[0].asset_materialization.metadata
            # partition "0" of this instance is this store's round 0, with its numbers
            assert Path(meta["path"].value).resolve() == table_path(store, 0, "evaluation").resolve()
            ev = pl.read_parquet(table_path(store, 0, "evaluation"))
            assert meta["solver_acc"].value == pytest.approx(ev.filter(pl.col("metric") == "accuracy")["value"][0])
            runs_here = instance.get_runs()
            assert len(runs_here) == 1 and runs_here[0].tags["maxit/store"] == str(store.resolve())
        finally:
            instance.dispose()


def test_runs_lists_the_experiments_with_their_settings(two_stores):
    root, runs = two_stores
    table = experiments_table([root / "runs"])
    assert table["store"].to_list() == [str(runs["a"][0]), str(runs["b"][0])]
    assert table["rounds"].to_list() == [1, 1] and table["last_round"].to_list() == [0, 0]
    assert table["engine"].to_list() == [runs["a"][1], "hf"]
    settings_b = table.filter(pl.col("store") == str(runs["b"][0]))["settings"][0]
    assert "seed=1" in settings_b and "problems=4" in settings_b
    assert "seed=" not in table.filter(pl.col("store") == str(runs["a"][0]))["settings"][0]
    assert read_experiment(runs["b"][0])["settings"]["seed"] == 1
    out = subprocess.run([MAXIT, "runs", "--root", str(root / "runs")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "2 experiment(s)" in out.stdout and "seed=1" in out.stdout


def test_timings_are_recorded_and_printed(two_stores):
    _root, runs = two_stores
    assert len(runs) == 2
    for store, _engine, proc in runs.values():
        t = validate(pl.read_parquet(table_path(store, 0, "timings")), "timings")
        assert [s for s in t["stage"] if s not in SUBSTAGES] == [s for s in TIMING_ROWS if s not in SUBSTAGES]
        assert (t["seconds"] >= 0).all() and t.filter(pl.col("stage") == "rollouts")["seconds"][0] > 0
        # the starting model's evaluation is round -1's, not round 0's "other"; the engine it
        # built first is counted there, inside it
        base = dict(pl.read_parquet(table_path(store, -1, "timings")).select("stage", "seconds").iter_rows())
        assert set(base) == {"evaluation", "engine_start"} and 0 < base["engine_start"] < base["evaluation"]
        # the end-of-run table: the numbers a user watches, the round's seconds among them
        header = next(line for line in proc.stdout.splitlines() if line.split()[:2] == ["round", "solver_acc"])
        assert {"solver_acc", "train_rows", "seconds"} <= set(header.split()), header
        assert "maxit report --markdown --store" in proc.stdout


def test_console_is_quiet_and_the_log_has_library_output(two_stores):
    _root, runs = two_stores
    assert len(runs) == 2
    for store, engine, proc in runs.values():
        console = (proc.stdout + proc.stderr).splitlines()
        noisy = [line for line in console if WARNING_LINE.search(line)]
        assert not noisy, "\n".join(noisy[:20])
        assert any(line.startswith("maxit run: 1 round(s)") for line in console)
        assert max(map(len, console)) <= LINE_WIDTH, max(console, key=len)
        log = (store / LOG_FILE).read_text()
        assert " ".join(["run", "--rounds", "1"]) in log  # the run's header
        if engine == "vllm":
            # vLLM's own output (its loader's progress; its warnings vary with the environment)
            # is in the log and not on the console
            assert "Loading safetensors checkpoint shards" in log
            assert not any("Loading safetensors checkpoint shards" in line for line in console)


def test_console_to_log_sends_library_output_to_the_log(tmp_path):
    """Python warnings, logging, and C-level writes to fds 1 and 2 go to the log; maxit's own
    streams reach the console. With verbose, the console gets the library output too."""
    code = textwrap.dedent(
        """
        import logging, os, sys, warnings
        from assets.console import console_to_log
        verbose = sys.argv[2] == "1"
        with console_to_log(sys.argv[1], verbose=verbose) as (out, err):
            warnings.warn("a library warning")
            logging.getLogger("somelib").warning("a library log line")
            print("a library print")
            os.write(2, b"a C++ warning on fd 2\\n")
            print("maxit table", file=out)
            print("maxit progress", file=err)
        print("after the run")
        """
    )
    for verbose in (False, True):
        log = tmp_path / f"v{int(verbose)}" / "maxit.log"
        proc = subprocess.run([sys.executable, "-c", code, str(log), str(int(verbose))], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        text = log.read_text()
        for line in ("a library warning", "a library log line", "a library print", "a C++ warning on fd 2"):
            assert line in text
            assert (line in proc.stdout + proc.stderr) is verbose, (line, verbose)
        assert "maxit table" in proc.stdout and "after the run" in proc.stdout and "maxit progress" in proc.stderr
        assert "maxit table" not in text


def test_record_timings_replaces_a_stage_and_rejects_bad_input(tmp_path):
    from pipeline.errors import ConfigError

    tables = Tables(tmp_path)
    record_timings(tables, 0, {"policy": 3.0})
    record_timings(tables, 0, {"problems": 1.0})
    record_timings(tables, 0, {"policy": 5.0})
    t = validate(pl.read_parquet(table_path(tmp_path, 0, "timings")), "timings")
    assert t.rows() == [(0, "problems", 1.0), (0, "policy", 5.0)]
    with pytest.raises(ConfigError, match="stage"):
        record_timings(tables, 0, {"lunch": 1.0})
    with pytest.raises(ConfigError, match="seconds"):
        record_timings(tables, 0, {"training_view": float("nan")})


def test_experiment_record_keeps_creation_and_previous_settings(tmp_path):
    from pipeline.run.settings import Settings

    first = record_experiment(tmp_path, Settings(), "hf")
    again = record_experiment(tmp_path, Settings(seed=3), "hf")
    assert again["created"] == first["created"]
    assert again["settings"]["seed"] == 3 and again["previous_settings"]["seed"] == Settings().seed
    assert (tmp_path / EXPERIMENT_FILE).is_file()
    table = experiments_table([tmp_path])
    assert table["store"].to_list() == [str(tmp_path)] and table["rounds"].to_list() == [0]
    assert table["settings"][0] == "seed=3"


def test_an_arm_store_recorded_before_the_arms_moved_reads_as_their_module(tmp_path):
    """An arm's store records the factory of its workflow; one written when the arms were
    `pipeline.run.baselines` reads as `pipeline.run.arms`, so its team is rebuilt and a resumed run
    sees no changed workflow."""
    import json

    from pipeline.run.experiment_record import settings_changes, stored_settings
    from pipeline.run.settings import Settings

    settings = Settings(workflow="pipeline.run.arms:arm_workflow", workflow_options=("of=grid", "arm=single"))
    record = record_experiment(tmp_path, settings, "hf")
    record["settings"]["workflow"] = "pipeline.run.baselines:arm_workflow"
    record["previous_settings"] = {**record["settings"], "workflow": "pipeline.run.baselines:single_workflow"}
    (tmp_path / EXPERIMENT_FILE).write_text(json.dumps(record))
    read = read_experiment(tmp_path)
    assert read["settings"]["workflow"] == "pipeline.run.arms:arm_workflow"
    assert read["previous_settings"]["workflow"] == "pipeline.run.arms:single_workflow"
    assert stored_settings(read).run_config().workflow == "pipeline.run.arms:arm_workflow"
    (tmp_path / "round=0").mkdir()
    (tmp_path / "round=0" / "evaluation.parquet").write_bytes(b"")
    assert settings_changes(tmp_path, settings) == []


def test_experiment_record_keeps_the_preset_values_in_effect(tmp_path):
    """A store says what its run used even where the settings left it to the loss's preset
    (a preset may change between versions)."""
    from pipeline.config.presets import LOSS_PRESETS
    from pipeline.run.settings import Settings

    ppo = record_experiment(tmp_path / "ppo", Settings(loss="ppo"), "hf")
    assert ppo["settings"]["lr"] is None and ppo["effective"] == dict(LOSS_PRESETS["ppo"])
    given = record_experiment(tmp_path / "is", Settings(loss="is", lr=1e-4), "hf")
    assert given["effective"]["lr"] == 1e-4 and given["effective"]["alpha"] == LOSS_PRESETS["is"]["alpha"]
    assert read_experiment(tmp_path / "ppo")["effective"]["negative_weight"] == LOSS_PRESETS["ppo"]["negative_weight"]


def test_a_preset_change_between_resumes_keeps_the_earlier_values_in_effect(tmp_path, monkeypatch):
    """The same settings resumed after the loss's preset changed: the earlier rounds' values are
    kept under previous_effective, as changed settings are kept under previous_settings."""
    from pipeline.run import settings as settings_module
    from pipeline.config.presets import LOSS_PRESETS
    from pipeline.run.settings import Settings

    record_experiment(tmp_path, Settings(loss="ppo"), "hf")
    monkeypatch.setitem(settings_module.LOSS_PRESETS, "ppo", {**LOSS_PRESETS["ppo"], "lr": 1e-3})
    again = record_experiment(tmp_path, Settings(loss="ppo"), "hf")
    assert again["effective"]["lr"] == 1e-3 and again["previous_effective"]["lr"] == 5e-4
    assert again["previous_settings"] == again["settings"]
    # a later resume with nothing changed keeps what the earlier rounds used
    kept = record_experiment(tmp_path, Settings(loss="ppo"), "hf")
    assert kept["previous_effective"]["lr"] == 5e-4 and "previous_settings" in kept
