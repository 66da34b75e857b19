"""What the stages of a round share (`RoundContext`): the store's tables, the run config, the
checkpoint registry, the engines and the team, built once and handed to every stage."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import polars as pl

from pipeline.config import DEFAULT_MIX, RunConfig
from pipeline.engines.pool import EnginePool
from pipeline.errors import ConfigError, DataError
from pipeline.learn.staleness import read_sampling_plan
from pipeline.store import BASE_ROUND, Tables
from pipeline.store.registry import PolicyRegistry
from pipeline.strategies import make_strategy
from pipeline.tasks import build_task
from pipeline.types import Sampler
from pipeline.workflows import check_workflow, load_workflow

__all__ = ["RoundContext", "build_workflow", "run_strategies", "best_round", "DEFAULT_MIX"]


def build_workflow(config: RunConfig):
    """The workflow of a run config: its name and options, its agents on one shared policy or
    each on its own; the math workflows get the config's task and loop count."""
    settings = dict(config.workflow_options)
    if config.workflow in ("math", "single"):
        settings.setdefault("task", build_task(config.task, config.task_file, config.prompt_file))
    else:
        settings.setdefault("task_file", config.task_file)
    settings.setdefault("max_loop_num", config.max_loop_num)
    return load_workflow(config.workflow, shared_policy=config.shared_policy, **settings)


def best_round(evaluation: pl.DataFrame, metrics: Iterable[tuple[str, str]]) -> int | None:
    """The round of `evaluation` rows with the highest mean over the (agent_id, metric) pairs of
    `metrics` that it has (the latest round among equals); None without any such row."""
    pairs = pl.DataFrame([{"agent_id": a, "metric": m} for a, m in metrics], schema={"agent_id": pl.String, "metric": pl.String})
    rows = evaluation.join(pairs, on=["agent_id", "metric"], how="inner")
    if rows.is_empty():
        return None
    score = rows.group_by("round").agg(pl.col("value").mean()).sort(["value", "round"], descending=True)
    return int(score["round"][0])


def run_strategies(config: RunConfig, workflow) -> dict:
    """strategy id -> the strategy a run samples and trains with: the config's strategies and
    options, the feedback strategy aimed at the workflow's `feedback_agent`. With the default mix,
    a workflow without feedback (or without a tree: `supports_tree`) runs the other strategies; an
    explicit feedback or tree strategy on it is refused (`check_workflow`, naming the workflow)."""
    options = dict(config.strategy_options)
    chosen = config.strategies
    if chosen == DEFAULT_MIX:
        # the default mix drops what a workflow cannot play (no verdict for feedback, no state to
        # copy for the tree, as a program has neither); a mix the user chose is checked, and
        # refused by name, below
        chosen = tuple(s for s in chosen if not (s == "feedback" and not workflow.supports_feedback)
                       and not (s == "tree" and not getattr(workflow, "supports_tree", True)))
    if "feedback" in chosen:
        options["feedback"] = {**options.get("feedback", {}), "agent_id": workflow.feedback_agent}
    out = {s: make_strategy(s, group_size=config.samples, **options.get(s, {})) for s in chosen}
    check_workflow(workflow, list(out.values()))
    return out


