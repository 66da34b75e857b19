"""Run configuration as a Dagster config class (a `ConfigurableResource`, so every asset and
every check of a round reads the same settings, and the launchpad edits them in one place),
mapped onto `pipeline.rounds.RunConfig`. The defaults are one expert-iteration round of the
embedded default team."""


from pathlib import Path

import dagster as dg
from pydantic import Field

from pipeline.config import AdvantageConfig
from pipeline.evaluation import EvalConfig
from pipeline.rounds import RoundContext, RunConfig


class RunSettings(dg.ConfigurableResource):
    # team and task
    task: str = Field(default="arithmetic", description="task name (pipeline.tasks)")
    task_file: str | None = Field(default=None, description="local JSONL/Parquet problems file instead of `task`")
    model_dir: str | None = Field(default=None, description="starting checkpoint; None = the embedded default model")
    shared_policy: bool = Field(default=True, description="Solver and Verifier share one policy")
    # sampling
    problems: int = Field(default=128, description="training problems per round")
    samples: int = Field(default=4, description="group size of every strategy")
    strategies: list[str] = Field(default=["iid", "prompt_aug", "feedback", "tree"])
    temperature: float = 1.0
    max_tokens: int = 16
    max_loop_num: int = 2
    alpha: float | None = Field(
        default=None,
        description="reward = alpha*global + local; None = 0 for the 'rs' loss (a row is kept when its own action was right: "
        "the Solver's answer, the Verifier's verdict) and 1 for 'ppo' (AT-GRPO's mixed reward)",
    )
    seed: int = 0
    # advantages
    group_by: list[str] = Field(default=["agent_id", "turn", "strategy"], description="added to uid to form groups")
    normalize: str = "std"
    trajectory_mean: bool = False
    # training
    loss: str = Field(default="rs", description="'rs' (rejection-sampling expert iteration) or 'ppo'")
    lr: float = 5e-4
    epochs: int = 2
    minibatch_size: int = 256
    micro_batch_size: int = 64
    train_on: str = Field(default="rollouts", description="'rollouts' or 'ground_truth' (the step-matched SFT baseline)")
    balance_verdicts: bool = Field(default=True, description="equal total weight for the Verifier's yes and no training rows each round")
    # evaluation
    eval_problems: int = 200
    eval_samples: int = 2

    def run_config(self) -> RunConfig:
        from pipeline.training.config import LossConfig, TrainConfig
        from pipeline.views import ViewConfig

        alpha = self.alpha if self.alpha is not None else (0.0 if self.loss == "rs" else 1.0)
        loss = LossConfig(kind=self.loss)
        return RunConfig(
            task=self.task,
            task_file=self.task_file,
            model_dir=self.model_dir,
            shared_policy=self.shared_policy,
            problems=self.problems,
            samples=self.samples,
            strategies=tuple(self.strategies),
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            max_loop_num=self.max_loop_num,
            alpha=alpha,
            seed=self.seed,
            advantage=AdvantageConfig(group_by=tuple(self.group_by), normalize=self.normalize, trajectory_mean=self.trajectory_mean, alpha=alpha),
            view=ViewConfig(drop_zero_advantage=self.loss != "rs", min_reward=loss.rs_threshold if self.loss == "rs" else None),
            train=TrainConfig(
                lr=self.lr,
                epochs=self.epochs,
                minibatch_size=self.minibatch_size,
                micro_batch_size=self.micro_batch_size,
                temperature=self.temperature,
                loss=loss,
                report_to="none",
            ),
            train_on=self.train_on,
            balance_verdicts=self.balance_verdicts,
            evaluation=EvalConfig(problems=self.eval_problems, samples=self.eval_samples),
        )

    def context(self, store, engine, policy_registry=None) -> RoundContext:
        registry = policy_registry.registry() if policy_registry is not None else None
        return RoundContext(Path(store.root()), self.run_config(), engine.pool(), registry)
