"""One definition of a run's settings: RunConfig(), the Dagster settings and `maxit run` are the
same run, for the defaults and for any flags."""

from __future__ import annotations

import dataclasses

import pytest

from assets.config import RunSettings
from maxit.cli import build_parser, main
from pipeline.errors import ConfigError
from pipeline.config import RunConfig
from pipeline.config.presets import LOSS_PRESETS
from pipeline.run.settings import Settings, setting_help, settings_from_args


def cli_settings(*argv: str) -> Settings:
    args = build_parser().parse_args(["run", *argv])
    return settings_from_args(args)


def dagster_settings(settings: Settings) -> RunSettings:
    return RunSettings.from_settings(settings)


def test_defaults_are_one_run_everywhere():
    notebook = RunConfig()
    assert Settings().run_config() == notebook
    assert RunSettings().run_config() == notebook
    assert cli_settings().run_config() == notebook
    # the default run is the rejection-sampling loss with its reward preset
    assert notebook.train.loss.kind == "rs"
    assert (notebook.advantage.alpha, notebook.advantage.local_weight) == (LOSS_PRESETS["rs"]["alpha"], LOSS_PRESETS["rs"]["local_weight"])
    assert notebook.view.balance_verdicts and notebook.view.reward_is_local


def test_every_setting_is_a_flag_and_a_dagster_field():
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    dests = {a.dest for a in run._actions}
    names = {f.name for f in dataclasses.fields(Settings)}
    assert names <= dests
    assert names <= set(RunSettings.model_fields)
    for f in dataclasses.fields(Settings):
        # the help, with what each algorithm sets it to where one does (`setting_help`)
        assert RunSettings.model_fields[f.name].description == setting_help(f.name)
        assert RunSettings.model_fields[f.name].description.startswith(f.metadata["help"])


@pytest.mark.parametrize(
    "argv, values",
    [
        (["--loss", "ppo", "--lr", "1e-4", "--epochs", "1"], {"loss": "ppo", "lr": 1e-4, "epochs": 1}),
        (["--separate-policies", "--no-balance-verdicts"], {"shared_policy": False, "balance_verdicts": False}),
        (["--group-by", "agent_id", "--strategies", "iid", "tree"], {"group_by": ("agent_id",), "strategies": ("iid", "tree")}),
        (["--loss", "ppo", "--alpha", "0.5", "--local-weight", "0"], {"loss": "ppo", "alpha": 0.5, "local_weight": 0.0}),
        (["--feedback-first-attempt", "skip", "--max-tokens", "8"], {"feedback_first_attempt": "skip", "max_tokens": 8}),
        (["--strategies", "iid", "tree", "--strategy-weights", "iid=3", "tree=1", "--loss", "is", "--anchor", "proximal"],
         {"strategies": ("iid", "tree"), "strategy_weights": ("iid=3", "tree=1"), "loss": "is", "anchor": "proximal"}),
        (["--eval-max-tokens", "64", "--prompt-file", "p.toml"], {"eval_max_tokens": 64, "prompt_file": "p.toml"}),
    ],
)
def test_flags_give_the_same_run_as_the_settings(argv, values):
    from_cli = cli_settings(*argv)
    assert from_cli == Settings(**values)
    config = from_cli.run_config()
    assert dagster_settings(from_cli).run_config() == config


def test_group_by_none_is_plain_grpo():
    assert cli_settings("--group-by", "none").run_config().advantage.group_by == ()
    assert cli_settings("--group-by").run_config().advantage.group_by == ()


def test_presets_follow_the_loss():
    ppo = Settings(loss="ppo").run_config()
    assert (ppo.advantage.alpha, ppo.advantage.local_weight) == (0.0, 1.0)
    assert ppo.advantage.baseline == "batch" and ppo.train.loss.negative_weight == 0.0
    rs, is_ = RunConfig(), Settings(loss="is").run_config()
    assert rs.advantage.baseline == is_.advantage.baseline == "group" and is_.train.loss.negative_weight == 1.0
    assert (is_.advantage.alpha, is_.advantage.local_weight) == (1.0, 1.0)
    # AT-GRPO's PG, the earlier preset, is a set of flags away
    atgrpo = cli_settings("--loss", "ppo", "--alpha", "1", "--baseline", "group", "--negative-weight", "1").run_config()
    assert (atgrpo.advantage.alpha, atgrpo.advantage.baseline, atgrpo.train.loss.negative_weight) == (1.0, "group", 1.0)
    assert ppo.train.lr == LOSS_PRESETS["ppo"]["lr"] == RunConfig().train.lr == LOSS_PRESETS["rs"]["lr"] == 5e-4
    assert Settings(loss="is").run_config().train.lr == 2e-4
    assert Settings(loss="ppo", lr=1e-3).run_config().train.lr == 1e-3
    assert ppo.view.drop_zero_advantage and not ppo.view.reward_is_local


