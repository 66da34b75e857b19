"""One config tree: the library's `RunConfig` knows its algorithm and its presets, refuses a bad
combination of fields when it is built (naming them, or their flags where `Settings` built it),
and holds the scale-out and tracking settings; `Settings` is a thin layer whose flags and
launchpad fields are those of the layout before the presets moved (snapshotted here)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import (
    ALGORITHM_PRESETS, ALGORITHMS, DEFAULT_MIX, LOSS_KINDS, LOSS_PRESETS, TRACKERS, AdvantageConfig, EvalConfig, LossConfig, RunConfig,
    ScaleConfig, TrackingConfig, TrainConfig, ViewConfig, flat,
)
from pipeline.config.fields import setting
from pipeline.errors import ConfigError
from pipeline.run.settings import Settings


# -- an algorithm's config in a notebook ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_algorithm_is_a_field_of_the_run_and_its_preset_fills_what_is_left_unset(algorithm):
    settings = Settings(algorithm=algorithm).run_config()
    assert RunConfig(algorithm=algorithm) == settings == RunConfig.for_algorithm(algorithm)
    assert settings.algorithm == algorithm and settings.strategies == tuple(ALGORITHM_PRESETS[algorithm]["strategies"])
    # a run field and a setting inside a stage's config, by the flag's name, over the preset
    over = RunConfig.for_algorithm(algorithm, samples=8, lr=1e-4, eval_problems=20)
    assert over == Settings(algorithm=algorithm, samples=8, lr=1e-4, eval_problems=20).run_config()
    assert (over.samples, over.train.lr, over.evaluation.problems) == (8, 1e-4, 20)
    assert over.advantage == settings.advantage and over.train.loss == settings.train.loss
    assert RunConfig(algorithm=algorithm, samples=8) == dataclasses.replace(settings, samples=8)


def test_a_stage_config_given_keeps_the_algorithms_preset_for_the_others():
    drmas = RunConfig(algorithm="drmas")
    assert (drmas.advantage.alpha, drmas.advantage.local_weight, drmas.advantage.group_by) == (1.0, 0.0, ("agent_id",))
    assert drmas.train.loss.kind == "ppo" and drmas.train.loss.dual_clip == 3.0 and not drmas.view.drop_zero_advantage
    # its own training at another learning rate: the rest is DrMAS's, the view the one of the loss given
    slow = RunConfig(algorithm="drmas", train=dataclasses.replace(drmas.train, lr=1e-5))
    assert slow == dataclasses.replace(drmas, train=dataclasses.replace(drmas.train, lr=1e-5))
    # the loss given decides the loss's preset of the fields left unset (ppo's batch baseline here)
    ppo = RunConfig(train=TrainConfig(loss=LossConfig(kind="ppo")))
    assert ppo.advantage == Settings(loss="ppo").advantage_config() and ppo.view == Settings(loss="ppo").view_config()
    # a sampling temperature reaches the training the preset fills in (it must equal it)
    assert RunConfig(temperature=0.7).train.temperature == 0.7


def test_unknown_settings_and_algorithms_are_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['alpah'\]; the settings are \[.*'alpha'"):
        RunConfig.for_algorithm("atgrpo", alpah=0.5)
    with pytest.raises(ConfigError, match=r"^RunConfig.algorithm must be one of \['maxit', 'drmas', 'atgrpo', 'exit', 'grpo'\], got 'ppo'$"):
        RunConfig(algorithm="ppo")
    with pytest.raises(ConfigError, match="algorithm must be one of"):
        RunConfig.for_algorithm("ppo")
    with pytest.raises(ConfigError, match="must be a sequence of names, got the string 'iid'"):
        RunConfig(strategies="iid")


def test_presets_and_names_are_defined_once_in_the_config():
    import pipeline.config.loss
    import pipeline.run.settings as settings_module

    # the presets live in pipeline.config.presets alone: the settings' module does not hand them on
    assert not {"ALGORITHM_PRESETS", "LOSS_PRESETS", "ALGORITHMS", "LOSS_KINDS"} & set(settings_module.__all__)
    assert LOSS_KINDS is pipeline.config.loss.LOSS_KINDS
    assert tuple(LOSS_PRESETS) == LOSS_KINDS == ("rs", "ppo", "is", "exit")
    assert ALGORITHM_PRESETS["maxit"]["strategies"] == DEFAULT_MIX == RunConfig().strategies
    # every setting has a place in the tree, and the tree's places are the settings'
    assert set(flat.setting_paths(RunConfig)) == {f.name for f in dataclasses.fields(Settings)}


# -- cross-field rules: refused at construction -----------------------------------------------------

RS_VIEW = ViewConfig.for_loss(LossConfig())
PPO = TrainConfig(loss=LossConfig(kind="ppo"))


@pytest.mark.parametrize(
    "build, config_error, settings, flag_error",
    [
        # the example: accepted before and failed mid-round at the view stage
        (lambda: RunConfig(advantage=AdvantageConfig(alpha=1.0)),
         r"^RunConfig.train.loss.kind rs trains the rows whose own action was right.*with RunConfig.advantage.alpha 1 and "
         r"RunConfig.advantage.local_weight 1 the reward is not the row's own correctness",
         {"alpha": 1.0}, r"^--loss rs trains the rows .* with --alpha 1 and --local-weight 1 the reward .*: it needs --alpha 0 and --local-weight 1"),
        (lambda: RunConfig(train=PPO, view=RS_VIEW, advantage=AdvantageConfig(alpha=1.0)),
         r"^RunConfig.view.reward_is_local keeps the rows whose own action was right.*RunConfig.advantage.alpha 1", None, None),
        (lambda: RunConfig(train=PPO, view=ViewConfig.for_loss(LossConfig(), relabel_verdicts=True)),
         r"^RunConfig.view.relabel_verdicts trains Verifier rows .* of RunConfig.train.loss.kind ppo: use it with RunConfig.train.loss.kind rs$",
         {"loss": "ppo", "relabel_verdicts": True}, r"^--relabel-verdicts trains Verifier rows .* of --loss ppo: use it with --loss rs$"),
        (lambda: RunConfig(strategies=("iid", "tree"), view=ViewConfig.for_loss(LossConfig(), strategy_weights={"iid": 1.0})),
         r"^RunConfig.view.strategy_weights has no weight for strategy \['tree'\] of RunConfig.strategies iid tree",
         {"strategies": ("iid", "tree"), "strategy_weights": ("iid=1",)}, r"^--strategy-weights has no weight for strategy \['tree'\] of --strategies iid tree"),
        (lambda: RunConfig(engine="hf", scale=ScaleConfig(tensor_parallel_size=2)),
         r"^RunConfig.scale.tensor_parallel_size 2 and RunConfig.scale.data_parallel_size 1 are vLLM's: RunConfig.engine hf would ignore them",
         {"engine": "hf", "tensor_parallel_size": 2}, r"^--tensor-parallel-size 2 and --data-parallel-size 1 are vLLM's: --engine hf would ignore them"),
        (lambda: ScaleConfig(fsdp="full_shard"),
         r"^ScaleConfig.fsdp full_shard shards the trainer over its processes, but ScaleConfig.train_processes is 1",
         {"fsdp": "full_shard"}, r"^--fsdp full_shard shards the trainer over its processes, but --train-processes is 1"),
        (lambda: TrackingConfig(report_to=("tensorboard", "neptune")),
         r"^TrackingConfig.report_to neptune: unknown target; choose from tensorboard, mlflow, wandb \(or none\)$",
         {"report_to": ("neptune",)}, r"^--report-to neptune: unknown target"),
        (lambda: ScaleConfig(ray_address="head:6379"),
         r"^ScaleConfig.ray_address 'head:6379' names a Ray cluster for the shards: it needs ScaleConfig.executor 'ray' \(got 'dagster'\)",
         {"ray_address": "head:6379"}, r"^--ray-address 'head:6379' names a Ray cluster for the shards: it needs --executor 'ray'"),
        (lambda: ScaleConfig(shards=0), r"^ScaleConfig.shards must be an integer >= 1, got 0$", {"shards": 0}, r"^--shards must be an integer >= 1, got 0$"),
        (lambda: LossConfig(kind="is", dual_clip=3.0), r"^LossConfig.dual_clip is a bound of the PPO clip: it needs LossConfig.kind ppo, got is$",
         {"algorithm": "drmas", "loss": "is"}, r"^--dual-clip is a bound of the PPO clip: it needs --loss ppo, got is$"),
    ],
    ids=["rs-global-reward", "local-view-global-reward", "relabel-ratio-loss", "weights-missing", "hf-parallel", "fsdp-one-process",
         "tracker", "ray-address-without-ray", "shards", "dual-clip-kind"],
)
def test_a_bad_combination_is_refused_when_the_config_is_built(build, config_error, settings, flag_error):
    with pytest.raises(ConfigError, match=config_error):
        build()
    if settings is not None:
        with pytest.raises(ConfigError, match=flag_error):
            Settings(**settings).run_config()


def test_good_neighbours_of_the_refused_combinations_build():
    RunConfig(train=PPO, advantage=AdvantageConfig(alpha=1.0))  # a ratio loss takes a global reward
    RunConfig(view=ViewConfig.for_loss(LossConfig(), relabel_verdicts=True))  # relabelling under rs
    RunConfig(strategies=("iid", "prompt_aug"), view=ViewConfig.for_loss(LossConfig(), strategy_weights={"iid": 1.0}, drop_strategies=("prompt_aug",)))
    RunConfig.for_algorithm("exit", strategies=("iid", "prompt_aug"))  # a weight for a strategy not run is harmless
    RunConfig(engine="vllm", scale=ScaleConfig(tensor_parallel_size=2, data_parallel_size=2))
    ScaleConfig(fsdp="full_shard", train_processes=2)


# -- scale-out and tracking in the tree -------------------------------------------------------------


def test_scale_out_and_tracking_settings_have_a_place_in_the_tree():
    s = Settings(shards=3, tensor_parallel_size=2, data_parallel_size=4, train_processes=2, fsdp="hybrid_shard", report_to=("tensorboard", "mlflow"))
    config = s.run_config()
    assert config.scale == ScaleConfig(shards=3, tensor_parallel_size=2, data_parallel_size=4, train_processes=2, fsdp="hybrid_shard")
    assert config.tracking.report_to == ("tensorboard", "mlflow")
    # the settings keep their attributes (the run layer reads them)
    assert (s.shards, s.tensor_parallel_size, s.data_parallel_size, s.train_processes, s.fsdp, s.report_to) == (3, 2, 4, 2, "hybrid_shard", ("tensorboard", "mlflow"))
    assert RunConfig().scale == ScaleConfig() and RunConfig().tracking == TrackingConfig() == Settings(report_to=("none",)).run_config().tracking
    from pipeline.reporting.tracking import TARGETS

    assert TRACKERS == tuple(TARGETS)  # the trackers the config accepts are those the run layer logs to


# -- the thin layer: the flags and the launchpad as they were ----------------------------------------

RUN_FLAGS = {
    # the flags of `maxit run` (option strings -> choices) at 894bd8f, before the presets moved, with the long runs' settings
    ("--rounds",): None, ("--restart",): None, ("--verbose",): None, ("--store",): None,
    ("--algorithm",): ("maxit", "drmas", "atgrpo", "exit", "grpo"), ("--workflow",): None, ("--workflow-options",): None, ("--task",): None,
    ("--task-file",): None, ("--prompt-file",): None, ("--model-dir",): None, ("--separate-policies",): None,
    ("--engine",): ("auto", "vllm", "hf"), ("--dtype",): ("auto", "float32", "bfloat16"), ("--problems",): None, ("--samples",): None,
    ("--strategies",): None, ("--temperature",): None, ("--max-tokens",): None, ("--max-loop-num",): None, ("--seed",): None,
    ("--problem-replay",): None, ("--start-from",): ("last", "best"),
    ("--feedback-train-context",): ("problem", "attempt"), ("--feedback-first-attempt",): ("iid", "skip"), ("--alpha",): None,
    ("--local-weight",): None, ("--group-by",): None, ("--normalize",): ("std", "center"), ("--baseline",): ("group", "batch", "role"),
    ("--trajectory-mean", "--no-trajectory-mean"): None, ("--trajectory-score",): ("own", "mean"), ("--loss",): ("rs", "ppo", "is", "exit"),
    ("--anchor",): ("sampling", "proximal"), ("--sequence-ratio",): ("mask", "truncate", "none"), ("--hinted-rows",): ("mask", "truncate", "none", "drop"),
    ("--zero-advantage-rows",): ("drop", "keep"), ("--feedback-rows",): ("mask", "truncate", "none"), ("--dual-clip",): None, ("--clip-low",): None,
    ("--clip-high",): None, ("--lr",): None, ("--epochs",): None, ("--minibatch-size",): None, ("--micro-batch-size",): None,
    ("--balance-verdicts", "--no-balance-verdicts"): None, ("--relabel-verdicts", "--no-relabel-verdicts"): None, ("--verifier-replay",): None,
    ("--negative-weight",): None, ("--strategy-weights",): None, ("--lora", "--no-lora"): None, ("--lora-rank",): None, ("--lora-alpha",): None,
    ("--gradient-checkpointing",): ("auto", "on", "off"), ("--group-minibatches", "--no-group-minibatches"): None,
    ("--optimizer-state",): ("fresh", "carry"), ("--micro-batch-tokens",): None, ("--lr-round-decay",): None, ("--kl-beta",): None,
    ("--train-on",): ("rollouts", "ground_truth"), ("--shards",): None,
    ("--max-staleness",): None, ("--staleness-schedule",): ("bound", "exact"), ("--trainer-cores",): None, ("--engine-devices",): None, ("--trainer-devices",): None, ("--max-row-staleness",): None, ("--stale-row-weight",): None,
    ("--executor",): ("dagster", "ray"), ("--ray-address",): None,
    ("--tensor-parallel-size",): None, ("--data-parallel-size",): None, ("--train-processes",): None,
    ("--fsdp",): ("off", "full_shard", "shard_grad_op", "hybrid_shard"), ("--eval-problems",): None, ("--eval-samples",): None,
    ("--eval-max-tokens",): None, ("--no-base-eval-cache",): None, ("--report-to",): None,
    ("--off-policy-correction",): ("none", "tis", "token-tis", "seq-mask", "geo-mask"), ("--correction-cap",): None, ("--correction-low",): None,
    # the spellings `maxit view` and `maxit train` had, taken by every command and not listed (issue 55)
    ("--strategy-weight",): None, ("--processes",): None,
}

LAUNCHPAD_DEFAULTS = {
    # the Dagster launchpad's settings fields and their defaults at 894bd8f, with the shards' executor and the long runs'
    # settings (None: the preset's, or unset)
    "algorithm": "maxit", "alpha": None, "anchor": "sampling", "balance_verdicts": None, "base_eval_cache": True, "baseline": None,
    "clip_high": None, "clip_low": None, "data_parallel_size": 1, "dtype": "auto", "dual_clip": None, "engine": "auto", "epochs": 2, "executor": "dagster",
    "eval_max_tokens": None, "eval_problems": 200, "eval_samples": 2, "feedback_first_attempt": None, "feedback_rows": None,
    "feedback_train_context": None, "fsdp": "off", "gradient_checkpointing": "auto", "group_by": None, "group_minibatches": False,
    "hinted_rows": None, "kl_beta": 0.0, "local_weight": None, "lora": False, "lora_alpha": 32.0, "lora_rank": 16, "loss": None, "lr": None, "lr_round_decay": 1.0,
    "max_loop_num": None, "max_row_staleness": None, "max_staleness": 0, "max_tokens": None, "micro_batch_size": 64, "micro_batch_tokens": 8192, "minibatch_size": 256, "model_dir": None,
    "negative_weight": None, "normalize": None, "optimizer_state": "fresh", "problem_replay": 0.25, "problems": 128, "prompt_file": None, "ray_address": None, "relabel_verdicts": False,
    "report_to": [], "samples": 4, "seed": 0, "sequence_ratio": None, "shards": 1, "shared_policy": True, "stale_row_weight": 0.0, "staleness_schedule": "bound", "start_from": "last", "strategies": None,
    "strategy_weights": None, "task": "arithmetic", "task_file": None, "temperature": 1.0, "tensor_parallel_size": 1, "train_on": "rollouts",
    "train_processes": 1, "trainer_cores": None, "engine_devices": None, "trainer_devices": None, "trajectory_mean": None, "trajectory_score": None, "verifier_replay": 0, "workflow": "math", "workflow_options": [],
    "zero_advantage_rows": None,
    "off_policy_correction": "none", "correction_cap": 2.0, "correction_low": None,
}


def test_the_flags_and_the_launchpad_fields_are_as_before():
    from assets.config import RunSettings
    from maxit.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    flags = {tuple(a.option_strings): (tuple(a.choices) if a.choices is not None else None) for a in run._actions if a.dest != "help"}
    assert flags == RUN_FLAGS
    assert {name: f.default for name, f in RunSettings.model_fields.items()} == LAUNCHPAD_DEFAULTS


# -- one declaration: the flags, the launchpad and a notebook -------------------------------------------

# a run far from the default, each setting by its flat name
FAR = {
    "algorithm": "drmas", "samples": 8, "strategies": ("iid", "tree", "prompt_aug"), "temperature": 0.7, "lr": 1e-4, "eval_problems": 20,
    "strategy_weights": ("iid=2", "tree=1"), "hinted_rows": "drop", "group_by": ("agent_id", "turn"), "zero_advantage_rows": "drop",
    "gradient_checkpointing": "on", "lora": True, "lora_rank": 4, "workflow_options": ("max_turns=3",), "shared_policy": False,
    "feedback_first_attempt": "skip", "kl_beta": 0.01, "shards": 2, "report_to": ("tensorboard",), "base_eval_cache": False,
}


def _argv(values: dict) -> list[str]:
    """The `maxit run` flags of `values`, spelled from the declarations (a switch by its own flag)."""
    from pipeline.config.fields import walk

    argv = []
    for found in walk(RunConfig):
        name, value = found.setting.name, values.get(found.setting.name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            negative = found.setting.negative_flag
            argv += [negative[0]] if negative and not value else [flag if value else "--no-" + flag[2:]]
        elif isinstance(value, tuple):
            argv += [flag, *value]
        else:
            argv += [flag, str(value)]
    return argv


def test_the_flags_the_launchpad_and_a_notebook_make_one_run_from_one_declaration():
    from assets.config import RunSettings
    from maxit.cli import build_parser
    from pipeline.config import LoraSettings, RatioConfig
    from pipeline.run.settings import settings_from_args

    notebook = RunConfig.for_algorithm(**FAR)
    flags = settings_from_args(build_parser().parse_args(["run", *_argv(FAR)])).run_config()
    launchpad = RunSettings(**{k: list(v) if isinstance(v, tuple) else v for k, v in FAR.items()}).run_config()
    assert flags == launchpad == notebook
    # each setting where its field declares it
    assert (notebook.samples, notebook.temperature, notebook.train.temperature, notebook.train.lr) == (8, 0.7, 0.7, 1e-4)
    assert notebook.evaluation == EvalConfig(problems=20, reuse_base=False) and notebook.scale == ScaleConfig(shards=2)
    assert dict(notebook.view.strategy_weights) == {"iid": 2.0, "tree": 1.0} and notebook.view.drop_strategies == ("prompt_aug",)
    assert notebook.view.drop_zero_advantage and notebook.train.gradient_checkpointing is True
    assert notebook.train.lora == LoraSettings(r=4) and notebook.train.loss.beta == 0.01 and not notebook.shared_policy
    assert notebook.strategy_options["feedback"]["first_attempt"] == "skip" and notebook.workflow_options == {"max_turns": 3}
    assert notebook.tracking.report_to == ("tensorboard",) and notebook.train.loss.ratio_for("iid") == RatioConfig(mode="none")
    # and the default run, everywhere
    assert settings_from_args(build_parser().parse_args(["run"])).run_config() == RunSettings().run_config() == RunConfig()


@dataclasses.dataclass(frozen=True)
class WiderEval(EvalConfig):
    """`EvalConfig` with one more setting declared, as a new field of the tree would declare it."""

    probe: int = dataclasses.field(default=3, metadata=setting("eval_probe", "held-out problems of a quick probe", group="evaluation"))


@dataclasses.dataclass(frozen=True)
class WiderRun(RunConfig):
    evaluation: WiderEval = dataclasses.field(default_factory=WiderEval)


@dataclasses.dataclass(frozen=True)
class Twice(WiderRun):
    seed: int = dataclasses.field(default=0, metadata=setting("eval_probe", "again", group="sampling"))


def test_a_field_added_to_the_tree_is_a_flag_with_its_help_and_a_launchpad_field():
    """Adding a setting is one declaration on the field: its flag, its help and its launchpad
    field follow."""
    import argparse

    from assets.config import launchpad
    from pipeline.run.settings import add_setting_flags, settings_class

    settings = settings_class(WiderRun)
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, settings=settings)
    probe = next(a for a in parser._actions if a.dest == "eval_probe")
    assert probe.option_strings == ["--eval-probe"] and probe.help == "held-out problems of a quick probe (default: 3)"
    assert parser.parse_args(["--eval-probe", "5"]).eval_probe == 5 and settings().eval_probe == 3
    field = launchpad(settings).model_fields["eval_probe"]
    assert (field.description, field.default) == ("held-out problems of a quick probe", 3)
    # the same name declared on two fields is refused, naming it
    with pytest.raises(TypeError, match=r"\['eval_probe'\] declared on more than one field"):
        settings_class(Twice)


# -- a setting's help, written once ------------------------------------------------------------------


def field_docstrings() -> dict[tuple[str, str], str]:
    """(config class, field) -> the docstring written under the field, read from pipeline/config."""
    import ast
    from pathlib import Path

    out = {}
    for path in sorted((Path(__file__).resolve().parents[1] / "pipeline" / "config").glob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)):
            for node, after in zip(cls.body, cls.body[1:]):
                if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                        and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                    out[(cls.name, node.target.id)] = after.value.value
    return out


def help_problems(found, docstrings: dict[tuple[str, str], str]) -> list[str]:
    """What is wrong with the help of the settings `found` (`fields.walk`): a setting without help,
    a help given to two settings, a field whose docstring restates its setting's help (the help
    is the one text of what the setting does; the docstring may only add to it)."""
    import difflib
    import re

    def words(text: str) -> str:
        return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()

    problems, first = [], {}
    for f in found:
        name, text = f.setting.name, words(f.setting.help)
        if not text:
            problems.append(f"{name}: no help")
            continue
        if text in first:
            problems.append(f"{name}: the same help as {first[text]}")
        first.setdefault(text, name)
        doc = docstrings.get((f.owner.__name__, f.field_name))
        if doc and f.setting.key is None and difflib.SequenceMatcher(None, text, words(doc)).ratio() >= 0.8:
            problems.append(f"{name}: the docstring of {f.owner.__name__}.{f.field_name} restates its help")
    return problems


def test_every_setting_has_its_help_written_once():
    from pipeline.config.fields import walk

    found = list(walk(RunConfig))
    assert len(found) > 60
    assert help_problems(found, field_docstrings()) == []


def test_the_help_check_names_a_missing_a_shared_and_a_restated_help():
    from pipeline.config.fields import Found, Setting

    class Demo:
        pass

    def found(name: str, text: str) -> Found:
        return Found(Setting(name, text, "sampling"), name, Demo, name, int, 0, False)

    docstrings = {("Demo", "seed"): "Seed of the problem draws and of sampling.", ("Demo", "samples"): "Counted per problem, not per round."}
    settings = [found("seed", "seed of the problem draws and of sampling"), found("samples", "samples per problem"),
                found("problems", " "), found("draws", "Samples per problem.")]
    assert help_problems(settings, docstrings) == [
        "seed: the docstring of Demo.seed restates its help",
        "problems: no help",
        "draws: the same help as samples",
    ]
