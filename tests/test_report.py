"""`maxit report`: a self-contained HTML page of one or more stores (plotly.js inlined), and what
headless Chromium makes of it; the round table as markdown (`--markdown`) and as the one line
per round `maxit run` prints."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.run import LINE_WIDTH
from pipeline.run.experiment_record import record_experiment
from pipeline.reporting.html_report import build_report, store_metrics
from pipeline.reporting.markdown import markdown_round_table
from pipeline.reporting.report import console_table, reward_error_lines, round_line, round_summary, table_metrics_of
from pipeline.run.timings import record_timings
from pipeline.store import Tables, table_path, write_table
from pipeline.rollout.synthetic import synthetic_steps
from pipeline.workflows.code import CodeWorkflow
from pipeline.workflows.grid import GridWorkflow
from pipeline.workflows.math import MathWorkflow, SingleWorkflow

MAXIT = str(Path(sys.executable).with_name("maxit"))


OLD_TIMINGS = (("problems", 0.1), ("advantages", 0.2), ("view", 0.5), ("training", 7.0), ("evaluation", 3.0), ("other", 1.0))
"""A round's timings as a store written before the stages had one name each labelled them."""


def make_store(path: Path, rounds: int, skill: float, with_timings: bool = True) -> Path:
    """A store with the tables a report reads: steps (synthetic rollouts), evaluation (round -1
    and every round), ratio_diagnostics and timings (round 0's written by this maxit, later
    rounds' with the labels of a store written before, "view" and "training")."""
    for r in range(-1, rounds):
        metrics = {"accuracy": skill + 0.05 * r, "accuracy_greedy": skill + 0.1 + 0.05 * r, "accuracy_hint": skill + 0.2,
                   "verdict_accuracy": 0.6, "verdict_balanced_accuracy": 0.55 + 0.02 * r}
        ev = pl.DataFrame(
            {"round": [r] * len(metrics), "policy_id": "shared", "agent_id": ["solver"] * 3 + ["verifier"] * 2, "split": "heldout",
             "metric": list(metrics), "value": list(metrics.values()), "n": [100] * len(metrics)},
            schema_overrides={"round": pl.Int32, "n": pl.Int64},
        )
        write_table(ev, table_path(path, r, "evaluation"), "evaluation")
        if r < 0:
            continue
        steps = synthetic_steps(n_problems=6, samples=2, seed=r, full=True).with_columns(pl.lit(r, pl.Int32).alias("round"))
        write_table(steps, table_path(path, r, "steps"))
        diag = pl.DataFrame(
            {"round": [r], "policy_id": ["shared"], "agent_id": ["*"], "strategy": ["*"], "rows": [10], "tokens": [100], "mean_log_ratio": [0.01 * r],
             "first_step_log_ratio": [0.0], "clip_fraction": [0.1], "masked_fraction": [0.0], "truncated_fraction": [0.0], "truncated_token_fraction": [0.0], "ess_fraction": [0.9], "kl": [0.002],
             "staleness": [0]},
            schema_overrides={"round": pl.Int32, "staleness": pl.Int32},
        )
        write_table(diag, table_path(path, r, "ratio_diagnostics"), "ratio_diagnostics")
        if with_timings and r == 0:
            record_timings(Tables(path), r, {{"view": "training_view", "training": "policy"}.get(k, k): v for k, v in OLD_TIMINGS} | {"rollouts": 5.0 + r})
        elif with_timings:
            old = [("rollouts", 5.0 + r), *OLD_TIMINGS]
            frame = pl.DataFrame({"round": [r] * len(old), "stage": [k for k, _ in old], "seconds": [v for _, v in old]}, schema_overrides={"round": pl.Int32})
            frame.write_parquet(table_path(path, r, "timings"))
    return path


@pytest.fixture
def stores(tmp_path):
    return [make_store(tmp_path / "exp-a", 3, 0.3), make_store(tmp_path / "exp-b", 2, 0.4, with_timings=False)]


