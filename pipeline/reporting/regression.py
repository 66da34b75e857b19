"""Did a round make things worse? Held-out metrics that fell from their best by more than noise.

Each `evaluation` row is a mean over `n` held-out samples of something in [0, 1] (an accuracy, a
success rate, a reward), so its sampling noise is at most the binomial standard error
sqrt(p (1 - p) / n). A metric has regressed at round r when its best value over the rounds up to
r (the starting model's round -1 included) exceeds its value at r by more than `z` standard
errors of that difference, sqrt(se_best^2 + se_r^2): both values are noisy, and the best of many
noisy rounds sits above the metric's level by itself, so the difference's error, not the latest
value's alone, is the yardstick.

A balanced accuracy (the mean of a rate on right answers and a rate on wrong ones) is as noisy as
its rarer class, not as its row's `n`: a Verifier judging 400 answers of which 12 are wrong has
a balanced accuracy about as noisy as a proportion over 48 samples. `with_standard_errors` gives
those rows an `se` from the class counts the round's other rows imply (`balanced_accuracy_se`).
What the errors leave out: samples of one problem are not independent (two answers to one
problem err together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence

import polars as pl

from pipeline.errors import DataError

__all__ = [
    "Regression", "standard_error", "balanced_accuracy_se", "with_standard_errors", "regressions", "round_regressions", "NOT_JUDGED",
    "NOT_JUDGED_PREFIXES", "Z",
]

REQUIRED = ("round", "agent_id", "metric", "value", "n")
Z = 2.0
"""How many standard errors of the difference a fall must exceed to be named."""
NOT_JUDGED = ("accuracy_hint",)
"""Metrics never judged: the hinted context is evaluated but never trained (its rows are trained
without the hint), so its decay is by design, not a round gone wrong."""
NOT_JUDGED_PREFIXES = ("loss_", "draw_", "illegal_")
"""Where no workflow says which of its metrics are higher-is-better (`round_regressions` without
`judged`: a store whose workflow cannot be rebuilt), metrics named like a game's that are not
(`loss_vs_scripted`, `illegal_vs_base`: lower is better; a draw rate rises as losses turn into
draws and falls as draws turn into wins) are not judged."""
BALANCED = "verdict_balanced_accuracy"
"""The prefix of the balanced-accuracy metrics (`verdict_balanced_accuracy`, `..._greedy`)."""


@dataclass(frozen=True)
class Regression:
    """A held-out metric of one round that is worse than its best by more than `z` standard errors."""

    agent_id: str
    """The agent (or "team") the metric belongs to."""
    metric: str
    """The metric's name (`evaluation.metric`)."""
    round: int
    """The round judged."""
    value: float
    """The metric at `round`."""
    best_round: int
    """The earliest round with the best value up to `round` (-1: the starting model)."""
    best: float
    """The best value up to `round`."""
    se: float
    """Standard error of the difference best - value."""

    @property
    def drop(self) -> float:
        """How far the metric fell from its best."""
        return self.best - self.value

    @property
    def z(self) -> float:
        """The fall in standard errors."""
        return self.drop / self.se

    def describe(self, name: str | None = None) -> str:
        """One short line, e.g. "solver accuracy 90.2% < 97.2% (round 16, 3.9 se)", the metric
        called `name` when given (a round table's column)."""
        label = name or f"{self.agent_id} {self.metric}"
        return f"{label} {100 * self.value:.1f}% < {100 * self.best:.1f}% (round {self.best_round}, {self.z:.1f} se)"


def standard_error(value: float, n: int) -> float:
    """Binomial standard error of a proportion `value` measured on `n` samples. The proportion is
    kept half a sample away from 0 and 1, so that a metric at 100% still has a finite noise (a
    single wrong answer must not read as an infinitely certain fall)."""
    if n < 1:
        raise DataError(f"standard_error: n must be >= 1, got {n}")
    if not 0.0 <= value <= 1.0:
        raise DataError(f"standard_error: a proportion must be in [0, 1], got {value}")
    p = min(max(value, 0.5 / n), 1 - 0.5 / n)
    return math.sqrt(p * (1 - p) / n)