def test_clip_range_reaches_the_loss(tmp_path, capsys):
    ppo = Settings(loss="ppo").run_config().train.loss
    assert (ppo.eps_low, ppo.eps_high) == (0.2, LOSS_PRESETS["ppo"]["clip_high"])
    wide = cli_settings("--loss", "ppo", "--clip-low", "0.1", "--clip-high", "4").run_config().train.loss
    assert (wide.eps_low, wide.eps_high) == (0.1, 4.0)
    # a clip that would stop every gradient is refused where the loss checks it, naming the flag, before anything is written
    assert main(["run", "--rounds", "1", "--store", str(tmp_path / "s"), "--loss", "ppo", "--clip-low", "1"]) == 2
    err = capsys.readouterr().err
    assert "--clip-low must be in [0, 1), got 1.0" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()
    with pytest.raises(ConfigError, match=r"^--clip-high must be finite and >= 0, got -0.5$"):
        Settings(loss="ppo", clip_high=-0.5).run_config()


def test_rs_with_a_mixed_reward_is_an_error(tmp_path, capsys):
    with pytest.raises(ConfigError, match="alpha"):
        Settings(loss="rs", alpha=1.0).run_config()
    assert main(["run", "--rounds", "1", "--store", str(tmp_path / "s"), "--alpha", "1"]) == 2
    err = capsys.readouterr().err
    assert "alpha" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_bad_values_name_the_setting():
    with pytest.raises(ConfigError, match="normalize"):
        Settings(normalize="minmax")
    with pytest.raises(ConfigError, match="strategies"):
        Settings(strategies="iid")
    with pytest.raises(ConfigError, match="no option"):
        RunConfig(strategy_options={"feedback": {"first_atempt": "skip"}})
    with pytest.raises(ConfigError, match="strategy_options"):
        RunConfig(strategy_options={"beam": {}})


def test_strategy_options_reach_the_strategies(tmp_path):
    from pipeline.run.context import RoundContext

    config = Settings(feedback_first_attempt="skip", feedback_train_context="attempt").run_config()
    ctx = RoundContext(tmp_path, config)
    feedback = ctx.strategy_objects()["feedback"]
    assert (feedback.first_attempt, feedback.train_context) == ("skip", "attempt")


def test_strategy_weights_reach_the_view():
    assert Settings().run_config().view.strategy_weights is None
    view = cli_settings("--strategies", "iid", "tree", "--strategy-weights", "iid=3", "tree=1").run_config().view
    assert dict(view.strategy_weights) == {"iid": 3.0, "tree": 1.0}
    # a strategy of the run without a weight is refused when the config is built, not at the view stage mid-round
    with pytest.raises(ConfigError, match=r"^--strategy-weights has no weight for strategy \['prompt_aug', 'feedback'\] of --strategies"):
        cli_settings("--strategy-weights", "iid=3", "tree=1").run_config()
    assert cli_settings("--strategy-weights", "iid=3", "tree=1", "feedback=1", "--hinted-rows", "drop").run_config().view.drop_strategies == ("prompt_aug",)
    with pytest.raises(ConfigError, match="STRATEGY=WEIGHT"):
        cli_settings("--strategy-weights", "iid").run_config()


def test_hinted_rows_setting():
    from pipeline.config.loss import RatioConfig

    assert Settings().run_config().train.loss.ratio_for("prompt_aug").mode == "mask"
    assert Settings(hinted_rows="truncate").run_config().train.loss.ratio_for("prompt_aug") == RatioConfig(mode="truncate")
    assert Settings(hinted_rows="none").run_config().train.loss.ratio_for("iid").mode == "mask"
    dropped = Settings(hinted_rows="drop").run_config()
    assert dropped.view.drop_strategies == ("prompt_aug",) and "prompt_aug" in dropped.strategies