def figure_data(page: str, name: str) -> list[dict]:
    """The traces plotly was given for the figure `name` (its Plotly.newPlot call's data)."""
    m = re.search(r'Plotly\.newPlot\(\s*"fig-' + name + r'",\s*(\[.*?\]),\s*\{', page, re.S)
    assert m, f"no figure {name}"
    return json.loads(m.group(1))


def test_report_draws_every_section_for_every_store(stores, tmp_path):
    out = build_report(stores, tmp_path / "r" / "report.html")
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # self-contained: plotly.js is inlined once, nothing is loaded from the network
    assert len(re.findall(r'<div id="fig-', page)) == 6
    assert page.count("plotly.js v") >= 1  # the library's own banner: inlined
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", page)
    solver = figure_data(page, "heldout")
    names = {t["name"] for t in solver}
    assert {"exp-a · accuracy", "exp-a · accuracy_greedy", "exp-a · accuracy_hint", "exp-b · accuracy"} <= names
    a_acc = next(t for t in solver if t["name"] == "exp-a · accuracy")
    assert a_acc["x"] == [-1, 0, 1, 2] and a_acc["y"] == pytest.approx([0.25, 0.3, 0.35, 0.4])
    colours = {t["name"].split(" · ")[0]: t["line"]["color"] for t in solver}
    assert colours["exp-a"] != colours["exp-b"]
    verifier = figure_data(page, "agents")
    assert {t["name"] for t in verifier} == {"exp-a · verifier · verdict_balanced_accuracy", "exp-b · verifier · verdict_balanced_accuracy"}
    success = figure_data(page, "success_by_strategy")
    assert {t["name"] for t in success} == {"exp-a", "exp-b"} and len(success) == 2 * 3  # 2 stores x 3 strategies
    ratio = figure_data(page, "ratio_diagnostics")
    assert len(ratio) == 2 * 5
    speed = figure_data(page, "rollout_speed")
    assert [t["name"] for t in speed] == ["exp-a"]  # exp-b has no timings: no speed, no stage bars
    stages = figure_data(page, "time_per_stage")
    assert {t["name"] for t in stages} == {"problems", "rollouts", "advantages", "training_view", "policy", "evaluation", "other"}
    policy = next(t for t in stages if t["name"] == "policy")
    assert policy["x"] == [0, 1, 2] and policy["y"] == [7.0] * 3  # the old stores' "training" rows, read as the stage's name
    metrics = store_metrics(stores[0])
    tokens = metrics["speed"].filter(pl.col("round") == 1)
    steps = pl.read_parquet(table_path(stores[0], 1, "steps"))
    assert tokens["tokens_per_s"][0] == pytest.approx(steps["completion_ids"].list.len().sum() / 6.0)
    assert speed[0]["y"][1] == pytest.approx(tokens["tokens_per_s"][0])


