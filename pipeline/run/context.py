"""What the stages of a round share (`RoundContext`): the store's tables, the run config, the
checkpoint registry, the engines and the team, built once and handed to every stage."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from pipeline.config import DEFAULT_MIX, RunConfig
from pipeline.engines.pool import EnginePool
from pipeline.run.checkpoints import RoundCheckpoints
from pipeline.store import Tables
from pipeline.store.registry import PolicyRegistry
from pipeline.strategies import make_strategy
from pipeline.tasks import build_task
from pipeline.types import Sampler
from pipeline.workflows import check_workflow, load_workflow

__all__ = ["RoundContext", "build_workflow", "run_strategies"]


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
        self.checkpoints = RoundCheckpoints(self.registry, self.tables, config, self._workflow)
        """Which checkpoint each policy of a round trains from, samples with and was trained to."""

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