def test_every_ablation_variant_is_a_valid_run():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ablation", Path(__file__).resolve().parents[1] / "scripts" / "ablation.py")
    ablation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablation)
    assert {"rs", "ppo", "is", "sft", "ppo-drmas", "ppo-grpo"} <= set(ablation.VARIANTS)
    for name, flags in ablation.VARIANTS.items():
        config = cli_settings(*flags).run_config()
        assert config.problems == 128, name


def test_relabel_verdicts_is_an_rs_setting():
    assert Settings(relabel_verdicts=True).view_config().relabel_verdicts
    with pytest.raises(ConfigError, match=r"^--relabel-verdicts trains Verifier rows .* of --loss ppo: use it with --loss rs$"):
        Settings(relabel_verdicts=True, loss="ppo").run_config()


# -- completion budgets and prompt files ------------------------------------------------------
GSM8K_SAMPLE = "tests/data/gsm8k/train_sample.jsonl"


@dataclasses.dataclass
class _BudgetSampler:
    """Answers "7" to everything and records the budget of every call."""

    budgets: list = dataclasses.field(default_factory=list)
    prompts: list = dataclasses.field(default_factory=list)
    engine: str = "fake"
    model_dir: object = None
    model_version: str = "fake-v0"

    def __post_init__(self):
        from tests.fakes import FakeTokenizer

        self.tokenizer = FakeTokenizer()

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        from pipeline.types import Sample

        self.budgets.append(max_tokens)
        self.prompts.extend(self.tokenizer.decode(p) for p in prompt_ids)
        return [[Sample(token_ids=[ord("7"), 0], logprobs=[-0.5, -0.1], text="7", finish_reason="stop") for _ in range(n)] for _ in prompt_ids]

    def load_checkpoint(self, model_dir):
        self.model_dir = model_dir

    def close(self):
        pass


def _context(tmp_path, model_dir, **settings):
    from pipeline.engines.pool import EnginePool
    from pipeline.run.context import RoundContext

    sampler = _BudgetSampler()

    class Pool(EnginePool):
        def get(self, policy_id, path):
            return sampler

    values = dict(problems=2, samples=2, strategies=("iid",), eval_problems=2, eval_samples=1, model_dir=str(model_dir))
    values.update(settings)
    return RoundContext(tmp_path, Settings(**values).run_config(), Pool("hf")), sampler


def test_budgets_are_the_tasks_unless_set():
    from pipeline.tasks import budget_of, load_task_file, make_task

    assert Settings().max_tokens is None and Settings().eval_max_tokens is None and RunConfig().max_tokens is None
    arithmetic, gsm8k = make_task("arithmetic"), load_task_file(GSM8K_SAMPLE)
    assert (budget_of(arithmetic, None), budget_of(arithmetic, None, "eval")) == (16, 16)
    assert (budget_of(gsm8k, None), budget_of(gsm8k, None, "eval")) == (512, 512)
    assert budget_of(gsm8k, 40) == budget_of(arithmetic, 40, "eval") == 40
    with pytest.raises(ConfigError, match="^--max-tokens must"):
        Settings(max_tokens=0).run_config()
    with pytest.raises(ConfigError, match="^--eval-max-tokens must"):
        Settings(eval_max_tokens=0).run_config()


@pytest.mark.parametrize(
    "settings, rollout_budget, eval_budget",
    [({}, 16, 16), ({"task_file": GSM8K_SAMPLE}, 512, 512), ({"max_tokens": 24}, 24, 16), ({"task_file": GSM8K_SAMPLE, "eval_max_tokens": 300}, 512, 300)],
    ids=["arithmetic", "file", "max_tokens", "eval_max_tokens"],
)
def test_budgets_reach_the_rollout_and_evaluation_stages(tmp_path, tiny_model_dir, settings, rollout_budget, eval_budget):
    from pipeline.run.rounds import stage_evaluation, stage_problems, stage_rollouts
    from pipeline.store import BASE_ROUND

    ctx, sampler = _context(tmp_path, tiny_model_dir, **settings)
    stage_rollouts(ctx, 0, stage_problems(ctx, 0))
    assert set(sampler.budgets) == {rollout_budget}
    sampler.budgets.clear()
    stage_evaluation(ctx, BASE_ROUND)
    assert set(sampler.budgets) == {eval_budget}


