"""The problems stage's middle: a round's training problems drawn from the workflow's train split,
with the earlier rounds' hardest drawn again (`replay_candidates`), as the `problems` table."""

from __future__ import annotations

from typing import Sequence

import polars as pl

from pipeline.errors import ConfigError
from pipeline.types import Problem
from schemas import PROBLEMS, polars_schema

__all__ = ["problems_table", "problems_from_table", "draw_problems", "REPLAY_STEP_COLUMNS", "replay_candidates"]


def problems_table(problems: Sequence[Problem], round_: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "round": [round_] * len(problems),
            "uid": [p.uid for p in problems],
            "question": [p.question for p in problems],
            "answer": [p.answer for p in problems],
            "split": [p.split for p in problems],
            "hint": [p.hint for p in problems],
        },
        schema=polars_schema(PROBLEMS),
    )


def problems_from_table(df: pl.DataFrame) -> list[Problem]:
    return [Problem(uid=r["uid"], question=r["question"], answer=r["answer"], split=r["split"], hint=r["hint"]) for r in df.iter_rows(named=True)]


def draw_problems(workflow, n: int, seed: int, round_: int, replay: pl.DataFrame | None = None) -> pl.DataFrame:
    """Round r's training problems: `n` of the workflow's train split, drawn with `seed`; with
    `replay` (`replay_candidates`' rows, at most `n` of them used), those first and fresh problems
    after them, none twice."""
    if replay is None or replay.is_empty():
        return problems_table(workflow.problems("train", n, seed), round_)
    again = problems_from_table(replay.head(n))
    taken = {p.uid for p in again}
    try:
        drawn = workflow.problems("train", n + len(again), seed)
    except ConfigError:
        # a finite train split (a game's positions) may hold n problems but not n + the replayed;
        # n distinct fresh ones still leave n - len(again) that are not replayed. The n + len(again)
        # draw stays first so that a split large enough draws what it always drew.
        drawn = workflow.problems("train", n, seed)
    fresh = [p for p in drawn if p.uid not in taken]
    return problems_table(again + fresh[: n - len(again)], round_)


REPLAY_STEP_COLUMNS = ("round", "uid", "step", "strategy", "active", "local_reward")
"""The `steps` columns `replay_candidates` reads."""


def replay_candidates(problems: pl.DataFrame, steps: pl.DataFrame, n: int) -> pl.DataFrame:
    """Up to `n` earlier training problems worth drawing again: those whose first attempts
    (schedule step 0, of every strategy but the hinted `prompt_aug`) were not all right in the
    latest round that drew them, the lowest success first, then the newest round, then by uid.
    `problems`: earlier rounds' `problems` rows; `steps`: their `steps` rows (at least
    `REPLAY_STEP_COLUMNS`). Returns `problems` rows (the latest round's copy of each)."""
    first = steps.filter((pl.col("step") == 0) & (pl.col("strategy") != "prompt_aug") & pl.col("active") & pl.col("local_reward").is_not_null())
    success = first.group_by("round", "uid").agg(success=pl.col("local_reward").mean())
    latest = success.sort("round").group_by("uid").last()
    hard = latest.filter(pl.col("success") < 1).sort(["success", "round", "uid"], descending=[False, True, False]).head(n)
    rows = problems.sort("round").group_by("uid").last()
    return hard.select("uid").join(rows, on="uid", how="inner", maintain_order="left").select(problems.columns)
