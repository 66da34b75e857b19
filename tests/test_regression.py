"""The regression warning: a held-out metric that fell from its best by more than noise, named on
the round's line, in the round table (`maxit report --markdown`) and at the end of `maxit run`."""

from __future__ import annotations

import math

import polars as pl
import pytest

from maxit.run_commands import regressed_lines
from pipeline.errors import DataError
from pipeline.reporting.regression import Regression, balanced_accuracy_se, regressions, round_regressions, standard_error, with_standard_errors
from pipeline.reporting.markdown import markdown_round_table
from pipeline.reporting.report import REGRESSED_COLUMN, round_line, round_summary
from pipeline.workflows.math import MathWorkflow
from test_report import make_store


def rows(values: dict[tuple[str, str], list[float]], n: int = 400, first_round: int = -1) -> pl.DataFrame:
    out = []
    for (agent, metric), series in values.items():
        for i, v in enumerate(series):
            out.append({"round": first_round + i, "policy_id": "shared", "agent_id": agent, "split": "heldout", "metric": metric, "value": v, "n": n})
    return pl.DataFrame(out, schema_overrides={"round": pl.Int32, "n": pl.Int64})


# issue 45's seed-0 run, rounds 12-19 of the Solver's held-out accuracy (200 problems x 2 samples)
SOLVER_12_19 = [0.955, 0.962, 0.95, 0.955, 0.972, 0.968, 0.902, 0.932]


def test_standard_error_is_binomial_and_finite_at_the_ends():
    assert standard_error(0.5, 400) == pytest.approx(0.025)
    assert standard_error(0.9, 100) == pytest.approx(0.03)
    assert standard_error(1.0, 400) == pytest.approx(standard_error(0.0, 400))
    assert 0 < standard_error(1.0, 400) < 0.004
    with pytest.raises(DataError, match="n must be >= 1"):
        standard_error(0.5, 0)
    with pytest.raises(DataError, match=r"in \[0, 1\]"):
        standard_error(1.5, 10)


def test_the_issues_slide_is_named_with_its_best_round():
    ev = rows({("solver", "accuracy"): SOLVER_12_19}, first_round=12)
    [reg] = regressions(ev, round_=18)
    assert (reg.agent_id, reg.metric, reg.round, reg.best_round) == ("solver", "accuracy", 18, 16)
    assert reg.drop == pytest.approx(0.07)
    se = math.hypot(math.sqrt(0.972 * 0.028 / 400), math.sqrt(0.902 * 0.098 / 400))
    assert reg.se == pytest.approx(se)
    assert reg.z == pytest.approx(0.07 / se)
    assert reg.describe() == f"solver accuracy 90.2% < 97.2% (round 16, {0.07 / se:.1f} se)"
    assert reg.describe("solver_acc").startswith("solver_acc 90.2% < 97.2%")
    # the latest round by default: round 19 is still 4 points under, > 2 se of the difference
    assert [r.round for r in regressions(ev)] == [19]
    # round 17 (-0.4) and the best round itself are not regressions
    assert regressions(ev, round_=17) == []
    assert regressions(ev, round_=16) == []


def test_a_fall_inside_the_noise_is_not_named():
    # 2 se of the difference at n=400 near 90% is about 4.2 points: 3 points is noise
    ev = rows({("solver", "accuracy"): [0.88, 0.93, 0.90]})
    assert regressions(ev) == []
    assert [r.metric for r in regressions(ev, z=1.0)] == ["accuracy"]
    # the same fall measured on 10x the samples is real
    assert [r.metric for r in regressions(rows({("solver", "accuracy"): [0.88, 0.93, 0.90]}, n=4000))] == ["accuracy"]


def test_metrics_default_to_proportions_and_can_be_chosen():
    ev = rows({
        ("solver", "accuracy"): [0.5, 0.9, 0.6],
        ("verifier", "calls"): [1.0, 1.9, 1.2],          # not a proportion: never judged by default
        ("verifier", "approve_rate"): [0.3, 0.9, 0.5],  # a proportion, judged unless the caller leaves it out
    })
    assert [(r.agent_id, r.metric) for r in regressions(ev)] == [("solver", "accuracy"), ("verifier", "approve_rate")]
    assert [(r.agent_id, r.metric) for r in regressions(ev, metrics=[("solver", "accuracy"), ("team", "success")])] == [("solver", "accuracy")]


def test_the_starting_model_counts_as_a_best():
    ev = rows({("team", "success"): [0.6, 0.4, 0.45]})  # round -1 is the best
    [reg] = regressions(ev)
    assert reg.best_round == -1 and reg.round == 1