def test_prompt_file_reaches_the_stages_and_the_cli(tmp_path, tiny_model_dir):
    from pipeline.run.rounds import stage_problems, stage_rollouts

    prompt = tmp_path / "prompts.toml"
    prompt.write_text('user = "Q: {question}\\nThink, then answer."\n')
    ctx, sampler = _context(tmp_path / "store", tiny_model_dir, prompt_file=str(prompt))
    assert ctx.config.prompt_file == str(prompt)
    problems = stage_problems(ctx, 0)
    stage_rollouts(ctx, 0, problems)
    question = problems["question"][0]
    assert any(f"Q: {question}\nThink, then answer." in p for p in sampler.prompts)
    assert dagster_settings(Settings(prompt_file=str(prompt))).run_config().prompt_file == str(prompt)
    args = build_parser().parse_args(["rollout", "--store", "x", "--prompt-file", str(prompt), "--max-tokens", "9"])
    assert settings_from_args(args).run_config().prompt_file == str(prompt) and settings_from_args(args).max_tokens == 9


def test_a_bad_prompt_file_stops_run_and_rollout_before_anything_is_written(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('usr = "{question}"\n')
    for argv in (["run", "--rounds", "1"], ["rollout"]):
        store = tmp_path / argv[0]
        assert main([*argv, "--store", str(store), "--prompt-file", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "prompt_file" in err and "bad.toml" in err and "'usr'" in err
        assert not store.exists()


def test_help_renders_and_lists_every_setting(capsys):
    """`maxit run --help` renders (help texts may hold a literal "%") and names every setting's
    flag; `maxit rollout --help` renders too."""
    from dataclasses import fields

    for command in ("run", "rollout"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0, command
        out = capsys.readouterr().out
        assert "--problems" in out and "Traceback" not in out
        if command == "run":
            # a boolean set off by a flag of its own (`--separate-policies`) is listed by that flag
            flags = [f.metadata["negative_flag"][0] if f.metadata.get("negative_flag") else "--" + f.name.replace("_", "-") for f in fields(Settings)]
            missing = sorted(f for f in flags if f not in out)
            assert not missing and "--separate-policies" in flags and "--no-base-eval-cache" in flags and "30% more time" in out, missing


def test_zero_advantage_rows_keep_or_drop_the_views_zero_advantage_rows():
    from pipeline.run.settings import Settings

    assert Settings(loss="ppo").view_config().drop_zero_advantage is True
    assert Settings(loss="ppo", zero_advantage_rows="keep").view_config().drop_zero_advantage is False
    assert Settings(algorithm="grpo").view_config().drop_zero_advantage is False  # its source counts every sample
    assert Settings(algorithm="grpo", zero_advantage_rows="drop").view_config().drop_zero_advantage is True
    assert Settings(zero_advantage_rows="drop").view_config().drop_zero_advantage is True
    assert Settings().view_config().drop_zero_advantage is False  # rs keeps its rewarded rows as before


def test_a_bad_value_is_named_by_its_flag_where_the_config_field_is_a_setting():
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^--problems must be an integer >= 1, got -3$"):
        Settings(problems=-3).run_config()
    with pytest.raises(ConfigError, match=r"^--eval-problems must be an integer >= 1, got 0$"):
        Settings(eval_problems=0).run_config()
    from pipeline.run.settings import flag_named

    assert flag_named("RolloutConfig.max_tokens must be >= 1") == "RolloutConfig.max_tokens must be >= 1"
    assert flag_named("RunConfig.no_such_field is wrong") == "RunConfig.no_such_field is wrong"


_OWN_DEFAULTS = '''
from dataclasses import dataclass
from typing import ClassVar
from pipeline.workflows import Workflow

@dataclass
class Budgeted(Workflow):
    name: ClassVar[str] = "budgeted"
    run_defaults: ClassVar[dict] = {"problems": 7, "eval_problems": 9}

@dataclass
class Greedy(Workflow):
    name: ClassVar[str] = "greedy"
    run_defaults: ClassVar[dict] = {"problems": 7, "loss": "ppo", "nonsense": 1}

@dataclass
class Broken(Workflow):
    name: ClassVar[str] = "broken"
    run_defaults: ClassVar[object] = ["problems"]
'''


def test_a_workflow_s_own_defaults_fill_the_flags_left_alone(tmp_path):
    """`Workflow.run_defaults` fills the settings the command line leaves unset, below any flag
    given; the algorithm's settings are not the workflow's to default; Python's Settings take
    what they are given."""
    file = tmp_path / "own.py"
    file.write_text(_OWN_DEFAULTS)
    spec = f"{file}:Budgeted"
    own = cli_settings("--workflow", spec)
    assert (own.problems, own.eval_problems) == (7, 9)
    given = cli_settings("--workflow", spec, "--problems", "3")
    assert (given.problems, given.eval_problems) == (3, 9)
    assert Settings(workflow=spec).problems == Settings().problems  # Python: as given
    with pytest.raises(ConfigError, match=r"run_defaults names 'loss', 'nonsense'"):
        cli_settings("--workflow", f"{file}:Greedy")
    with pytest.raises(ConfigError, match=r"workflow .*Broken.*run_defaults must map setting names"):
        cli_settings("--workflow", f"{file}:Broken")
    # the built-in workflows' own defaults: only the game's budget
    from pipeline.run.settings import workflow_defaults
    from pipeline.workflows import WORKFLOW_NAMES

    own = {name: workflow_defaults({"workflow": name}) for name in WORKFLOW_NAMES}
    assert own == {**{name: {} for name in WORKFLOW_NAMES}, "tic_tac_toe": {"problems": 256, "samples": 8}}


def test_maxit_run_says_the_workflow_s_own_defaults(tmp_path, capsys, monkeypatch):
    """`maxit run` names the defaults it took from the workflow (here it stops right after, before
    any round)."""
    file = tmp_path / "own.py"
    file.write_text(_OWN_DEFAULTS)
    import maxit.run_commands as rc

    def stop(*a, **k):
        raise SystemExit(0)

    monkeypatch.setattr(rc, "small_splits", stop)
    monkeypatch.setattr(rc, "check_run_inputs", lambda config, store: (type("W", (), {"describe": lambda self: "budgeted"})(), ("iid",)))
    with pytest.raises(SystemExit):
        main(["run", "--workflow", f"{file}:Budgeted", "--store", str(tmp_path / "s")])
    out = capsys.readouterr()
    assert "the workflow's own defaults: --problems 7, --eval-problems 9" in out.out + out.err
    # maxit rollout says the same; a flag given, even at the default's value, is not the workflow's
    rc.say_own_defaults("maxit rollout", build_parser().parse_args(["rollout", "--store", "s", "--workflow", f"{file}:Budgeted", "--problems", "7"]))
    rc.say_own_defaults("maxit rollout", build_parser().parse_args(["rollout", "--store", "s"]))
    out = capsys.readouterr()
    assert (out.out + out.err).strip().splitlines() == ["maxit rollout: the workflow's own defaults: --eval-problems 9 (a flag given overrides them)"]


def test_a_store_recorded_before_the_settings_were_made_from_the_tree_loads_as_the_same_run():
    """tests/data/experiment_6669ec1.json is the record of a store that `maxit run` made at 6669ec1,
    when `Settings` declared its fields by hand: every name it holds is a setting still, with its
    value written the same way, and it makes the same run."""
    import json
    from dataclasses import fields
    from pathlib import Path

    from pipeline.run.experiment_record import stored_settings
    from pipeline.store.files import jsonable

    record = json.loads((Path(__file__).parent / "data" / "experiment_6669ec1.json").read_text())
    settings = stored_settings(record)
    assert sorted(record["settings"]) == sorted(f.name for f in fields(Settings))
    assert jsonable(settings) == record["settings"] and jsonable(settings.preset_values()) == record["effective"]
    as_given = {k: tuple(v) if isinstance(v, list) else v for k, v in record["settings"].items()}
    assert settings.run_config() == RunConfig.for_algorithm(**as_given) == RunConfig()
