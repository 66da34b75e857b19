"""Bad input on the command line: exit code 2, one line on stderr naming the file, column, row ids
or flag, no traceback, and nothing written. Inputs are built from the synthetic steps table and
small copies of the default model's files; every failure happens before any model is loaded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from maxit.cli import main
from pipeline import store
from pipeline.learn.advantages import compute_advantages
from pipeline.config import AdvantageConfig
from pipeline.errors import ConfigError, DataError, one_line
from pipeline.models.chat import check_model_dir
from pipeline.rollout.synthetic import synthetic_steps
from schemas import STEPS, TRAINING_VIEW, SchemaError, validate


@pytest.fixture
def steps_file(tmp_path) -> Path:
    path = tmp_path / "steps.parquet"
    validate(synthetic_steps(n_problems=3, samples=2, full=True), STEPS).write_parquet(path)
    return path


@pytest.fixture
def adv_file(tmp_path, steps_file) -> Path:
    path = tmp_path / "adv.parquet"
    compute_advantages(pl.read_parquet(steps_file)).write_parquet(path)
    return path


def truncated(src: Path, dst: Path) -> Path:
    """`src` cut in half, as a copy killed midway leaves it."""
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def failed(argv: list[str], capsys) -> str:
    """Run `maxit argv`; it must exit with 2 and print one line, without a traceback. Returns it."""
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(f"maxit {argv[0]}: error: ")
    assert "\n" not in err and "Traceback" not in err
    return err


def entries(folder: Path) -> list[str]:
    """Everything in `folder`, recursively, hidden temporary files included."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- 1. a corrupt or truncated Parquet file is named --------------------------------------------


def test_advantages_names_a_truncated_steps_file(tmp_path, steps_file, capsys):
    bad = truncated(steps_file, tmp_path / "cut.parquet")
    before = entries(tmp_path)
    err = failed(["advantages", "--steps", str(bad), "--out", str(tmp_path / "adv-out.parquet")], capsys)
    assert f"--steps {bad}: not a readable Parquet file" in err
    assert entries(tmp_path) == before


def test_advantages_names_the_bad_file_of_a_glob(tmp_path, steps_file, capsys):
    for r in (0, 1):
        (tmp_path / "s" / f"round={r}").mkdir(parents=True)
    pl.read_parquet(steps_file).with_columns(pl.lit(0, pl.Int32).alias("round")).write_parquet(tmp_path / "s" / "round=0" / "steps.parquet")
    bad = truncated(steps_file, tmp_path / "s" / "round=1" / "steps.parquet")
    before = entries(tmp_path)
    err = failed(["advantages", "--steps", str(tmp_path / "s" / "round=*" / "steps.parquet"), "--out", str(tmp_path / "adv-out.parquet")], capsys)
    assert f"{bad}: not a readable Parquet file" in err and "round=0" not in err
    assert entries(tmp_path) == before


def test_view_names_a_truncated_advantages_file(tmp_path, adv_file, default_model_dir, capsys):
    bad = truncated(adv_file, tmp_path / "cut.parquet")
    before = entries(tmp_path)
    err = failed(["view", "--advantages", str(bad), "--out", str(tmp_path / "view.parquet"), "--model-dir", str(default_model_dir)], capsys)
    assert f"--advantages {bad}: not a readable Parquet file" in err
    assert entries(tmp_path) == before


def test_train_names_a_truncated_view_file(tmp_path, adv_file, default_model_dir, capsys):
    bad = truncated(adv_file, tmp_path / "view.parquet")
    before = entries(tmp_path)
    err = failed(["train", "--view", str(bad), "--policy", "shared", "--init", str(default_model_dir), "--out", str(tmp_path / "ckpt"), "--report-to", "none"], capsys)
    assert f"--view {bad}: not a readable Parquet file" in err
    assert entries(tmp_path) == before


def test_sql_names_a_truncated_table_of_the_store(tmp_path, steps_file, capsys):
    (tmp_path / "s" / "round=0").mkdir(parents=True)
    bad = truncated(steps_file, tmp_path / "s" / "round=0" / "steps.parquet")
    err = failed(["sql", "select count(*) from steps", "--store", str(tmp_path / "s")], capsys)
    assert f"{bad}: not a readable Parquet file" in err