def balanced_accuracy_se(balanced: float, n_pos: int, n_neg: int, accuracy: float | None = None) -> float:
    """Standard error of a balanced accuracy (tpr + tnr) / 2 whose rates are measured on their own
    classes, `n_pos` positives and `n_neg` negatives. The two rates are solved from the plain
    `accuracy` over both classes when it is given (and the classes differ in size); otherwise
    they are the pair with mean `balanced` whose error is the largest (a bound)."""
    if n_pos < 1 or n_neg < 1:
        raise DataError(f"balanced_accuracy_se: both classes need a sample, got {n_pos} and {n_neg}")
    lo, hi = max(0.0, 2 * balanced - 1), min(1.0, 2 * balanced)
    if accuracy is not None and n_pos != n_neg:
        # accuracy * n = tpr * n_pos + tnr * n_neg, with tnr = 2 * balanced - tpr
        tpr = (accuracy * (n_pos + n_neg) - 2 * balanced * n_neg) / (n_pos - n_neg)
    else:  # the vertex of the variance's parabola in tpr (it opens downwards)
        tpr = (n_neg + (4 * balanced - 1) * n_pos) / (2 * (n_pos + n_neg))
    tpr = min(max(tpr, lo), hi)
    return 0.5 * math.hypot(standard_error(tpr, n_pos), standard_error(min(max(2 * balanced - tpr, 0.0), 1.0), n_neg))


def with_standard_errors(evaluation: pl.DataFrame) -> pl.DataFrame:
    """`evaluation` with an `se` column: for a balanced accuracy (`verdict_balanced_accuracy*`),
    the error from its class counts, the right and wrong answers it judged, which the round's
    `accuracy` row over the same `n` answers gives (and the same agent's `verdict_accuracy`, its
    plain accuracy, the rates); null for every other row (binomial on its `n`), and for a
    balanced accuracy whose answers no `accuracy` row counts."""
    rows = evaluation.to_dicts()
    by_round: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        by_round.setdefault((row["round"], row["metric"]), []).append(row)
    se = []
    for row in rows:
        value, n = row["value"], row["n"]
        judged = [r for r in by_round.get((row["round"], "accuracy"), []) if r["n"] == n and r["value"] is not None]
        if not str(row["metric"]).startswith(BALANCED) or value is None or value != value or not judged:
            se.append(None)
            continue
        n_pos = round(judged[0]["value"] * n)
        plain = [r["value"] for r in by_round.get((row["round"], "verdict_accuracy"), []) if r["agent_id"] == row["agent_id"] and r["n"] == n]
        sampled = row["metric"] == BALANCED and plain and plain[0] is not None
        se.append(balanced_accuracy_se(value, n_pos, n - n_pos, plain[0] if sampled else None) if 0 < n_pos < n else None)
    return evaluation.with_columns(se=pl.Series("se", se, dtype=pl.Float64))


