"""`maxit report`: a self-contained HTML page of one or more stores (plotly.js inlined), and what
headless Chromium makes of it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.report import build_report, store_metrics
from pipeline.rounds import record_timing
from pipeline.store import table_path, write_table
from pipeline.synthetic import synthetic_steps

MAXIT = str(Path(sys.executable).with_name("maxit"))


def make_store(path: Path, rounds: int, skill: float, with_timings: bool = True) -> Path:
    """A store with the tables a report reads: steps (synthetic rollouts), evaluation (round -1
    and every round), ratio_diagnostics and timings."""
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
             "first_step_log_ratio": [0.0], "clip_fraction": [0.1], "masked_fraction": [0.0], "truncated_fraction": [0.0], "ess_fraction": [0.9], "kl": [0.002]},
            schema_overrides={"round": pl.Int32},
        )
        write_table(diag, table_path(path, r, "ratio_diagnostics"), "ratio_diagnostics")
        if with_timings:
            for stage, seconds in (("problems", 0.1), ("rollouts", 5.0 + r), ("advantages", 0.2), ("view", 0.5), ("training", 7.0), ("evaluation", 3.0), ("other", 1.0)):
                record_timing(path, r, stage, seconds)
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
    assert {t["name"] for t in stages} == {"problems", "rollouts", "advantages", "view", "training", "evaluation", "other"}
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