def test_read_table_names_a_file_that_is_not_parquet(tmp_path):
    path = tmp_path / "notes.parquet"
    path.write_text("question,answer\n1+1,2\n")
    with pytest.raises(DataError, match="notes.parquet: not a readable Parquet file"):
        store.read_table(path)
    with pytest.raises(DataError, match="--steps .*notes.parquet: not a readable Parquet file"):
        store.check_table_file(path, flag="--steps")


# -- 2. duplicated step_ids are named -------------------------------------------------------------


def test_advantages_names_duplicated_step_ids(tmp_path, steps_file, capsys):
    steps = pl.read_parquet(steps_file)
    dup = tmp_path / "dup.parquet"
    pl.concat([steps, steps.filter(pl.col("step_id").is_in(["4", "9"]))]).write_parquet(dup)
    before = entries(tmp_path)
    err = failed(["advantages", "--steps", str(dup), "--out", str(tmp_path / "adv-out.parquet")], capsys)
    assert f"--steps {dup}" in err and "column 'step_id' must be unique per round; duplicated: '4' (round 0), '9' (round 0)" in err
    assert entries(tmp_path) == before


def test_step_ids_repeat_across_rounds_but_not_within_one():
    steps = synthetic_steps(n_problems=2, samples=2, full=True)
    two_rounds = pl.concat([steps, steps.with_columns(pl.lit(1, pl.Int32).alias("round"))])
    assert compute_advantages(two_rounds).height == 2 * steps.height
    with pytest.raises(DataError, match=r"duplicated: '0' \(round 1\)"):
        compute_advantages(pl.concat([two_rounds, two_rounds.tail(steps.height).head(1)]), AdvantageConfig())
    # a table without a round column: step_ids are unique over the whole table
    with pytest.raises(DataError, match=f"column 'step_id' must be unique; duplicated: '0', '1', .* and {steps.height - 10} more$"):
        compute_advantages(two_rounds.drop("round"))


def test_view_names_duplicated_step_ids_and_the_file(tmp_path, adv_file, default_model_dir, capsys):
    adv = pl.read_parquet(adv_file)
    dup = tmp_path / "dup.parquet"
    pl.concat([adv, adv.head(1)]).write_parquet(dup)
    before = entries(tmp_path)
    err = failed(["view", "--advantages", str(dup), "--out", str(tmp_path / "view.parquet"), "--model-dir", str(default_model_dir)], capsys)
    assert f"--advantages {dup}" in err and "column 'step_id' must be unique; duplicated: '0'" in err
    assert entries(tmp_path) == before


# -- 3. a missing contract column is named, at every command that reads the table ----------------


def test_advantages_names_a_missing_steps_column(tmp_path, steps_file, capsys):
    bad = tmp_path / "no-traj.parquet"
    pl.read_parquet(steps_file).drop("traj_uid").write_parquet(bad)
    before = entries(tmp_path)
    # traj_uid is not needed by these groups, but a steps table without it breaks the contract
    err = failed(["advantages", "--steps", str(bad), "--out", str(tmp_path / "adv-out.parquet")], capsys)
    assert f"table 'steps' (--steps {bad}) does not match its schema: missing column 'traj_uid' (string)" in err
    assert entries(tmp_path) == before


def test_view_names_a_missing_advantages_column(tmp_path, adv_file, default_model_dir, capsys):
    bad = tmp_path / "no-traj.parquet"
    pl.read_parquet(adv_file).drop("traj_uid", "seed").write_parquet(bad)
    before = entries(tmp_path)
    err = failed(["view", "--advantages", str(bad), "--out", str(tmp_path / "view.parquet"), "--model-dir", str(default_model_dir)], capsys)
    assert f"table 'advantages' (--advantages {bad})" in err
    assert "missing column 'traj_uid' (string); missing column 'seed' (int64)" in err
    assert entries(tmp_path) == before


