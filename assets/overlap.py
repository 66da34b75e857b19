"""Rounds that overlap (`--max-staleness K` > 0): round r's rollouts sample while round r-1 trains.

Two lanes share the store's Dagster instance, each materializing stages of one round partition
at a time:
- the sampler lane (the run's own thread, which holds the engines): round r's problems,
  rollouts, advantages and training view, sampled with round r-1-K's checkpoints
  (`RoundContext.sample_checkpoints`), and each round's evaluation once its policy is registered;
- the trainer lane (one thread, so one trainer per policy at a time): round r's policy, trained in
  a process of its own (`pipeline.run.rounds.stage_policy`) from round r-1's checkpoint, once
  round r's view is written and round r-1's policy registered.

The sampler lane starts round r's sampling as soon as round r-1-K's checkpoint is registered, and
never with a newer one: a round's rows depend on K alone, not on how fast either lane ran, so an
overlapped run is reproducible and its staleness is K from round K on (`steps.staleness`). A
round is complete once its evaluation table exists, as in synchronous runs: a run killed at any
point resumes at the first incomplete round, whose tables and those of every later round are
made again from scratch (`prepare_resume`).
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Callable, Sequence

from pipeline.store import Tables

__all__ = ["SAMPLE_STAGES", "TRAIN_STAGES", "EVALUATE_STAGES", "run_overlapped", "prepare_resume"]

SAMPLE_STAGES = ("problems", "rollouts", "advantages", "training_view")
TRAIN_STAGES = ("policy",)
EVALUATE_STAGES = ("evaluation",)


def prepare_resume(tables: Tables, rounds: Sequence[int], restart: bool) -> None:
    """Before rounds `rounds` run again: the temporary files of a killed write removed and, with
    `restart`, their evaluation tables removed first, so a run stopped part-way leaves no round
    looking complete beside its new tables. (Every other table of a round is replaced when the
    round writes it again.)"""
    for r in rounds:
        tables.remove_temporary(r)
        if restart:
            tables.remove(r, "evaluation")


def run_overlapped(first: int, n_rounds: int, k: int, run: Callable[[int, tuple[str, ...]], None], finished: Callable[[int], None]) -> None:
    """Rounds `first`..`n_rounds`-1 with sampling up to `k` rounds ahead of training.

    `run(r, stages)` materializes `stages` of round r (raising on failure); the trainer lane calls
    it from its own thread. `finished(r)` is called in this thread once round r is evaluated.
    Order of work in this thread: start the next training as soon as its inputs are in; evaluate
    a trained round; sample the next round once the checkpoint it samples with is registered;
    otherwise wait for the trainer. A failure in either lane stops the run after the trainer's
    current round ends (its checkpoint is registered, its round stays incomplete)."""
    sampled = trained = evaluated = first - 1
    training: cf.Future | None = None
    with cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="maxit-trainer") as trainer:
        while evaluated < n_rounds - 1:
            if training is not None and training.done():
                training.result()  # the trainer lane's failure, raised here
                training, trained = None, trained + 1
            if training is None and trained + 1 < n_rounds and sampled > trained:
                training = trainer.submit(run, trained + 1, TRAIN_STAGES)
                continue
            if evaluated < trained:
                run(evaluated + 1, EVALUATE_STAGES)
                evaluated += 1
                finished(evaluated)
                continue
            if sampled + 1 < n_rounds and sampled - k <= trained:  # round sampled+1 samples with round sampled-k's checkpoint
                run(sampled + 1, SAMPLE_STAGES)
                sampled += 1
                continue
            if training is None:  # cannot happen: some lane always has work until the last evaluation
                raise RuntimeError(f"overlapped rounds stalled at sampled {sampled}, trained {trained}, evaluated {evaluated}")
            cf.wait([training])
