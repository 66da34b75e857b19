"""The library's configs default to the default run (`maxit run` with no flags): a stage called
with its default config, as in a notebook, computes what that run computes, and the settings take
their defaults from the configs (one place declares each)."""

from __future__ import annotations

import dataclasses

import polars as pl
from polars.testing import assert_frame_equal

from pipeline.learn.advantages import compute_advantages
from pipeline.config import AdvantageConfig, EvalConfig, RunConfig, ViewConfig
from pipeline.rollout.sampling import RolloutConfig
from pipeline.config.presets import LOSS_PRESETS
from pipeline.run.settings import Settings
from pipeline.rollout.synthetic import synthetic_steps
from pipeline.config.loss import LossConfig
from pipeline.config.train import LoraSettings, TrainConfig


def test_compute_advantages_with_its_default_config_is_what_the_default_run_computes():
    steps = synthetic_steps(60, samples=4, layout="loops", seed=1)
    # the steps tell reward mixes apart: calls whose own (local) reward differs from the team's
    assert (steps["global_reward"] != steps["local_reward"]).any()
    run = Settings().run_config()
    notebook = compute_advantages(steps)
    assert_frame_equal(notebook, compute_advantages(steps, run.advantage))
    assert_frame_equal(compute_advantages(steps, AdvantageConfig()), notebook)
    # the team reward mixed in (AT-GRPO's reward, the library's default before) is another computation
    mixed = compute_advantages(steps, dataclasses.replace(run.advantage, alpha=1.0))
    assert not mixed["advantage"].equals(notebook["advantage"])
    assert notebook.filter(pl.col("reward").is_not_null()).height > 0


def test_every_stage_config_defaults_to_the_default_run():
    run = Settings().run_config()
    assert run == RunConfig()
    assert run.advantage == AdvantageConfig()
    assert run.train == TrainConfig() and run.train.loss == LossConfig() and LossConfig().kind == "rs"
    assert run.evaluation == EvalConfig()
    # a view's rows follow the loss: the default run's is the default loss's view
    assert run.view == ViewConfig.for_loss(LossConfig())
    rollout = RolloutConfig()
    assert (rollout.alpha, rollout.local_weight, rollout.temperature) == (run.advantage.alpha, run.advantage.local_weight, run.temperature)


def test_the_settings_defaults_are_the_configs():
    s = Settings()
    train, loss, view, evaluation = TrainConfig(), LossConfig(), ViewConfig.for_loss(LossConfig()), EvalConfig()
    assert (s.epochs, s.minibatch_size, s.micro_batch_size, s.micro_batch_tokens, s.dtype, s.preset("lr")) == (
        train.epochs, train.minibatch_size, train.micro_batch_size, train.micro_batch_tokens, train.dtype, train.lr
    )
    assert (s.lora_rank, s.lora_alpha) == (LoraSettings().r, LoraSettings().alpha)
    assert (s.loss, s.anchor, s.clip_low, s.preset("clip_high"), s.preset("negative_weight")) == (
        loss.kind, loss.anchor, loss.eps_low, loss.eps_high, loss.negative_weight
    )
    assert (s.relabel_verdicts, s.verifier_replay) == (view.relabel_verdicts, view.verifier_replay)
    assert (s.eval_problems, s.eval_samples, s.eval_max_tokens) == (evaluation.problems, evaluation.samples, evaluation.max_tokens)
    assert s.reward_mix() == (AdvantageConfig().alpha, AdvantageConfig().local_weight) == (LOSS_PRESETS["rs"]["alpha"], LOSS_PRESETS["rs"]["local_weight"])


def test_a_view_follows_its_loss():
    rs, ppo = ViewConfig.for_loss(LossConfig(kind="rs")), ViewConfig.for_loss(LossConfig(kind="ppo"))
    assert (rs.drop_zero_advantage, rs.min_reward, rs.reward_is_local, rs.balance_verdicts) == (False, LossConfig().rs_threshold, True, True)
    assert (ppo.drop_zero_advantage, ppo.min_reward, ppo.reward_is_local, ppo.balance_verdicts) == (True, None, False, False)
    assert ppo == ViewConfig()  # a bare ViewConfig is the policy-gradient losses' view
    assert ViewConfig.for_loss(LossConfig(kind="rs", rs_threshold=0.5), balance_verdicts=False).min_reward == 0.5
    assert not ViewConfig.for_loss(LossConfig(), balance_verdicts=False).balance_verdicts