def test_train_names_a_missing_view_column(tmp_path, default_model_dir, capsys):
    bad = tmp_path / "view.parquet"
    pl.from_arrow(TRAINING_VIEW.schema.empty_table()).drop("sampling_logprobs").write_parquet(bad)
    before = entries(tmp_path)
    err = failed(["train", "--view", str(bad), "--policy", "shared", "--init", str(default_model_dir), "--out", str(tmp_path / "ckpt"), "--report-to", "none"], capsys)
    assert f"table 'training_view' (--view {bad})" in err and "missing column 'sampling_logprobs'" in err
    assert entries(tmp_path) == before


def test_a_table_read_through_the_store_names_its_file(tmp_path, steps_file):
    bad = tmp_path / "no-uid.parquet"
    pl.read_parquet(steps_file).drop("uid").write_parquet(bad)
    with pytest.raises(SchemaError, match=rf"table 'steps' \({bad}\) does not match its schema") as err:
        store.read_table(bad, "steps")
    assert err.value.problems == ["missing column 'uid' (string)"] and err.value.source == str(bad)


# -- 4. a model folder without a tokenizer or a chat template, before any work --------------------


@pytest.fixture
def no_tokenizer(tmp_path, default_model_dir) -> Path:
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    shutil.copy(default_model_dir / "config.json", folder)
    return folder


@pytest.fixture
def no_template(tmp_path, default_model_dir) -> Path:
    folder = tmp_path / "no-template"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, folder)
    return folder


def test_rollout_names_a_model_folder_without_a_tokenizer(tmp_path, no_tokenizer, capsys):
    err = failed(["rollout", "--store", str(tmp_path / "store"), "--problems", "2", "--samples", "2", "--model-dir", str(no_tokenizer), "--engine", "hf"], capsys)
    assert f"--model-dir {no_tokenizer}: the folder has no tokenizer (none of tokenizer.json" in err
    assert not (tmp_path / "store").exists()


def test_rollout_names_a_model_folder_without_a_chat_template(tmp_path, no_template, capsys):
    err = failed(["rollout", "--store", str(tmp_path / "store"), "--problems", "2", "--samples", "2", "--model-dir", str(no_template), "--engine", "hf"], capsys)
    assert f"--model-dir {no_template}: the folder has no chat template" in err
    assert not (tmp_path / "store").exists()


def test_run_checks_the_model_folder_before_any_round(tmp_path, no_template, capsys):
    err = failed(["run", "--rounds", "1", "--store", str(tmp_path / "store"), "--problems", "2", "--samples", "2", "--model-dir", str(no_template), "--engine", "hf"], capsys)
    assert f"--model-dir {no_template}: the folder has no chat template" in err
    assert not (tmp_path / "store").exists()


def test_train_and_view_check_their_model_folders(tmp_path, adv_file, no_tokenizer, no_template, capsys):
    view = tmp_path / "view.parquet"
    err = failed(["view", "--advantages", str(adv_file), "--out", str(view), "--model-dir", str(no_tokenizer)], capsys)
    assert f"--model-dir {no_tokenizer}: the folder has no tokenizer" in err and not view.exists()
    pl.from_arrow(TRAINING_VIEW.schema.empty_table()).write_parquet(view)
    err = failed(["train", "--view", str(view), "--policy", "shared", "--init", str(no_template), "--out", str(tmp_path / "ckpt"), "--report-to", "none"], capsys)
    assert f"--init {no_template}: the folder has no chat template" in err and not (tmp_path / "ckpt").exists()


def test_a_chat_template_in_tokenizer_config_counts(no_template, default_model_dir):
    import json

    config_file = no_template / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = (default_model_dir / "chat_template.jinja").read_text()
    config_file.write_text(json.dumps(config))
    assert check_model_dir(no_template) == no_template
    assert check_model_dir(default_model_dir) == default_model_dir
    with pytest.raises(ConfigError, match="--init .*: no such folder"):
        check_model_dir(no_template / "missing", "--init")


# -- 5. an output that cannot be written, before any work -----------------------------------------


