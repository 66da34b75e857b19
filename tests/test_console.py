"""What `maxit run` shows a user: the cache found from any folder, lines of at most 120 characters,
the end-of-run table of the numbers a user watches, and a round whose workflow code raised saying
so on its line (how many rows, the first error, the query that lists them)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from pipeline.run import LINE_WIDTH
from pipeline.reporting.report import console_table, reward_error_lines, round_line
from pipeline.rollout.synthetic import synthetic_steps
from pipeline.store import Tables, cache_root
from pipeline.workflows.math import MathWorkflow

MAXIT = str(Path(sys.executable).with_name("maxit"))


def test_the_cache_is_the_users_whatever_the_working_folder(tmp_path, monkeypatch):
    """$MAXIT_CACHE_DIR wins, else $XDG_CACHE_HOME/maxit (an absolute one), else ~/.cache/maxit;
    the working folder plays no part."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MAXIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "maxit"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/is/ignored")  # the XDG rule: only an absolute path counts
    assert cache_root() == tmp_path / "home" / ".cache" / "maxit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "maxit"
    monkeypatch.setenv("MAXIT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert cache_root() == tmp_path / "mine"


def summary_of_math(rounds: int = 3) -> pl.DataFrame:
    """A round table as `round_summary` gives it for the math workflow, every column filled."""
    rows = []
    for r in range(-1, rounds):
        row = {"round": r, "solver_acc": 0.45 + 0.05 * r, "greedy": 0.6, "with_hint": 0.48, "verifier_acc": 0.59, "verifier_bal_acc": 0.57,
               "verifier_bal_greedy": 0.66}
        if r >= 0:
            row |= {"success_feedback": 0.25, "success_iid": 0.17, "success_prompt_aug": 0.2, "success_tree": 0.52, "reward_errors": 0,
                    "train_rows": 1647, "train_steps": 14, "rollout_tok_s": 512.3, "s_problems": 1, "s_rollouts": 80, "s_advantages": 1,
                    "s_training_view": 3, "s_policy": 40, "s_evaluation": 30, "s_other": 5, "s_engine_start": 6}
        rows.append(row)
    return pl.DataFrame(rows)


def test_the_end_of_run_table_fits_120_columns_with_the_numbers_a_user_watches():
    table = console_table(summary_of_math(), MathWorkflow.table_metrics)
    lines = table.splitlines()
    assert max(map(len, lines)) <= LINE_WIDTH, table
    header = lines[0].split()
    # the workflow's metrics, the rows trained and the round's seconds come first; what does not
    # fit (here the rollout speed) is left to `maxit report --markdown`
    assert header[:9] == ["round", "solver_acc", "greedy", "with_hint", "verifier_acc", "verifier_bal_acc", "verifier_bal_greedy", "train_rows", "seconds"]
    assert "reward_errors" not in header  # none in any round: no column
    assert lines[1].split()[:3] == ["-1", "40.0%", "60.0%"] and lines[1].split()[8] == "-"
    assert lines[2].split()[7:9] == ["1647", "160"]  # seconds: the stages and "other", not the parts inside them
    wide = console_table(summary_of_math(), MathWorkflow.table_metrics, width=1000)
    assert "rollout_tok_s" in wide.splitlines()[0] and "rollout_tok_s" not in lines[0]
    errors = summary_of_math().with_columns(pl.when(pl.col("round") == 1).then(520).otherwise(pl.col("reward_errors")).alias("reward_errors"))
    assert "reward_errors" in console_table(errors, MathWorkflow.table_metrics).splitlines()[0]


def store_with_errors(path: Path, round_: int = 0) -> tuple[Path, int]:
    """A store whose round's steps carry a reward_error on every row of one problem."""
    steps = synthetic_steps(n_problems=4, samples=2, seed=0, full=True).with_columns(pl.lit(round_, pl.Int32).alias("round"))
    bad = steps["uid"][0]
    steps = steps.with_columns(
        pl.when(pl.col("uid") == bad).then(pl.lit("step('solver'): ZeroDivisionError: division by zero")).otherwise(None).alias("reward_error"),
        pl.when(pl.col("uid") == bad).then(None).otherwise(pl.col("reward")).alias("reward"),
    )
    Tables(path).write(round_, "steps", steps)
    return path, int((steps["uid"] == bad).sum())


def test_a_round_whose_workflow_raised_says_so_on_its_line(tmp_path):
    store, n = store_with_errors(tmp_path / "s")
    line = round_line({"round": 0, "solver_acc": 0.5, "reward_errors": n, "train_rows": 10, "train_steps": 1}, {"solver_acc": 0.4},
                      MathWorkflow.table_metrics, seconds=12, total_seconds=30, peak_mb=700)
    assert f"round 0 | {n} rows with a reward_error | solver_acc" in line and len(line) <= LINE_WIDTH
    lines = reward_error_lines(store, 0)
    assert lines[0].startswith(f"  round 0: {n} of ") and "rows carry a reward_error" in lines[0]
    assert "ZeroDivisionError: division by zero" in " ".join(lines)
    assert max(map(len, lines)) <= LINE_WIDTH
    query = next(line for line in lines if "SELECT" in line)
    assert "reward_error IS NOT NULL" in query
    assert reward_error_lines(_clean_store(tmp_path), 0) == []
    # a store path too long for one line: the command is split with a backslash, never wider
    long = reward_error_lines(store, 0, shown_store="/" + "x" * 60)
    assert max(map(len, long)) <= LINE_WIDTH and long[-2].endswith("\\") and long[-1].lstrip().startswith('"SELECT')


def _clean_store(tmp_path: Path) -> Path:
    steps = synthetic_steps(n_problems=2, samples=2, seed=0, full=True).with_columns(pl.lit(0, pl.Int32).alias("round"))
    Tables(tmp_path / "clean").write(0, "steps", steps)
    return tmp_path / "clean"


FLAKY = '''
"""The relay of examples/relay.py, whose step raises on the problems whose second term is even."""
import sys

sys.path.insert(0, {examples!r})
from relay import Relay, RelayEnv


class FlakyEnv(RelayEnv):
    def step(self, agent_id, text):
        if self.terms[1] % 2 == 0 and agent_id == "second":
            raise ZeroDivisionError("division by zero")
        return super().step(agent_id, text)


class Flaky(Relay):
    name = "flaky"

    def reset(self, problem, strategy):
        return FlakyEnv(problem)
'''


def test_maxit_run_names_the_rows_whose_workflow_code_raised(tmp_path, default_model_dir):
    """A user's workflow whose `step` raises on some problems (the issue's case: rows carrying a
    reward_error and not a word of it on the console): the round's line says how many, the lines
    under it give the first error and the query that lists them, and the query does."""
    flaky = tmp_path / "flaky.py"
    flaky.write_text(textwrap.dedent(FLAKY.format(examples=str(Path(__file__).resolve().parents[1] / "examples"))))
    store = tmp_path / "store"
    argv = [MAXIT, "run", "--workflow", f"{flaky}:Flaky", "--rounds", "1", "--store", str(store), "--engine", "hf", "--model-dir", str(default_model_dir),
            "--problems", "6", "--samples", "2", "--strategies", "iid", "--eval-problems", "4", "--eval-samples", "1", "--epochs", "1"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=1800, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = pl.read_parquet(store / "round=0" / "steps.parquet")
    n = int(steps["reward_error"].is_not_null().sum())
    assert 0 < n < steps.height, steps["reward_error"].unique().to_list()  # round 0 draws 2 such problems of 6
    lines = proc.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("round 0 |"))
    assert f"| {n} rows with a reward_error |" in lines[at]
    assert len(lines) > at + 3, proc.stdout
    assert lines[at + 1].startswith(f"  round 0: {n} of {steps.height} rows carry a reward_error") and "ZeroDivisionError" in " ".join(lines[at + 1:at + 4])
    assert any(f"maxit sql --store {store}" in line for line in lines[at:])
    assert max(map(len, (proc.stdout + proc.stderr).splitlines())) <= LINE_WIDTH
    query = next(line for line in lines[at:] if "SELECT" in line).split('"', 1)[1].rstrip('"')
    from pipeline.store.analysis import run_sql

    listed = run_sql(query, store)
    assert listed.height == n and listed["reward_error"].str.contains("ZeroDivisionError").all()
    assert subprocess.run([MAXIT, "sql", query, "--store", str(store)], capture_output=True, text=True, timeout=300).returncode == 0


@pytest.mark.parametrize("width", [LINE_WIDTH, 60])
def test_say_keeps_lines_within_the_width(width, capsys):
    from maxit.common import say

    say("maxit run: note: " + " ".join(["word"] * 80), width)
    out = capsys.readouterr().out.splitlines()
    assert len(out) > 1 and max(map(len, out)) <= width and out[1].startswith("  word")
