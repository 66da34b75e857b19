"""Rounds that overlap (`--max-staleness K` > 0): round r's rollouts sample while round r-1 trains.

Two lanes share the store's Dagster instance, each materializing stages of one round partition
at a time:
- the sampler lane (the run's own thread, which holds the engines): round r's problems,
  rollouts, advantages and training view, sampled with the checkpoints this driver chose for it
  (`RoundCheckpoints.sample_checkpoints`), and each round's evaluation once its policy is registered;
- the trainer lane (one thread, so one trainer per policy at a time): round r's policy, trained in
  a process of its own (`pipeline.run.rounds.stage_policy`) from round r-1's checkpoint, once
  round r's view is written and round r-1's policy registered.

The sampler lane starts round r's sampling as soon as round r-1-K's checkpoint is registered.
Which checkpoint it samples with is the schedule's (`SCHEDULES`): "bound" (the default) takes the
freshest registered then, so the staleness is at most K and lower whenever the trainer keeps up,
as the bounded-staleness trainers do (prime-rl's `async_level`, SkyRL's `max_staleness_steps`,
AReaL's `max_head_offpolicyness`); "exact" takes round r-1-K's whatever is registered since, so
a round's rows depend on K alone, not on how fast either lane ran, and the staleness is K from
round K on (`steps.staleness`). The choice is recorded before the round samples
(`pipeline.run.checkpoints.write_sampling_plan`), and a resumed run samples a round that has a
record with the recorded checkpoint, waiting for it to be trained again if need be. A round is
complete once its evaluation table exists, as in synchronous runs: a run killed at any point
resumes at the first incomplete round, whose tables and those of every later round are made
again from scratch (`prepare_resume`).
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import Callable, Protocol, Sequence

from pipeline.config import RunConfig
from pipeline.config.fields import check_field, literal
from pipeline.errors import DataError
from pipeline.run.checkpoints import SAMPLING_PLAN, read_sampling_plan, sampling_plan_path, write_sampling_plan
from pipeline.store import BASE_ROUND, Tables

__all__ = ["SAMPLE_STAGES", "TRAIN_STAGES", "EVALUATE_STAGES", "SCHEDULES", "SamplingPlan", "StorePlan", "run_overlapped", "prepare_resume"]

SCHEDULES = literal(RunConfig, "staleness_schedule")
"""`--staleness-schedule`: which checkpoint an overlapped round samples with (module docstring);
its values are the field's declaration."""

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
        if restart:  # every choice made again
            tables.remove(r, "evaluation")
            StorePlan(tables, "bound", 0).forget(r)


class SamplingPlan(Protocol):
    """Where the overlapped driver records which round's checkpoints each round samples with."""

    def recorded(self, round_: int) -> int | None: ...

    def record(self, round_: int, source: int) -> None: ...


class StorePlan:
    """The sampling records of a store (`round=<r>/sampling.json`; uploaded at once on a URL
    store, so a run resumed on another machine repeats them too)."""

    def __init__(self, tables: Tables, schedule: str, k: int):
        self.tables, self.schedule, self.k = tables, schedule, int(k)

    def recorded(self, round_: int) -> int | None:
        source = read_sampling_plan(self.tables.root, round_)
        oldest = max(BASE_ROUND, int(round_) - 1 - self.k)
        if source is not None and source < oldest:
            # a record made under a larger K: repeating it would sample staler than this run allows
            path = sampling_plan_path(self.tables.root, round_)
            raise DataError(f"{path}: round {round_} was recorded to sample with round {source}'s checkpoint, older than "
                            f"--max-staleness {self.k} allows (round {oldest} or newer); resume with --max-staleness "
                            f"{int(round_) - 1 - source} or more, or remove the file to choose again")
        return source

    def record(self, round_: int, source: int) -> None:
        write_sampling_plan(self.tables.root, round_, source, self.schedule, self.k)
        self.tables.publish(files=(f"round={int(round_)}/{SAMPLING_PLAN}",))

    def forget(self, round_: int) -> None:
        if self.tables.url is not None:
            self.tables.url.remove(f"round={int(round_)}/{SAMPLING_PLAN}")
        sampling_plan_path(self.tables.root, round_).unlink(missing_ok=True)


def run_overlapped(
    first: int, n_rounds: int, k: int, run: Callable[[int, tuple[str, ...]], None], finished: Callable[[int], None],
    schedule: str = "bound", plan: SamplingPlan | None = None,
) -> None:
    """Rounds `first`..`n_rounds`-1 with sampling up to `k` rounds ahead of training.

    `run(r, stages)` materializes `stages` of round r (raising on failure); the trainer lane calls
    it from its own thread. `finished(r)` is called in this thread once round r is evaluated.
    Order of work in this thread: start the next training as soon as its inputs are in; evaluate
    a trained round; sample the next round once the checkpoint it samples with is registered
    (round r-1-k's, or the one `plan` recorded for it), choosing it by `schedule` and recording
    it in `plan` first; otherwise wait for the trainer. Rounds before `first` count as trained.
    A failure in either lane stops the run after the trainer's current round ends (its checkpoint
    is registered, its round stays incomplete)."""
    check_field(RunConfig, "staleness_schedule", schedule)
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
            if sampled + 1 < n_rounds:
                nxt = sampled + 1
                recorded = plan.recorded(nxt) if plan is not None else None
                oldest = max(BASE_ROUND, nxt - 1 - k)  # the stalest checkpoint round nxt may sample with
                if (oldest if recorded is None else recorded) <= trained:
                    if recorded is None:  # the freshest trained (never newer than nxt-1), or exactly the stalest allowed
                        source = trained if schedule == "bound" else oldest
                        if plan is not None:
                            plan.record(nxt, source)
                    run(nxt, SAMPLE_STAGES)
                    sampled = nxt
                    continue
            if training is None:  # cannot happen: some lane always has work until the last evaluation
                raise RuntimeError(f"overlapped rounds stalled at sampled {sampled}, trained {trained}, evaluated {evaluated}")
            cf.wait([training])