def regressions(
    evaluation: pl.DataFrame,
    *,
    metrics: Iterable[tuple[str, str]] | None = None,
    round_: int | None = None,
    z: float = Z,
) -> list[Regression]:
    """The metrics of `round_` (default: the latest round of `evaluation`) that fell from their
    best over the rounds up to it by more than `z` standard errors of the difference.

    `evaluation`: rows of the `evaluation` table over several rounds (`round, agent_id, metric,
    value, n`; an optional `se` column, where not null, replaces the binomial error of its row).
    `metrics`: (agent_id, metric) pairs to judge, each higher-is-better and in [0, 1] (e.g. a
    workflow's `table_metrics` pairs); None = every pair of the rows whose values all lie in [0, 1].
    A pair with no row at `round_` is not judged. Returned in the order of `metrics` (or of the rows)."""
    missing = [c for c in REQUIRED if c not in evaluation.columns]
    if missing:
        raise DataError(f"regressions: the evaluation rows lack the column(s) {missing}")
    if not (math.isfinite(z) and z > 0):
        raise DataError(f"regressions: z must be a finite number > 0, got {z!r}")
    rows = evaluation.filter(pl.col("value").is_not_null() & pl.col("value").is_not_nan())
    if rows.is_empty():
        return []
    if round_ is None:
        round_ = int(rows["round"].max())
    rows = rows.filter(pl.col("round") <= round_)
    if metrics is None:
        pairs = rows.group_by("agent_id", "metric", maintain_order=True).agg(ok=pl.col("value").is_between(0.0, 1.0).all())
        chosen: Sequence[tuple[str, str]] = [(a, m) for a, m, ok in pairs.iter_rows() if ok]
    else:
        chosen = list(metrics)
    out = []
    for agent_id, metric in chosen:
        mine = rows.filter((pl.col("agent_id") == agent_id) & (pl.col("metric") == metric)).sort("round")
        dup = mine.group_by("round").len().filter(pl.col("len") > 1)
        if dup.height:
            raise DataError(f"regressions: {agent_id} {metric} has several rows in round(s) {sorted(dup['round'].to_list())}")
        now = mine.filter(pl.col("round") == round_)
        if now.is_empty():
            continue
        best, value = mine.row(int(mine["value"].arg_max()), named=True), now.row(0, named=True)
        if best["round"] == round_:
            continue
        se = math.hypot(_se(best), _se(value))
        if best["value"] - value["value"] > z * se:
            out.append(Regression(agent_id, metric, round_, value["value"], best["round"], best["value"], se))
    return out


def _se(row: Mapping) -> float:
    given = row.get("se")
    if given is not None:
        if not (math.isfinite(given) and given > 0):
            raise DataError(f"regressions: se must be a finite number > 0, got {given!r} ({row['agent_id']} {row['metric']}, round {row['round']})")
        return float(given)
    return standard_error(float(row["value"]), int(row["n"]))


def round_regressions(evaluation: pl.DataFrame, metrics: Sequence[tuple[str, str, str]], z: float = Z,
                      judged: Collection[tuple[str, str]] | None = None) -> dict[int, str]:
    """round -> its held-out metrics under their best by more than `z` standard errors, one text
    ("verifier_bal_acc 59.5% < 92.9% (round 12, 6.1 se); ..."), for each round of `evaluation`
    from 0 on that has any. `metrics`: a workflow's `table_metrics` (agent_id, metric, column),
    each named by its column; those of `NOT_JUDGED` and those with a value outside [0, 1] are not
    judged, nor those outside `judged` (the workflow's `Workflow.judged()`: its higher-is-better
    pairs) or, without it, those of `NOT_JUDGED_PREFIXES`. The balanced accuracies' errors are their
    classes' (`with_standard_errors`)."""
    if evaluation.is_empty():
        return {}
    rows = with_standard_errors(evaluation)
    fractions = rows.group_by("agent_id", "metric").agg(ok=pl.col("value").drop_nulls().is_between(0.0, 1.0).all())
    ok = {(a, m) for a, m, good in fractions.iter_rows() if good}
    wanted = (lambda a, m: (a, m) in judged) if judged is not None else (lambda _a, m: not m.startswith(NOT_JUDGED_PREFIXES))
    names = {(a, m): column for a, m, column in metrics if m not in NOT_JUDGED and wanted(a, m) and (a, m) in ok}
    out = {}
    for r in sorted(r for r in set(rows["round"].to_list()) if r >= 0):
        found = regressions(rows, metrics=list(names), round_=r, z=z)
        if found:
            out[r] = "; ".join(x.describe(names[(x.agent_id, x.metric)]) for x in found)
    return out