def test_report_command_and_bad_input(stores, tmp_path):
    out = tmp_path / "cli.html"
    proc = subprocess.run([MAXIT, "report", "--store", str(stores[0]), "--store", str(stores[1]), "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file() and "report of 2 store(s)" in proc.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([MAXIT, "report", "--store", str(empty), "--out", str(tmp_path / "x.html")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not a store" in bad.stderr
    assert not (tmp_path / "x.html").exists()
    # an --out that is a folder is named before the stores are read
    folder = subprocess.run([MAXIT, "report", "--store", str(stores[0]), "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert folder.returncode == 2 and f"--out {tmp_path}: is a folder" in folder.stderr


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium); the HTML is still checked by test_report_draws_every_section_for_every_store")
    return exe


def test_report_renders_in_headless_chromium(stores, tmp_path):
    """The page draws offline: a screenshot of it is not blank and has the stores' colours."""
    from PIL import Image, ImageStat

    exe = chromium()
    page = build_report(stores, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1200,2000",
         "--virtual-time-budget=10000", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert shot.is_file(), proc.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 2000)
    stat = ImageStat.Stat(img)
    assert max(stat.var) > 100, f"blank screenshot (variance {stat.var})"
    colours = {c for _count, c in img.getcolors(maxcolors=1 << 20)}
    # the first two stores' line colours (plotly's #636EFA and #EF553B) are on the page: the
    # figures were drawn, not only the HTML table
    assert (0x63, 0x6E, 0xFA) in colours and (0xEF, 0x55, 0x3B) in colours


# -- the round table: one line per round, and as markdown ------------------------------------------

MATH_ROW = {"round": 3, "solver_acc": 0.818, "greedy": 0.945, "with_hint": 0.692, "verifier_acc": 0.8, "verifier_bal_acc": 0.75, "verifier_bal_greedy": 0.77,
            "success_iid": 0.7, "train_rows": 1647, "train_steps": 14, "rollout_tok_s": 500.0, "s_policy": 121}


def test_round_line_of_the_math_workflow():
    line = round_line(MATH_ROW, {"round": -1, "solver_acc": 0.443}, MathWorkflow.table_metrics, seconds=148.4, total_seconds=712, peak_mb=2210.4)
    assert line == "round 3 | solver_acc 81.8% (+37.5 since start) | greedy 94.5% | 1647 rows/14 steps | 148s, 712s in all | peak 2210 MB"
    assert len(line) <= LINE_WIDTH


@pytest.mark.parametrize(
    "workflow, row, expected",
    [
        (SingleWorkflow, {"round": 0, "solver_acc": 0.58, "greedy": 0.77, "with_hint": 0.605, "train_rows": 1041, "train_steps": 1},
         "round 0 | solver_acc 58.0% (+13.8 since start) | greedy 77.0% | 1041 rows/1 step | 63s, 70s in all | peak 900 MB"),
        (GridWorkflow, {"round": 4, "success": 0.705, "greedy": 0.64, "planner_reward": 0.587, "mover_reward": 0.578, "mover_follows": 0.946},
         "round 4 | success 70.5% (+28.5 since start) | greedy 64.0% | planner_reward 58.7% | 63s, 70s in all | peak 900 MB"),
        (CodeWorkflow, {"round": 1, "success": None, "greedy": 0.5, "solved": 0.25, "coder_reward": 2.5, "tester_reward": 0.1},
         "round 1 | success - | greedy 50.0% | solved 25.0% | coder_reward 2.500 | 63s, 70s in all | peak 900 MB"),
    ],
)
def test_round_line_of_other_workflows(workflow, row, expected):
    """The workflow's own metrics, in its order, as many as fit (the last ones are left out)."""
    start = {"round": -1, "success": 0.42, "solver_acc": 0.442}
    line = round_line(row, start, workflow.table_metrics, seconds=63, total_seconds=70, peak_mb=900)
    assert line == expected and len(line) <= LINE_WIDTH


def test_round_line_leaves_out_what_does_not_fit_the_least_watched_first():
    start = {"round": -1, "solver_acc": 0.5}
    big = {**MATH_ROW, "train_rows": 12_345_678, "train_steps": 98_765}
    full = round_line(big, start, MathWorkflow.table_metrics, seconds=86_399, total_seconds=999_999, peak_mb=1_234_567)
    assert len(full) <= LINE_WIDTH
    # the training counts go before the memory, the seconds and the second metric
    assert "rows" not in full and "peak 1234567 MB" in full and "greedy 94.5%" in full
    assert round_line(big, start, MathWorkflow.table_metrics, width=61) == "round 3 | solver_acc 81.8% (+31.8 since start) | greedy 94.5%"
    # a column name too long for any line: cut, never wider
    long = [("solver", "accuracy", "x" * 200)]
    cut = round_line({"round": 0, "x" * 200: 0.5}, None, long)
    assert len(cut) == LINE_WIDTH and cut.startswith("round 0 | xxx") and cut.endswith("…")
    # a non-fraction first metric: its change in its own units
    assert round_line({"round": 0, "r": 2.5}, {"round": -1, "r": 2.0}, [("a", "reward", "r")]) == "round 0 | r 2.500 (+0.500 since start)"


def test_round_line_of_every_round_of_a_store_fits(stores):
    metrics = MathWorkflow.table_metrics
    table = round_summary(stores[0], [-1, 0, 1, 2], metrics)
    start = table.row(0, named=True)
    for row in table.iter_rows(named=True):
        if row["round"] < 0:
            continue
        line = round_line(row, start, metrics, seconds=10, total_seconds=30, peak_mb=500)
        assert len(line) <= LINE_WIDTH
        assert line.startswith(f"round {row['round']} | solver_acc {100 * row['solver_acc']:.1f}% ({100 * (row['solver_acc'] - start['solver_acc']):+.1f} since start)")


def test_round_summary_sums_training_counts_over_policies(stores):
    from pipeline.store.registry import PolicyRegistry

    registry = PolicyRegistry(stores[0])
    (stores[0] / "ckpt").mkdir()
    for r, (rows_a, rows_b) in enumerate([(10, 20), (30, 40)]):
        registry.register(r, "solver", stores[0] / "ckpt", metrics={"rows": rows_a, "steps": 1, "mean_loss": 0.5})
        registry.register(r, "verifier", stores[0] / "ckpt", metrics={"rows": rows_b, "steps": 2})
    table = round_summary(stores[0], [-1, 0, 1, 2])
    assert table["train_rows"].to_list() == [None, 30, 70, None] and table["train_steps"].to_list() == [None, 3, 3, None]
    # a store without such entries has no such columns
    assert "train_rows" not in round_summary(stores[1], [-1, 0, 1]).columns


def recorded(store: Path, **settings) -> Path:
    from pipeline.run.settings import Settings

    record_experiment(store, Settings(**settings), "hf")
    return store


def markdown_rows(block: str) -> tuple[str, list[str], list[list[str]]]:
    """(header line, column names, cells of every row) of one store's markdown block."""
    lines = block.splitlines()
    assert lines[1] == "", block
    columns = [c.strip().strip("`") for c in lines[2].strip("|").split("|")]
    assert lines[3] == "|" + "---:|" * len(columns)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[4:]]
    assert all(len(cells) == len(columns) for cells in rows), block
    return lines[0], columns, rows


def test_markdown_round_table(stores):
    store = recorded(stores[0], seed=3, algorithm="drmas")
    header, columns, rows = markdown_rows(markdown_round_table(store))
    assert header == f"store {store}: workflow math, algorithm drmas, seed 3; 3 complete round(s); fractions in percent, s_<stage> in seconds"
    assert columns[:6] == ["round", "solver_acc", "greedy", "with_hint", "verifier_acc", "verifier_bal_acc"]
    assert {"success_feedback", "success_iid", "success_prompt_aug", "rollout_tok_s", "s_rollouts", "s_training_view", "s_policy", "s_other"} <= set(columns)
    assert rows[2][columns.index("s_policy")] == "7" and rows[2][columns.index("s_training_view")] == "0"  # old labels, read as the names
    assert [r[0] for r in rows] == ["-1 (start)", "0", "1", "2"]
    # fractions in percent, the start row without round columns, seconds as whole numbers
    assert rows[0][1:3] == ["25.0", "35.0"] and rows[3][1] == "40.0"
    assert rows[0][columns.index("success_iid")] == "" and rows[1][columns.index("s_rollouts")] == "5"


def test_markdown_round_table_of_a_workflow_not_importable_here(stores):
    store = recorded(stores[1])
    record = json.loads((store / "experiment.json").read_text())
    record["settings"]["workflow"] = "gone_module:Team"  # a user's workflow of another machine
    (store / "experiment.json").write_text(json.dumps(record))
    header, columns, _rows = markdown_rows(markdown_round_table(store))
    assert header.startswith(f"store {store}: workflow gone_module:Team, algorithm maxit, seed 0; 2 complete round(s)")
    assert "(every held-out metric shown: its workflow cannot be rebuilt here: " in header and "\n" not in header
    assert columns[:6] == ["round", "solver_accuracy", "solver_accuracy_greedy", "solver_accuracy_hint", "verifier_verdict_accuracy", "verifier_verdict_balanced_accuracy"]
    assert table_metrics_of(store)[1] is not None


def test_report_markdown_command(stores, tmp_path):
    recorded(stores[0], seed=3)
    proc = subprocess.run([MAXIT, "report", "--markdown", "--store", str(stores[0]), "--store", str(stores[1])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    blocks = re.split(r"\n\n(?=store )", proc.stdout.rstrip("\n"))  # one block per store, a blank line between
    assert len(blocks) == 2
    header_a, columns_a, rows_a = markdown_rows(blocks[0])
    header_b, _columns_b, rows_b = markdown_rows(blocks[1])
    assert header_a.startswith(f"store {stores[0]}: workflow math, algorithm maxit, seed 3;")
    # exp-b has no experiment.json: what is not known is said so, and every held-out metric is shown
    assert header_b.startswith(f"store {stores[1]}: workflow not recorded, algorithm not recorded, seed not recorded; 2 complete round(s)")
    assert len(rows_a) == 4 and len(rows_b) == 3 and columns_a[1] == "solver_acc"
    # with --out as well: the HTML is written too, its line on stderr, stdout holds the tables only
    both = subprocess.run([MAXIT, "report", "--markdown", "--store", str(stores[0]), "--out", str(tmp_path / "r.html")], capture_output=True, text=True, timeout=300)
    assert both.returncode == 0 and (tmp_path / "r.html").is_file() and both.stdout.startswith(f"store {stores[0]}:") and "report of 1 store(s)" in both.stderr


def test_report_markdown_bad_input(stores, tmp_path):
    fresh = tmp_path / "fresh"
    (fresh / "round=-1").mkdir(parents=True)  # a run stopped before its first round finished
    for argv, message in (
        (["--store", str(fresh)], f"maxit report: error: store {fresh}: no completed round (no round=R/evaluation.parquet with R >= 0)"),
        (["--store", str(tmp_path / "nowhere")], f"maxit report: error: store {tmp_path / 'nowhere'}: not a store (no round folders, no experiment.json)"),
    ):
        # a good store first: a bad one among several prints no table at all
        proc = subprocess.run([MAXIT, "report", "--markdown", "--store", str(stores[0]), *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and proc.stderr.strip() == message and proc.stdout == ""
    neither = subprocess.run([MAXIT, "report", "--store", str(stores[0])], capture_output=True, text=True, timeout=300)
    assert neither.returncode == 2 and "needs --out FILE.html (the HTML report) or --markdown" in neither.stderr


def test_settings_changes_names_what_a_continued_store_changes(tmp_path):
    """`maxit run` on a store with complete rounds and other settings than it last ran with says
    which (the note of maxit.run_commands.cmd_run): each differing setting by flag with its old value;
    nothing for a new store, the same settings, or a store whose rounds never completed."""
    from dataclasses import replace

    from pipeline.run.experiment_record import settings_changes
    from pipeline.run.settings import Settings

    store = tmp_path / "s"
    first = Settings(lr=1e-5, problems=16)
    record_experiment(store, first, "hf")
    assert settings_changes(store, Settings(lr=2e-5, problems=16)) == []  # no complete round yet
    (store / "round=0").mkdir()
    (store / "round=0" / "evaluation.parquet").write_bytes(b"")
    assert settings_changes(store, first) == []
    assert settings_changes(store, Settings(lr=2e-5, problems=32, seed=first.seed)) == ["--problems 32 (was 16)", "--lr 2e-05 (was 1e-05)"]
    assert settings_changes(store, Settings(problems=16, seed=first.seed)) == ["--lr unset (was 1e-05)"]
    # booleans by the flag that sets them; sequences as typed; the evaluation cache is no change
    assert settings_changes(store, replace(first, shared_policy=False, strategies=("iid", "tree"), base_eval_cache=False)) == [
        "--separate-policies on (was off)", "--strategies iid tree (was iid prompt_aug feedback tree)"]
    # a switch left to the preset (None) against one set
    assert settings_changes(store, replace(first, balance_verdicts=True)) == ["--balance-verdicts on (was unset)"]
    # a preset's value that differs in effect (the record of another version's preset)
    record = json.loads((store / "experiment.json").read_text())
    record["effective"]["clip_high"] = 0.2
    (store / "experiment.json").write_text(json.dumps(record))
    assert settings_changes(store, first) == ["the preset's clip_high 0.28 (was 0.2)"]
    assert settings_changes(tmp_path / "new", Settings(lr=2e-5)) == []


def baselines_table(store: Path, note_vote: str | None = None) -> Path:
    """A `baselines` table as `maxit baselines` writes it: the team's 3.2 calls per problem, the
    single agent's 1, and the vote and refine at m = 3 (the vote a note when `note_vote`)."""
    values = {"team": (0.45, 3.2), "single": (0.30, 1.0), "best_of_k": (None if note_vote else 0.52, None if note_vote else 3.0), "self_refine": (0.33, 3.0)}
    rows = []
    for baseline, (success, calls) in values.items():
        for metric, value in (("success", success), ("team_reward", success), ("calls", calls)):
            rows.append({"round": -1, "baseline": baseline, "agent_id": "solver", "metric": metric, "value": value, "n": 400,
                         "calls_per_call": 1 if baseline in ("team", "single") else 3, "team_calls": 3.2, "calls_source": "steps: rows per iid trajectory",
                         "note": note_vote if baseline == "best_of_k" else None})
    from schemas import BASELINES, polars_schema

    write_table(pl.DataFrame(rows, schema=polars_schema(BASELINES)), table_path(store, -1, "baselines"), "baselines")
    return store


def test_the_baselines_are_shown_beside_the_team(stores, tmp_path):
    store = baselines_table(recorded(stores[0], seed=3))
    text = markdown_round_table(store)
    table, _, beside = text.partition("\n\nbaselines (")
    assert markdown_rows(table)[2][0][0] == "-1 (start)"  # the round table stays whole above
    assert beside.startswith("the starting model as a single agent at the team's budget; the team's calls per held-out problem: 3.20 (steps: rows per iid trajectory)")
    lines = beside.splitlines()
    assert lines[6] == "| single agent, untrained, best-of-3 majority vote | 3.00 | 52.0 | 0.52 |  |"
    assert lines[8] == "| team, start |  | 25.0 |  | evaluation `solver_acc` (solver accuracy) |"  # the Solver's own metric
    assert lines[9].startswith("| team, round 2 |  | 40.0 |")
    # the trained single agent's run, a sibling store, beside the team
    single = baselines_table(recorded(make_store(tmp_path / "exp-a-single", 2, 0.35), workflow="single"))
    assert single.name == f"{store.name}-single"
    beside = markdown_round_table(store).splitlines()
    assert beside[-4].startswith(f"| trained single agent, round 1 |  | 40.0 |  | evaluation `solver_acc` (solver accuracy)")
    # trained before its arm was played: the verdict says how to play it, and judges nothing
    assert beside[-2].startswith(f"verdict of store {store}: no trained arm to judge the team against yet")
    assert beside[-1] == f"arm single is trained but not played yet (maxit baselines --store {store} --arm single: its rounds are kept)"
    page = build_report([store], tmp_path / "b.html").read_text()
    assert "<h2>Budget-matched baselines</h2>" in page and "single agent, untrained, self-refine x3</td><td>3.00</td><td>33.0%</td>" in page
    # a baseline that does not apply is a row with its note, for any workflow; a store without the table shows none
    baselines_table(stores[1], note_vote="answers of workflow 'grid-single' do not compare")
    assert "| single agent, untrained, best-of-3 majority vote |  |  |  | answers of workflow 'grid-single' do not compare |" in markdown_round_table(recorded(stores[1], workflow="grid"))
    assert "\n\nbaselines (" not in markdown_round_table(recorded(make_store(tmp_path / "plain", 1, 0.3)))
    assert "no baselines computed (maxit baselines --store" in build_report([tmp_path / "plain"], tmp_path / "c.html").read_text()
