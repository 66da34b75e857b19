"""Which checkpoint each policy of a run's round trains from, samples with and was trained to, read
from the policy registry (the starting model registered as round -1 on first use), and how many
rounds the checkpoints a round samples with are older than those it trains: `RoundCheckpoints`.

Round r trains from the latest checkpoint registered before it (with `start_from="best"`, the best
evaluated round's: `best_round`) and, in synchronous rounds, samples with the same ones; with
`max_staleness` K > 0 it samples with the round its overlapped driver recorded when sampling
started (`SAMPLING_PLAN`, recorded by that driver and read here), else round r-1-K's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import polars as pl

from pipeline.config import RunConfig
from pipeline.errors import ConfigError, DataError
from pipeline.store import BASE_ROUND, Tables, atomic_write_text
from pipeline.store.registry import PolicyRegistry

__all__ = ["RoundCheckpoints", "best_round", "SAMPLING_PLAN", "sampling_plan_path", "read_sampling_plan", "write_sampling_plan"]

SAMPLING_PLAN = "sampling.json"
"""`<store>/round=<r>/sampling.json`: the round whose checkpoints round r of an overlapped run
samples with, recorded before its sampling starts, so a resumed run samples it with the same."""


def sampling_plan_path(root: str | Path, round_: int) -> Path:
    """The file recording which checkpoint round `round_` samples with (`SAMPLING_PLAN`)."""
    return Path(root) / f"round={int(round_)}" / SAMPLING_PLAN


def read_sampling_plan(root: str | Path, round_: int) -> int | None:
    """The round whose checkpoints round `round_` samples with, as recorded; None when not
    recorded. A file that is not such a record is a DataError naming it."""
    path = sampling_plan_path(root, round_)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable sampling record ({err}); remove it to choose again") from None
    source = record.get("sampled_with_round") if isinstance(record, dict) else None
    if isinstance(source, bool) or not isinstance(source, int) or not -1 <= source < int(round_):
        raise DataError(f"{path}: sampled_with_round must be a round in [-1, {int(round_) - 1}], got {source!r}; remove it to choose again")
    return source


def write_sampling_plan(root: str | Path, round_: int, source: int, schedule: str, max_staleness: int) -> Path:
    """Record that round `round_` samples with round `source`'s checkpoints (atomically)."""
    path = sampling_plan_path(root, round_)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"round": int(round_), "sampled_with_round": int(source), "staleness_schedule": schedule, "max_staleness": int(max_staleness)}
    atomic_write_text(path, json.dumps(record, sort_keys=True) + "\n")
    return path


def best_round(evaluation: pl.DataFrame, metrics: Iterable[tuple[str, str]]) -> int | None:
    """The round of `evaluation` rows with the highest mean over the (agent_id, metric) pairs of
    `metrics` that it has (the latest round among equals); None without any such row."""
    pairs = pl.DataFrame([{"agent_id": a, "metric": m} for a, m in metrics], schema={"agent_id": pl.String, "metric": pl.String})
    rows = evaluation.join(pairs, on=["agent_id", "metric"], how="inner")
    if rows.is_empty():
        return None
    score = rows.group_by("round").agg(pl.col("value").mean()).sort(["value", "round"], descending=True)
    return int(score["round"][0])