def test_a_given_standard_error_replaces_the_binomial_one():
    ev = rows({("verifier", "verdict_balanced_accuracy"): [0.9, 0.8]})
    assert regressions(ev)  # 10 points at n=400: > 2 se
    noisy = ev.with_columns(se=pl.lit(0.06))  # e.g. a balanced accuracy whose rare class has ~20 answers
    assert regressions(noisy) == []
    assert regressions(ev.with_columns(se=pl.lit(None, pl.Float64)))  # a null se: the binomial one
    with pytest.raises(DataError, match="se must be a finite number > 0"):
        regressions(ev.with_columns(se=pl.lit(0.0)))


def test_bad_rows_are_one_clear_error():
    ev = rows({("solver", "accuracy"): [0.5, 0.6]})
    with pytest.raises(DataError, match=r"lack the column\(s\) \['n'\]"):
        regressions(ev.drop("n"))
    with pytest.raises(DataError, match=r"several rows in round\(s\) \[0\]"):
        regressions(pl.concat([ev, ev.filter(pl.col("round") == 0)]))
    with pytest.raises(DataError, match="z must be"):
        regressions(ev, z=0)
    assert regressions(ev.head(0)) == []


def test_regression_is_a_plain_record():
    reg = Regression("solver", "accuracy", 3, 0.8, 1, 0.9, 0.02)
    assert reg.drop == pytest.approx(0.1) and reg.z == pytest.approx(5.0)


def test_a_balanced_accuracy_is_as_noisy_as_its_rarer_class():
    # 388 right answers judged at tpr 0.98, 12 wrong ones at tnr 0.5: balanced 0.74, plain accuracy
    b, plain = (0.98 + 0.5) / 2, (0.98 * 388 + 0.5 * 12) / 400
    exact = 0.5 * math.sqrt(0.98 * 0.02 / 388 + 0.25 / 12)
    assert balanced_accuracy_se(b, 388, 12, accuracy=plain) == pytest.approx(exact)
    assert exact > 3 * standard_error(b, 400)  # what the row's n=400 alone would claim
    # without the plain accuracy: the largest error of any rates with that mean, at least the exact one
    bound = balanced_accuracy_se(b, 388, 12)
    assert exact <= bound < 1.05 * exact
    for tpr in (0.5, 0.7, 0.9, 0.99):
        assert bound >= 0.5 * math.hypot(standard_error(tpr, 388), standard_error(2 * b - tpr, 12)) - 1e-12
    with pytest.raises(DataError, match="both classes need a sample"):
        balanced_accuracy_se(0.7, 400, 0)


def verifier_rounds(series: list[tuple[float, float, float]], n: int = 400) -> pl.DataFrame:
    """Evaluation rows from round -1 on: (Solver accuracy, Verifier tpr, tnr) per round, the
    Verifier's plain, balanced and greedy balanced accuracy as the math evaluation writes them."""
    out = []
    for i, (acc, tpr, tnr) in enumerate(series):
        n_pos = round(acc * n)
        plain = (tpr * n_pos + tnr * (n - n_pos)) / n
        out += [
            {"round": i - 1, "agent_id": "solver", "metric": "accuracy", "value": n_pos / n, "n": n},
            {"round": i - 1, "agent_id": "solver", "metric": "accuracy_hint", "value": 0.9 - 0.2 * i, "n": n},
            {"round": i - 1, "agent_id": "verifier", "metric": "verdict_accuracy", "value": plain, "n": n},
            {"round": i - 1, "agent_id": "verifier", "metric": "verdict_balanced_accuracy", "value": (tpr + tnr) / 2, "n": n},
            {"round": i - 1, "agent_id": "verifier", "metric": "verdict_balanced_accuracy_greedy", "value": (tpr + tnr) / 2, "n": n},
        ]
    return pl.DataFrame(out, schema_overrides={"round": pl.Int32, "n": pl.Int64}).with_columns(policy_id=pl.lit("shared"), split=pl.lit("heldout"))