def test_rollout_and_run_refuse_a_store_that_cannot_be_a_folder(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for command in (["rollout", "--problems", "2", "--samples", "2"], ["run", "--rounds", "1", "--problems", "2", "--samples", "2"]):
        err = failed([*command, "--store", str(blocker)], capsys)
        assert f"--store {blocker}: is an existing file, not a folder" in err
        err = failed([*command, "--store", str(blocker / "store")], capsys)
        assert f"--store {blocker / 'store'}: cannot be created, {blocker} is a file, not a folder" in err
    assert entries(tmp_path) == ["a-file"] and blocker.read_text() == "not a folder"


def test_advantages_view_and_train_refuse_unwritable_outputs(tmp_path, steps_file, adv_file, default_model_dir, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    before = entries(tmp_path)
    err = failed(["advantages", "--steps", str(steps_file), "--out", str(blocker / "adv.parquet")], capsys)
    assert f"--out {blocker / 'adv.parquet'}: cannot be created, {blocker} is a file, not a folder" in err
    err = failed(["advantages", "--steps", str(steps_file), "--out", str(tmp_path)], capsys)
    assert f"--out {tmp_path}: is a folder; give the path of a file" in err
    err = failed(["view", "--advantages", str(adv_file), "--out", str(blocker / "v" / "view.parquet"), "--model-dir", str(default_model_dir)], capsys)
    assert f"{blocker} is a file, not a folder" in err
    view = tmp_path / "view.parquet"
    pl.from_arrow(TRAINING_VIEW.schema.empty_table()).write_parquet(view)
    err = failed(["train", "--view", str(view), "--policy", "shared", "--init", str(default_model_dir), "--out", str(blocker), "--report-to", "none"], capsys)
    assert f"--out {blocker}: is an existing file, not a folder" in err
    err = failed(["train", "--view", str(view), "--policy", "shared", "--init", str(default_model_dir), "--out", str(tmp_path / "ckpt"), "--report-to", "none", "--store", str(blocker), "--round", "0"], capsys)
    assert f"--store {blocker}: is an existing file, not a folder" in err
    view.unlink()
    assert entries(tmp_path) == before


def test_a_read_only_folder_is_refused(tmp_path, capsys):
    """A folder this user cannot write into. Root writes through permission bits, so as root the
    folder is one the kernel itself refuses (/proc/1); otherwise a folder made read-only here."""
    if os.geteuid() == 0:
        locked = Path("/proc/1")
        assert locked.is_dir() and not os.access(locked, os.W_OK)
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
    try:
        err = failed(["rollout", "--problems", "2", "--samples", "2", "--store", str(locked / "store")], capsys)
        assert f"--store {locked / 'store'}: cannot be written, folder {locked} is not writable" in err
        assert not (locked / "store").exists()
    finally:
        if locked.parent == tmp_path:
            locked.chmod(0o755)


def test_check_writable_accepts_what_can_be_written(tmp_path):
    assert store.check_writable(tmp_path / "new" / "deeper" / "t.parquet", "--out") == tmp_path / "new" / "deeper" / "t.parquet"
    assert store.check_writable(tmp_path, "--store", "folder") == tmp_path
    assert store.check_writable(tmp_path / "ckpt", "--out", "atomic folder") == tmp_path / "ckpt"
    assert not (tmp_path / "new").exists()  # nothing was created


# -- the message is one line -------------------------------------------------------------------------


def test_one_line_joins_the_findings():
    err = SchemaError("steps", ["missing column 'uid' (string)", "column 'turn' has type int64, expected int32"], "--steps a.parquet")
    assert one_line(err) == "table 'steps' (--steps a.parquet) does not match its schema: missing column 'uid' (string); column 'turn' has type int64, expected int32"
    assert one_line(DataError("cannot compute advantages:\n  - NaN reward in 1 row(s)\n  - null 'uid'")) == "cannot compute advantages: NaN reward in 1 row(s); null 'uid'"
    assert one_line(ConfigError("--out x: is a folder")) == "--out x: is a folder"


@pytest.mark.parametrize("flag", [["--relabel-verdicts"], ["--verifier-replay", "2"]])
def test_run_refuses_yes_no_verifier_training_for_a_verifier_that_solves_again(tmp_path, flag, capsys):
    """The arithmetic Verifier answers the sum itself (verdict style "compare"): relabelled or
    replayed rows, which are trained on a yes/no reply, are refused before anything is written."""
    err = failed(["run", "--rounds", "1", "--store", str(tmp_path / "run"), *flag], capsys)
    assert flag[0] in err and "compare" in err
    assert not (tmp_path / "run").exists()


def _dagster_failure(step_key: str, chain: list[tuple[str, str]]):
    """A step-failure event as Dagster reports it: `chain` is (class name, message) from the
    outer error to the exception the stage raised (module-qualified, as Dagster formats it)."""
    from types import SimpleNamespace

    from dagster._utils.error import SerializableErrorInfo

    error = None
    for cls_name, message in reversed(chain):
        error = SerializableErrorInfo(message=message + "\n", stack=["  File \"x.py\", line 1\n"], cls_name=cls_name, cause=error)
    return SimpleNamespace(is_failure=True, step_key=step_key, message=f'Execution of step "{step_key}" failed.',
                           event_specific_data=SimpleNamespace(error=error))


def test_a_failed_round_names_each_step_and_the_error_it_raised_not_dagsters_stack(capsys):
    from assets.failures import round_failure
    from pipeline.errors import RunInterrupted

    events = [
        _dagster_failure("rollouts.rollout_shard", [
            ("DagsterExecutionStepExecutionError", 'dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while executing op "rollout_shard":'),
            ("VLLMValidationError", "vllm.exceptions.VLLMValidationError: This model's maximum context length is 256 tokens. However, your prompt contains 918 input tokens."),
        ]),
        _dagster_failure("training", [
            ("DagsterExecutionStepExecutionError", "dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred"),
            ("ConfigError", "pipeline.errors.ConfigError: --lr must be > 0"),
        ]),
    ]
    err = round_failure(0, "abc", events, ["evaluation_complete: {}"])
    assert not isinstance(err, RunInterrupted)
    assert one_line(err) == (
        "round 0 failed (run abc): rollouts.rollout_shard: VLLMValidationError: This model's maximum context length is 256 tokens. "
        "However, your prompt contains 918 input tokens.; training: --lr must be > 0; check evaluation_complete: {}"
    )
    assert 'File "x.py"' in capsys.readouterr().err  # the whole traces go to stderr: a run's maxit.log

    stopped = round_failure(1, "def", [_dagster_failure("training", [
        ("DagsterExecutionInterruptedError", "dagster._core.errors.DagsterExecutionInterruptedError: Execution was interrupted"),
    ])])
    assert isinstance(stopped, RunInterrupted) and one_line(stopped).startswith("round 1 interrupted (run def)")
    assert "round 1 is run again from its start" in str(stopped)


def test_a_workflow_whose_default_model_raises_stops_the_round_with_one_line(tmp_path):
    """The round's stages run inside Dagster; what a stage raised is what the user reads, one
    line naming the step and the error, and the stack trace is in STORE/maxit.log."""
    relay = (Path(__file__).resolve().parents[1] / "examples" / "relay.py").read_text()
    workflow = tmp_path / "broken.py"
    workflow.write_text(relay + "\n\nclass Broken(Relay):\n    def default_model(self):\n        return pipeline.models.default_model()\n")
    store_dir = tmp_path / "store"
    import subprocess
    import sys

    # a process of its own, as a user runs it: the run sends what Dagster logs to STORE/maxit.log at the file descriptors
    done = subprocess.run([sys.executable, "-m", "maxit.cli", "run", "--rounds", "1", "--workflow", f"{workflow}:Broken", "--store", str(store_dir),
                           "--problems", "2", "--samples", "2", "--engine", "hf"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    err = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and err.startswith("maxit run: error: round 0 failed (run "), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Stack Trace" not in done.stderr
    assert "rollouts.rollout_shards: NameError: name 'pipeline' is not defined; (engine and library output: " in err
    assert len(err) < 600
    log = (store_dir / "maxit.log").read_text()
    assert "NameError" in log and "default_model" in log  # the trace, for whoever debugs it