class RoundContext:
    """What the stages of a run share: the store's tables (`store` a folder, a URL, or `Tables`),
    the run config, the registry, the engines (a pool of the config's engine when none is given,
    built on first use), and the team the config names: its workflow (with its task) and the
    strategies it samples with, built when the context opens, so a config that names a workflow
    or a strategy mix that cannot run is refused before any stage starts."""

    def __init__(self, store: str | Path | Tables, config: RunConfig, engines: EnginePool | None = None, registry: PolicyRegistry | None = None):
        self.tables = store if isinstance(store, Tables) else Tables(store)
        self.store: Path = self.tables.root
        """The folder the stages write in: the store, or a URL store's working copy."""
        self.config = config
        self._engines = engines
        self.registry = registry if registry is not None else PolicyRegistry(self.tables.location)
        """Where round r finds round r-1's checkpoints (default: the store's own registry)."""
        self._workflow = build_workflow(config)
        self._strategies = run_strategies(config, self._workflow)

    def __repr__(self) -> str:
        return f"RoundContext({self.tables!r}, workflow={self.config.workflow!r})"

    @property
    def engines(self) -> EnginePool:
        if self._engines is None:
            self._engines = EnginePool(self.config.engine, self.config.engine_options)
        return self._engines

    @engines.setter
    def engines(self, pool: EnginePool | None) -> None:
        self._engines = pool

    # -- the team ---------------------------------------------------------------------------
    def task(self):
        """The task of the math workflows (arithmetic, or the task file), or None for a workflow
        that draws its own problems."""
        return getattr(self.workflow(), "task", None)

    def workflow(self):
        """The run's workflow (`build_workflow`), built when the context opened."""
        return self._workflow

    def agents(self):
        return self.workflow().agents

    @property
    def policy_ids(self) -> tuple[str, ...]:
        return self.workflow().policy_ids

    def strategy_objects(self) -> dict:
        """strategy id -> strategy (`run_strategies`), made when the context opened."""
        return self._strategies

    # -- checkpoints ------------------------------------------------------------------------
    def base_model(self) -> Path:
        if self.config.model_dir:
            path = Path(self.config.model_dir)
            if not (path / "config.json").is_file():
                raise ConfigError(f"model_dir {path} is not a local HF model directory (no config.json)")
            return path
        path = self.workflow().default_model()
        if path is None:
            raise ConfigError(f"workflow {self.config.workflow!r} has no embedded model: give a starting checkpoint with --model-dir")
        return Path(path)

    def start_checkpoints(self, round_: int) -> dict[str, Path]:
        """policy_id -> the latest checkpoint registered before round `round_` (registering the
        base model as round -1 on first use), or with `start_from="best"` the checkpoint of the
        best evaluated round before it (`best_round`): what round `round_` trains from and, unless
        its driver passes older ones, samples with."""
        reg = self.registry
        out = {}
        for pid in self.policy_ids:
            path = reg.latest(pid, round_)
            if path is None:
                reg.base(pid, self.base_model())
                path = reg.latest(pid, round_)
            out[pid] = path
        if self.config.start_from == "best" and round_ > 0:
            done = [self.tables.read(r, "evaluation") for r in range(BASE_ROUND, round_) if self.tables.exists(r, "evaluation")]
            best = best_round(pl.concat(done), self.workflow().judged()) if done else None
            for pid in out if best is not None else ():
                rec = reg.get(best, pid)
                if rec is not None:
                    out[pid] = Path(rec.path)
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
        for pid in self.policy_ids:
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
            return {pid: max(BASE_ROUND, round_ - 1) for pid in self.policy_ids}
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
        for pid in self.policy_ids:
            rec = self.registry.get(round_, pid)
            if rec is None:
                raise DataError(f"round {round_} has no registered checkpoint for policy {pid!r}; materialize its policy first")
            out[pid] = Path(rec.path)
        return out

    def samplers(self, checkpoints: Mapping[str, Path]) -> dict[str, Sampler]:
        """policy_id -> its engine, pointed at its checkpoint. A run that trains LoRA adapters
        asks for engines that serve them (one engine on the base for every policy's adapter)."""
        lora = getattr(self.config.train, "lora", None)
        options = {"lora_rank": int(lora.r)} if lora is not None else {}
        return {pid: self.engines.get(pid, path, **options) for pid, path in checkpoints.items()}

    def round_seed(self, round_: int, salt: int = 0) -> int:
        return (self.config.seed * 1_000_003 + (round_ + 2) * 7919 + salt) % (2**31 - 1)

    def substage_seconds(self) -> dict[str, float]:
        """The running totals behind the timings' substages: the seconds the workflow waited on its
        sandbox, and the engine pool's starts and swaps."""
        engines = self._engines
        return {
            "sandbox": float(getattr(self._workflow, "sandbox_seconds", 0.0) or 0.0),
            "engine_start": float(getattr(engines, "start_seconds", 0.0) or 0.0),
            "engine_swap": float(getattr(engines, "swap_seconds", 0.0) or 0.0),
        }