def test_the_balanced_accuracies_get_their_classes_errors():
    ev = verifier_rounds([(0.5, 0.6, 0.6), (0.97, 0.98, 0.5)])
    se = with_standard_errors(ev)
    got = {(r["round"], r["metric"]): r["se"] for r in se.iter_rows(named=True)}
    assert got[(0, "verdict_balanced_accuracy")] == pytest.approx(balanced_accuracy_se(0.74, 388, 12, accuracy=(0.98 * 388 + 6) / 400))
    assert got[(0, "verdict_balanced_accuracy_greedy")] == pytest.approx(balanced_accuracy_se(0.74, 388, 12))
    assert got[(-1, "verdict_balanced_accuracy")] == pytest.approx(balanced_accuracy_se(0.6, 200, 200))
    assert got[(0, "accuracy")] is None and got[(0, "verdict_accuracy")] is None
    # without an accuracy row over the same answers, a balanced accuracy keeps the binomial error
    alone = with_standard_errors(ev.filter(pl.col("metric") != "accuracy"))
    assert alone["se"].null_count() == alone.height


def test_round_regressions_name_the_table_columns_and_skip_the_hinted_context():
    # a Verifier whose "no" on wrong answers falls while the Solver's wrong answers get rare
    ev = verifier_rounds([(0.5, 0.6, 0.6), (0.8, 0.9, 0.9), (0.97, 0.98, 0.88), (0.97, 0.98, 0.76), (0.97, 0.98, 0.3)])
    found = round_regressions(ev, MathWorkflow.table_metrics)
    assert list(found) == [3]
    assert found[3].startswith("verifier_bal_acc 64.0% < 93.0% (round 1, ") and "verifier_bal_greedy 64.0%" in found[3]
    assert "with_hint" not in found[3] and "accuracy_hint" not in found[3]  # 0.9 -> 0.1 by design
    # read on n = 400, round 2's dip (93 -> 87 points, 12 wrong answers judged) would be named too
    assert list(round_regressions(ev.filter(pl.col("metric") != "accuracy"), MathWorkflow.table_metrics)) == [2, 3]
    assert round_regressions(ev.head(0), MathWorkflow.table_metrics) == {}


def test_a_games_falling_loss_and_draw_rates_are_not_regressions():
    # tic-tac-toe's round table: losses turn into draws and wins; only the win rate is judged
    metrics = (("team", "win_vs_scripted", "win_scripted"), ("team", "draw_vs_scripted", "draw_scripted"),
               ("team", "loss_vs_scripted", "loss_scripted"), ("team", "illegal_vs_scripted", "illegal_scripted"))
    ev = rows({("team", "win_vs_scripted"): [0.1, 0.2, 0.05], ("team", "draw_vs_scripted"): [0.4, 0.1, 0.1],
               ("team", "loss_vs_scripted"): [0.5, 0.1, 0.1], ("team", "illegal_vs_scripted"): [0.3, 0.0, 0.0]}, n=800)
    found = round_regressions(ev, metrics)
    assert list(found) == [1]
    assert found[1].startswith("win_scripted 5.0% < 20.0% (round 0, ") and "loss_" not in found[1] and "draw_" not in found[1]


def test_the_round_line_the_table_and_the_run_name_a_regressed_round(tmp_path):
    store = make_store(tmp_path / "s", rounds=4, skill=0.5)
    ev_path = tmp_path / "s" / "round=3" / "evaluation.parquet"
    ev = pl.read_parquet(ev_path).with_columns(value=pl.when(pl.col("metric") == "accuracy").then(0.3).otherwise(pl.col("value")))
    ev.write_parquet(ev_path)  # round 3's Solver accuracy falls from 60% (round 2) to 30%, n = 100
    table = round_summary(store, [-1, 0, 1, 2, 3], MathWorkflow.table_metrics)
    assert table[REGRESSED_COLUMN].to_list() == [None, None, None, None, table[REGRESSED_COLUMN][4]]
    assert table[REGRESSED_COLUMN][4].startswith("solver_acc 30.0% < 60.0% (round 2, ")
    start = table.row(0, named=True)
    line = round_line(table.row(4, named=True), start, MathWorkflow.table_metrics, 10.0, 50.0, 900.0)
    assert line.endswith("| under best by > 2 se: solver_acc") and line.startswith("round 3 | solver_acc 30.0%")
    assert "under best" not in round_line(table.row(3, named=True), start, MathWorkflow.table_metrics)
    assert f"`{REGRESSED_COLUMN}`" in markdown_round_table(store)
    assert "| solver_accuracy 30.0% < 60.0% (round 2, " in markdown_round_table(store)
    [last] = regressed_lines(table)
    assert last.startswith("held-out metrics under their best by more than 2 standard errors in round 3: ")
    assert last.endswith(table[REGRESSED_COLUMN][4])
    # rounds without a fall: no column, no line
    quiet = round_summary(store, [-1, 0, 1, 2], MathWorkflow.table_metrics)
    assert REGRESSED_COLUMN not in quiet.columns and regressed_lines(quiet) == []