class RoundCheckpoints:
    """The checkpoints of a run's rounds: its `registry`, its `tables` (the evaluations the best
    round is judged by, the sampling records of overlapped rounds), its `config` (`model_dir`,
    `start_from`, `max_staleness`) and its `workflow` (the policies, the judged metrics, the
    embedded model)."""

    def __init__(self, registry: PolicyRegistry, tables: Tables, config: RunConfig, workflow):
        self.registry, self.tables, self.config, self.workflow = registry, tables, config, workflow

    def base_model(self) -> Path:
        """The run's starting checkpoint: `config.model_dir` (a local HF model directory), else
        the model the workflow embeds."""
        if self.config.model_dir:
            path = Path(self.config.model_dir)
            if not (path / "config.json").is_file():
                raise ConfigError(f"model_dir {path} is not a local HF model directory (no config.json)")
            return path
        path = self.workflow.default_model()
        if path is None:
            raise ConfigError(f"workflow {self.config.workflow!r} has no embedded model: give a starting checkpoint with --model-dir")
        return Path(path)

    def start_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the latest checkpoint registered before round `round_` (registering the
        base model as round -1 on first use), or with `start_from="best"` the checkpoint of the
        best evaluated round before it (`best_round`): what round `round_` trains from and, unless
        its driver passes older ones, samples with."""
        best = None
        if self.config.start_from == "best" and round_ > 0:
            done = [self.tables.read(r, "evaluation") for r in range(BASE_ROUND, round_) if self.tables.exists(r, "evaluation")]
            best = best_round(pl.concat(done), self.workflow.judged()) if done else None
        reg = self.registry
        out = {}
        for pid in self.workflow.policy_ids:
            path = reg.latest(pid, round_)
            if path is None:
                reg.base(pid, self.base_model())
                path = reg.latest(pid, round_)
            rec = reg.get(best, pid) if best is not None else None
            out[pid] = path if rec is None else Path(rec.path)
        return out

    def sample_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the checkpoint round `round_` samples with: its start checkpoints in
        synchronous rounds; with `max_staleness` K > 0 those of the round recorded for it when its
        sampling started (`read_sampling_plan`: the overlapped driver records the freshest
        registered, or round r-1-K's with the "exact" schedule), and round r-1-K's where nothing
        is recorded (the starting model's before round K+1). A recorded round's checkpoint that
        is not registered is an error naming it."""
        k = self.config.max_staleness
        if k == 0:
            return self.start_checkpoints(round_)
        recorded = read_sampling_plan(self.tables.root, round_)
        source = max(BASE_ROUND, round_ - 1 - k) if recorded is None else recorded
        if source == BASE_ROUND:
            return self.start_checkpoints(0)
        out = {}
        for pid in self.workflow.policy_ids:
            rec = self.registry.get(source, pid)
            if rec is None:
                raise DataError(
                    f"round {round_} samples with round {source}'s checkpoint of policy {pid!r} (--max-staleness {k}), "
                    "which is not registered yet"
                )
            out[pid] = Path(rec.path)
        return out

    def trained_rounds(self, round_: int) -> dict[str, int]:
        """policy_id -> the round of the checkpoint round `round_` trains from: round r-1's with
        `max_staleness` > 0 (registered by the time round r trains, maybe not yet when its rows
        are made), else the round of its start checkpoint (`start_checkpoints`: the latest before
        it, or with `start_from="best"` the best evaluated round's)."""
        if self.config.max_staleness:
            return {pid: max(BASE_ROUND, round_ - 1) for pid in self.workflow.policy_ids}
        out = {}
        for pid, path in self.start_checkpoints(round_).items():
            trained = self.registry.round_of(pid, path)
            out[pid] = BASE_ROUND if trained is None else trained
        return out

    def staleness_plan(self, round_: int, checkpoints: Mapping[str, Path]) -> tuple[dict[str, int], dict[str, int]]:
        """(policy_id -> the round of the checkpoint in `checkpoints` that samples it, policy_id ->
        how many rounds it is older than the checkpoint round `round_` trains, `trained_rounds`):
        the `policy_round` and `staleness` of the round's rows. A checkpoint the registry does
        not hold has neither."""
        sampled, staleness = {}, {}
        trained = self.trained_rounds(round_)
        for pid, path in checkpoints.items():
            policy_round = self.registry.round_of(pid, path)
            if policy_round is None:
                continue
            sampled[pid] = policy_round
            staleness[pid] = max(0, trained.get(pid, policy_round) - policy_round)
        return sampled, staleness

    def trained_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the checkpoint trained in `round_` (-1: the base model)."""
        if round_ == BASE_ROUND:
            return self.start_checkpoints(0)
        out = {}
        for pid in self.workflow.policy_ids:
            rec = self.registry.get(round_, pid)
            if rec is None:
                raise DataError(f"round {round_} has no registered checkpoint for policy {pid!r}; materialize its policy first")
            out[pid] = Path(rec.path)
        return out
