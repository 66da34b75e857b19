"""`RunConfig`: the whole of an expert-iteration run, one tree nested by stage
(`pipeline.config.stages`' `AdvantageConfig`, `ViewConfig`, `EvalConfig`; `pipeline.config.train`'s
`TrainConfig`; `pipeline.config.scale`'s `ScaleConfig`, `TrackingConfig`), and the algorithm it
follows (`pipeline.config.presets`).

Its defaults are the default run's (`maxit run` with no flags: the maxit algorithm, the "rs"
loss). Each field a user sets declares its setting (flag, help, group) in its metadata
(`pipeline.config.fields`); the CLI flags and the Dagster launchpad (`pipeline.run.settings.Settings`)
are made from those declarations and come back here through `RunConfig.for_algorithm`; the
stages' modules re-export their configs (`pipeline.learn.views.ViewConfig`,
`pipeline.rollout.evaluation.EvalConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pipeline.config import flat
from pipeline.config.fields import Setting, check_count, check_declared, literal, setting, settings
from pipeline.config.presets import ALGORITHMS
from pipeline.config.scale import ScaleConfig, TrackingConfig
from pipeline.config.stages import AdvantageConfig, EvalConfig, FrozenMapping, ViewConfig, relabel_needs_rs
from pipeline.config.train import TrainConfig
from pipeline.errors import ConfigError
from pipeline.strategies import STRATEGY_IDS, Feedback, make_strategy

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """Everything one expert-iteration run needs, nested by stage, and the algorithm it follows.

    `RunConfig(algorithm="atgrpo", samples=8)` is AT-GRPO's run: the fields that depend on the
    algorithm (`strategies`, `strategy_options`, `advantage`, `view`, `train`) are its preset's
    where left unset (None), for the loss of `train` where that is given. To change one setting
    inside a stage's config (a reward weight, the learning rate, a clip), name it as `maxit run`'s
    flag does: `RunConfig.for_algorithm("atgrpo", samples=8, alpha=0.5, lr=1e-4)`. `RunConfig()`
    is the default run (the maxit algorithm), equal to `Settings().run_config()`. A combination
    of fields that would train the wrong rows or fail mid-round is refused here, naming them."""

    # --- Parameters that control the algorithm ------------------------------------------------
    algorithm: str = field(default="maxit", metadata=setting(
        "algorithm",
        "the algorithm the run follows: maxit (the measured best), drmas, atgrpo, exit (the expert-iteration plan) or grpo; "
        "it presets the loss, strategies, groups, reward mix and weights (docs/ALGORITHMS.md#presets); settings given explicitly override it",
        group="team and task", choices=ALGORITHMS))
    """The algorithm whose preset (`pipeline.config.presets.ALGORITHM_PRESETS`) fills the fields
    left unset: "maxit" (the measured best), "drmas", "atgrpo", "exit" (the expert-iteration
    plan) or "grpo" (docs/ALGORITHMS.md#presets). Only unset fields follow it: a field given, or
    kept by `dataclasses.replace(config, algorithm=...)`, stays as it is."""

    # --- Parameters that control the team and the task ----------------------------------------
    workflow: str = field(default="math", metadata=setting(
        "workflow",
        "the team and its environment (pipeline.workflows): math (Solver + Verifier), math_review (a Verifier shown the "
        "Solver's answer), single (the Solver alone), grid (a planner and a mover in a maze), plan_path (a tool agent's "
        "path run by the environment, a plan agent that commits), code (a Coder and a Tester, sandboxed), reasoning_gym "
        "(a reasoning-gym dataset), tic_tac_toe and bargaining (OpenSpiel games in self-play), program:FILE.py:FUNC (a "
        "program of OpenAI API calls), a module:Name or file.py:Name path, or a maxit.workflows entry point",
        group="team and task", metavar="WORKFLOW"))
    """The team and its environment (`pipeline.workflows.load_workflow`): a built-in name
    (`pipeline.workflows.WORKFLOW_NAMES`: "math", "math_review", "single", "grid", "plan_path",
    ...), "program:FILE.py:FUNC", "module:Name" or a `maxit.workflows` entry point."""
    workflow_options: Mapping[str, object] = field(default_factory=dict, metadata=setting(
        "workflow_options", "KEY=VALUE options given to the workflow's constructor (numbers and true/false are parsed)",
        group="team and task", hint=tuple[str, ...], default=(), metavar="KEY=VALUE"))
    """Keyword options of the workflow's constructor (those it takes)."""
    task: str = field(default="arithmetic", metadata=setting("task", "task name (pipeline.tasks); ignored with task_file", group="team and task"))
    """Task name (`pipeline.tasks.make_task`), used when `task_file` is None."""
    task_file: str | None = field(default=None, metadata=setting(
        "task_file", "local JSONL/Parquet problems file (question/answer columns) instead of the task", group="team and task"))
    """A local JSONL/Parquet file of problems (`pipeline.tasks.load_task_file`) instead of `task`."""
    prompt_file: str | None = field(default=None, metadata=setting(
        "prompt_file",
        "TOML/JSON file of prompt settings (user, system, answer_format, verifier_user, verdict...) over the task's own prompts; None = the task's",
        group="team and task", metavar="FILE"))
    """A TOML/JSON prompt file over the task's own prompts (`pipeline.tasks.prompts`), or None."""
    model_dir: str | None = field(default=None, metadata=setting(
        "model_dir", "starting checkpoint, a local HF model folder; None = the embedded tiny model", group="team and task"))
    """Starting checkpoint of every policy (a local HF model directory with a chat template);
    None = the embedded default model (built and warm-started on first use)."""
    shared_policy: bool = field(default=True, metadata=setting(
        "shared_policy", "the workflow's agents share one policy (False: each has its own)", group="team and task",
        negative_flag=("--separate-policies", "each agent of the workflow gets its own policy (default: one shared policy)")))
    """The shared policy's id is "shared"; a policy of its own is named after its agent."""

    # --- Parameters that control sampling ------------------------------------------------------
    engine: Literal["auto", "vllm", "hf"] = field(default="auto", metadata=setting(
        "engine", "rollout engine: vllm, hf, or auto (vLLM when importable)", group="team and task"))
    problems: int = field(default=128, metadata=setting(
        "problems",
        "training problems drawn per round (a workflow may run with its own when the flag is left out: tic_tac_toe 256; maxit run says so)",
        group="sampling"))
    """Training problems drawn per round."""
    samples: int = field(default=4, metadata=setting(
        "samples",
        "group size of every strategy (tree: candidates per node; a workflow may run with its own when the flag is left out: tic_tac_toe 8)",
        group="sampling"))
    """Group size of every strategy (tree: candidates per node)."""
    strategies: tuple[str, ...] | None = field(default=None, metadata=setting(
        "strategies", "search strategies interleaved in each round", group="sampling", metavar="STRATEGY"))
    """Search strategies interleaved in each round (pipeline.strategies); None = the algorithm's
    (maxit: `DEFAULT_MIX`)."""
    strategy_options: Mapping[str, Mapping] | None = field(default=None, metadata=settings(
        Setting("feedback_train_context",
                "training context of the feedback strategy's second attempt: the problem only, or problem + first attempt",
                group="sampling", hint=str, choices=literal(Feedback, "train_context"), key="feedback.train_context"),
        Setting("feedback_first_attempt",
                "the feedback strategy's first attempt: trained as an iid row, or not trained (the plan's weight 0)",
                group="sampling", hint=str, choices=literal(Feedback, "first_attempt"), key="feedback.first_attempt"),
    ))
    """Options of each strategy by id (e.g. {"feedback": {"first_attempt": "skip"}}); None = the
    algorithm's (the feedback strategy's own for maxit, spelled out as the settings pass them)."""
    temperature: float = field(default=1.0, metadata=setting(
        "temperature", "sampling temperature (training computes p_train at the same temperature)", group="sampling", also=("train.temperature",)))
    """Sampling temperature of rollouts (and of training: p_train is taken at the same temperature)."""
    max_tokens: int | None = field(default=None, metadata=setting(
        "max_tokens", "completion budget of each agent call in rollouts; None = the task's default (arithmetic 16, task file 512)", group="sampling"))
    """Completion budget of each agent call; None = the task's (`pipeline.tasks.budget_of`)."""
    max_loop_num: int | None = field(default=None, metadata=setting(
        "max_loop_num",
        "turns at most per episode (math: Solver/Verifier loops per sample, DrMAS's max_loop_num); None = the workflow's (math 2)", group="sampling"))
    """Turns at most per episode (math: DrMAS's `max_loop_num`); None = the workflow's own."""
    seed: int = field(default=0, metadata=setting(
        "seed", "seed of the problem draws and of sampling (each round derives its own)", group="sampling"))
    problem_replay: float = field(default=0.25, metadata=setting(
        "problem_replay",
        "share of each round's training problems drawn again from earlier rounds' problems whose unhinted first attempts failed most "
        "(the lowest success first); 0 = every problem fresh", group="sampling"))
    """Share of each round's training problems drawn again from earlier rounds' problems that the
    first agent's unhinted first attempts got wrong most often (`pipeline.run.problems.replay_candidates`):
    difficulty that follows the team, as the fresh draw gets easier for it. 0 = every problem
    fresh. 0.25, the default, was chosen over twenty rounds of the main job on three seeds
    (docs/results/long-runs.md)."""
    start_from: Literal["last", "best"] = field(default="last", metadata=setting(
        "start_from",
        "the checkpoint each round starts from: the last round's, or the best evaluated round's (the mean of the workflow's higher-is-better table metrics; "
        "selecting on the held-out split makes its later figures optimistic)", group="sampling"))
    """Which checkpoint round r samples with and trains from: "last", the latest round's; "best",
    the round's (the starting model included) whose held-out evaluation scored highest on the mean
    of the workflow's judged metrics (`Workflow.judged()`: its higher-is-better table metrics;
    `pipeline.run.checkpoints.best_round`), so that a round that made
    things worse is not built on. Selecting on the held-out split makes its later figures optimistic."""

    max_staleness: int = field(default=0, metadata=setting(
        "max_staleness",
        "rounds the rollouts may run ahead of training: round r samples while round r-1 trains, with a checkpoint at most K rounds "
        "older than round r-1's (--staleness-schedule); 0 = synchronous rounds", group="sampling"))
    """How many rounds a round's rollouts may run ahead of training (K): round r's rollouts
    overlap round r-1's training (`assets.overlapped_run`) and sample with a checkpoint at most K rounds
    older than the one its rows train (round r-1's), as `staleness_schedule` picks it; the rows'
    staleness is corrected by the loss's ratio p_train/q (and `train.loss.correction`). 0 =
    synchronous rounds: round r samples with the checkpoint it trains from."""
    staleness_schedule: Literal["bound", "exact"] = field(default="bound", metadata=setting(
        "staleness_schedule",
        "with --max-staleness K: bound, the freshest checkpoint registered when the round's sampling starts (at most K rounds old); "
        "exact, round r-1-K's always (rows that do not depend on the lanes' speed). The choice is recorded per round; a resume repeats it",
        group="sampling"))
    """With `max_staleness` K > 0, the checkpoint round r samples with: "bound", the freshest
    registered when its sampling starts (never older than round r-1-K's: the sampler waits for
    that one), so a trainer that keeps up gives fresher rows; "exact", round r-1-K's whatever is
    registered since, so the rows depend on K alone, not on how fast either lane ran (for
    reproducibility studies). Either way the choice is recorded per round and a resumed run
    repeats it (`assets.overlap`)."""
    max_row_staleness: int | None = field(default=None, metadata=setting(
        "max_row_staleness",
        "version threshold: trained rows sampled more than this many rounds before the checkpoint they train are weighted by "
        "--stale-row-weight (replayed rows too); None = no threshold", group="training"))
    """Version threshold: a trained row sampled more than this many rounds before the checkpoint it
    trains has its sample weight multiplied by `stale_row_weight` (0 drops it); it acts on every row
    the view trains, the replayed rows of earlier rounds included. None = no threshold."""
    stale_row_weight: float = field(default=0.0, metadata=setting(
        "stale_row_weight", "weight factor of the rows over --max-row-staleness (0 = dropped)", group="training"))
    """The weight factor of rows over `max_row_staleness` (0: dropped; in (0, 1]: down-weighted)."""

    # --- Parameters that control learning ------------------------------------------------------
    advantage: AdvantageConfig | None = None
    """Rewards (alpha, local weight), grouping and normalization of advantages; None = the
    algorithm's (maxit: `AdvantageConfig()`)."""
    view: ViewConfig | None = None
    """Which rows are trained, with what weights (`pipeline.learn.views.build_training_view`);
    None = the algorithm's view of the loss of `train` (maxit: `ViewConfig.for_loss(LossConfig())`)."""
    train: TrainConfig | None = None
    """Loss, learning rate, epochs (`pipeline.learn.trainer.train_policy`); None = the
    algorithm's at `temperature` (maxit: `TrainConfig()`)."""
    train_on: Literal["rollouts", "ground_truth"] = field(default="rollouts", metadata=setting(
        "train_on", "rollouts (expert iteration) or ground_truth (the step-matched SFT baseline)", group="training"))
    """"rollouts" (expert iteration) or "ground_truth": the step-matched SFT baseline, which
    trains on the Solver's reference answers, as many rows as the rollouts' view has that round
    (same minibatches, same optimizer steps), with the "rs" (NLL) loss."""
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation after every round (and of the starting checkpoint, as round -1)."""

    # --- Parameters that control where the run runs and reports (never its rows) --------------
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """Rollout shards, the vLLM engines' parallelism, trainer processes."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """The experiment trackers each finished round is logged to."""

    @classmethod
    def for_algorithm(cls, algorithm: str = "maxit", **settings: Any) -> "RunConfig":
        """The run of `algorithm` with `settings` over its preset, each named as `maxit run`'s flag
        (`alpha`, `lr`, `clip_high`, `eval_problems`: each declared on the field it sets,
        `pipeline.config.flat.setting_paths`); a setting left out is the algorithm's, then the
        loss's, then its config's default. `RunConfig.for_algorithm("drmas", samples=8)` is DrMAS with its own K."""
        return cls(**flat.run_fields(cls, algorithm, settings))

    @property
    def engine_options(self) -> dict[str, Any]:
        """The options the run's engines are built with (`pipeline.engines.EngineConfig`'s), those
        not at the engines' own default: vLLM's parallel sizes above 1 (the transformers engine
        ignores them) and `train.dtype` unless "auto" (the engines then decide per model, as
        training does). The one road by which the run's settings reach its engines."""
        options = {"tensor_parallel_size": self.scale.tensor_parallel_size, "data_parallel_size": self.scale.data_parallel_size}
        options = {k: v for k, v in options.items() if v != 1}
        if self.train.dtype != "auto":
            options["dtype"] = self.train.dtype
        return options

    def __post_init__(self) -> None:
        check_declared(self)  # the declared choices (the algorithm's before its preset is read) and sequences
        self._fill_from_preset()
        self._check_fields()
        self._check_across_stages()

    def _fill_from_preset(self) -> None:
        """The fields left None, from the algorithm's preset (for the loss of `train` where given)."""
        parts = ("strategies", "strategy_options", "advantage", "train", "view")
        if all(getattr(self, name) is not None for name in parts):
            return
        given: dict[str, Any] = {"temperature": self.temperature}
        if isinstance(self.train, TrainConfig):
            given["loss"] = self.train.loss.kind
        values = flat.resolve(type(self), self.algorithm, given)
        fill = {
            "strategies": lambda: values["strategies"],
            "strategy_options": lambda: flat.strategy_options(type(self), values),
            "advantage": lambda: flat.advantage_config(values),
            "train": lambda: flat.train_config(values, flat.loss_config(values)),
            "view": lambda: flat.view_config(values, self.train.loss),
        }
        for name in parts:  # train before view: the view is its loss's
            if getattr(self, name) is None:
                object.__setattr__(self, name, fill[name]())

    def _check_fields(self) -> None:
        for name in ("problems", "samples", "max_tokens", "max_loop_num"):  # None: the task's / the workflow's default
            check_count(f"RunConfig.{name}", getattr(self, name), optional=name in ("max_tokens", "max_loop_num"))
        replay = self.problem_replay
        if isinstance(replay, bool) or not (isinstance(replay, (int, float)) and 0 <= replay < 1):
            raise ConfigError(f"RunConfig.problem_replay must be a share in [0, 1), got {replay!r}")
        self._check_staleness()
        if not self.strategies:
            raise ConfigError("RunConfig.strategies must name at least one strategy")
        bad = [s for s in self.strategies if s not in STRATEGY_IDS]
        if bad:
            raise ConfigError(f"RunConfig.strategies: unknown {bad}; choose from {sorted(STRATEGY_IDS)}")
        object.__setattr__(self, "strategies", tuple(self.strategies))
        if not isinstance(self.workflow, str) or not self.workflow:
            raise ConfigError(f"RunConfig.workflow must name a workflow, got {self.workflow!r}")
        object.__setattr__(self, "workflow_options", FrozenMapping(dict(self.workflow_options)))
        unknown = sorted(set(self.strategy_options) - set(STRATEGY_IDS))
        if unknown:
            raise ConfigError(f"RunConfig.strategy_options: unknown strategy {unknown}; choose from {sorted(STRATEGY_IDS)}")
        object.__setattr__(self, "strategy_options", FrozenMapping({k: FrozenMapping(v) for k, v in self.strategy_options.items()}))
        for sid in self.strategies:  # options a strategy does not take are named here, not mid-round
            make_strategy(sid, group_size=self.samples, **self.strategy_options.get(sid, {}))
        for name, kind in (("advantage", AdvantageConfig), ("view", ViewConfig), ("train", TrainConfig), ("evaluation", EvalConfig),
                           ("scale", ScaleConfig), ("tracking", TrackingConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"RunConfig.{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")

    def _check_staleness(self) -> None:
        k, rows, weight = self.max_staleness, self.max_row_staleness, self.stale_row_weight
        check_count("RunConfig.max_staleness", k, minimum=0)
        check_count("RunConfig.max_row_staleness", rows, minimum=0, optional=True)
        if isinstance(weight, bool) or not (isinstance(weight, (int, float)) and 0 <= weight <= 1):
            raise ConfigError(f"RunConfig.stale_row_weight must be a number in [0, 1], got {weight!r}")
        if self.scale.trainer_cores is not None and not k:
            raise ConfigError(
                f"RunConfig.scale.trainer_cores {self.scale.trainer_cores!r} pins the trainer of overlapped rounds: it needs "
                "RunConfig.max_staleness > 0"
            )
        if self.scale.trainer_devices is not None and not k and self.scale.train_processes == 1:
            raise ConfigError(
                f"RunConfig.scale.trainer_devices {self.scale.trainer_devices!r} gives the trainer's own processes their devices: it "
                "needs RunConfig.max_staleness > 0 (the trainer lane) or ScaleConfig.train_processes > 1 (torchrun's ranks); "
                "in-process training uses the run's devices (ScaleConfig.engine_devices)"
            )
        if k and self.start_from == "best":
            raise ConfigError(
                f"RunConfig.start_from 'best' picks the checkpoint by the previous round's evaluation, which an overlapped "
                f"round (RunConfig.max_staleness {k}) starts before; use start_from 'last' or max_staleness 0"
            )

    def _check_across_stages(self) -> None:
        """Combinations of fields of different stages that would train the wrong rows, or fail
        mid-round, are refused here, naming the fields."""
        kind, alpha, local_weight = self.train.loss.kind, self.advantage.alpha, self.advantage.local_weight
        if self.train_on == "ground_truth" and kind != "rs":
            raise ConfigError("RunConfig.train_on='ground_truth' needs the 'rs' loss (its rows were not sampled: no importance ratio exists)")
        if self.train.temperature != self.temperature:
            raise ConfigError(
                f"RunConfig.train.temperature ({self.train.temperature}) must equal RunConfig.temperature "
                f"({self.temperature}): the stored logprobs are at the sampling temperature"
            )
        if (kind == "rs" or self.view.reward_is_local) and (alpha, local_weight) != (0.0, 1.0):
            who = "RunConfig.train.loss.kind rs trains" if kind == "rs" else "RunConfig.view.reward_is_local keeps"
            raise ConfigError(
                f"{who} the rows whose own action was right, judged by the reward; with RunConfig.advantage.alpha {alpha:g} and "
                f"RunConfig.advantage.local_weight {local_weight:g} the reward is not the row's own correctness (a wrong first attempt "
                "of a trajectory that later succeeds would be fine-tuned on): it needs RunConfig.advantage.alpha 0 and "
                "RunConfig.advantage.local_weight 1 (the rs loss's preset)"
            )
        if self.view.relabel_verdicts and kind != "rs":
            raise ConfigError(relabel_needs_rs("RunConfig.view.relabel_verdicts", "RunConfig.train.loss.kind", kind))
        if self.view.strategy_weights is not None:
            missing = [s for s in self.strategies if s not in self.view.drop_strategies and s not in self.view.strategy_weights]
            if missing:
                raise ConfigError(
                    f"RunConfig.view.strategy_weights has no weight for strategy {missing} of RunConfig.strategies "
                    f"{' '.join(self.strategies)}: every strategy trained needs one"
                )
        if self.engine == "hf" and (self.scale.tensor_parallel_size, self.scale.data_parallel_size) != (1, 1):
            raise ConfigError(
                f"RunConfig.scale.tensor_parallel_size {self.scale.tensor_parallel_size} and RunConfig.scale.data_parallel_size "
                f"{self.scale.data_parallel_size} are vLLM's: RunConfig.engine hf would ignore them (use vllm or auto, or leave them 1)"
            )
