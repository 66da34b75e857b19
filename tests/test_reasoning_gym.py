"""The reasoning-gym workflow: three datasets through it (problems, splits that never share a
question nor a mirrored one, the dataset's own scorer as the reward (full marks or nothing), re-scoring the stored rows), each team played by
a scripted sampler, the tool_plan sandbox on hostile programs, bad datasets and options as one
line, the import guard, offline generation, and `maxit run` end to end on a tiny model."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipeline.errors import ConfigError
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Feedback, Tree
from pipeline.workflows import load_workflow
from pipeline.workflows.reasoning_gym import ReasoningGymTask, answers_agree, extract_answer, import_reasoning_gym
from test_code_workflow import Script as ReplyScript  # a sampler that replies with a function of the messages

ROOT = Path(__file__).resolve().parents[1]
DATASETS = {
    "basic_arithmetic": {"max_terms": 2, "max_digits": 1},
    "number_sequence": {},
    "simple_equations": {},
}


def task_of(name: str) -> ReasoningGymTask:
    return ReasoningGymTask(name, DATASETS[name])


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_problems_splits_and_the_datasets_own_scorer(name):
    task = task_of(name)
    train, heldout = task.problems("train", 120, 0), task.problems("heldout", 40, 0)
    assert [p.uid for p in task.problems("train", 120, 0)] == [p.uid for p in train]  # deterministic in the seed
    assert len({p.question for p in train}) == 120 and len({p.question for p in heldout}) == 40
    assert {p.split for p in train} == {"train"} and {p.split for p in heldout} == {"heldout"}
    assert not {p.question for p in train} & {p.question for p in heldout}
    ds = import_reasoning_gym().create_dataset(name, size=1, seed=0, **DATASETS[name])
    for p in train[:20]:
        entry = task.entry(p)
        ref = entry["answer"]
        assert task.reward(p, ref) == ds.score_answer(ref, entry) == 1.0
        assert task.reward(p, f"<answer>{ref}</answer>") == 1.0
        for wrong in ("", "no idea", ref + "0", "7"):  # full marks or nothing: partial credit is a wrong answer
            assert task.reward(p, wrong) == (1.0 if ds.score_answer(extract_answer(wrong), entry) >= 1.0 else 0.0)
            assert task.score(p, wrong) == ds.score_answer(extract_answer(wrong), entry)
    assert any(task.reward(p, "7") == 0.0 for p in train)


def test_splits_never_share_a_question_whatever_the_seeds():
    """Item i of a dataset is generated from seed + i: datasets of close seeds are shifted copies,
    and basic_arithmetic with one-digit terms has a small space; the split is by question text."""
    task = task_of("basic_arithmetic")
    train = {p.question for s in range(4) for p in task.problems("train", 300, s)}
    heldout = {p.question for s in range(4) for p in task.problems("heldout", 60, s)}
    assert len(train) > 300 and len(heldout) > 60
    assert not train & heldout
    other = ReasoningGymTask("basic_arithmetic", DATASETS["basic_arithmetic"], heldout_fraction=0.5)
    assert {p.split for p in other.problems("train", 50, 0)} == {"train"}


def test_asking_for_more_questions_than_the_space_holds_is_one_line():
    task = ReasoningGymTask("basic_arithmetic", {"max_terms": 2, "max_digits": 1, "operators": "+", "allow_negation": False, "allow_parentheses": False})
    with pytest.raises(ConfigError, match="too few distinct heldout questions for 500"):
        task.problems("heldout", 500, 0)


def test_an_item_slow_to_generate_is_skipped(monkeypatch):
    import time

    from pipeline.workflows.reasoning_gym import datasets

    class Slow:
        def __getitem__(self, i):
            if i == 1:
                while True:
                    time.sleep(0.01)
            return {"question": f"q{i}", "answer": "1", "metadata": {}}

    monkeypatch.setattr(datasets, "ITEM_SECONDS", 0.2)
    assert [datasets._generate(Slow(), i) for i in range(3)] == [{"question": "q0", "answer": "1", "metadata": {}}, None,
                                                                 {"question": "q2", "answer": "1", "metadata": {}}]


# -- playing the teams ------------------------------------------------------------------------


class Script(ReplyScript):
    """Plays every role from the prompt text: the Solver right on even samples and wrong on odd
    ones, the blind Verifier always right, the tool a program that prints the answer (or a
    hostile one from `programs`), the plan agent the program's last line."""

    def __init__(self, answers: dict[str, str], programs: dict[int, str] | None = None) -> None:
        super().__init__(self.answer)
        self.answers, self.programs = answers, programs or {}

    def answer(self, msgs, j: int) -> str:
        last = msgs[-1][1]
        question = next(q for q in sorted(self.answers, key=len, reverse=True) if last.startswith(q) or msgs[0][1].startswith(q))
        ref = self.answers[question]
        if last.endswith("Check it: work it out again."):
            return ref
        if last.endswith("prints the answer on its last line."):
            return self.programs.get(j, f"```python\nprint('working')\nprint({ref!r})\n```")
        if "A program written to solve it printed:" in last:
            return last.split("printed:\n", 1)[1].rsplit("\nGive the answer alone.", 1)[0].splitlines()[-1]
        return ref if j % 2 == 0 else ref + "1"


def play(name: str, team: str, strategies, n: int = 4, programs=None, **options):
    wf = load_workflow("reasoning_gym", dataset=name, team=team, max_loop_num=2, **DATASETS[name], **options)
    problems = wf.problems("train", n, 0)
    sampler = Script({p.question: wf.task.reference(p) for p in problems}, programs)
    steps = pl.from_arrow(run_rollouts(problems, wf, strategies, sampler, RolloutConfig(round=0)))
    from pipeline.run.problems import problems_table

    return wf, steps, problems_table(problems, 0)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_solver_verifier_rewards_are_the_scorer_and_rescoring_the_stored_rows_gives_them(name):
    wf, steps, problems = play(name, "solver_verifier", [IID(group_size=2), Tree(group_size=2), Feedback(group_size=2)])
    assert set(steps["agent_id"]) == {"solver", "verifier"}
    solver = steps.filter(pl.col("agent_id") == "solver")
    right = solver.filter(pl.col("sample_idx") == 0).filter(pl.col("strategy") == "iid")
    assert (right["local_reward"] == 1.0).all()
    wrong = solver.filter((pl.col("strategy") == "iid") & (pl.col("sample_idx") == 1) & (pl.col("turn") == 0))
    assert (wrong["local_reward"] < 1.0).all()
    # the blind Verifier works it out right: it approves the right answers, rejects the wrong ones
    verdicts = steps.filter((pl.col("agent_id") == "verifier") & (pl.col("strategy") == "iid") & (pl.col("turn") == 0))
    assert verdicts.sort("traj_uid")["verdict"].to_list() == [True, False] * (verdicts.height // 2)
    again = wf.rescore(steps, problems)
    assert again.height == solver.height
    assert again["rescored"].to_list() == again["local_reward"].to_list()


@pytest.mark.parametrize("team", ["single", "solver_verifier"])
def test_each_answering_team_on_number_sequence(team):
    wf, steps, problems = play("number_sequence", team, [IID(group_size=2)])
    assert set(steps["agent_id"]) == ({"solver"} if team == "single" else {"solver", "verifier"})
    if team == "single":
        assert (steps["global_reward"] == steps["local_reward"]).all()
    again = wf.rescore(steps, problems)
    assert again["rescored"].to_list() == again["local_reward"].to_list()
    bad = problems.with_columns(pl.col("answer").str.replace('"answer": "', '"answer": "9'))  # a tampered stored entry
    assert wf.rescore(steps, bad)["rescored"].to_list() != again["local_reward"].to_list()


def test_a_scorer_that_reads_the_entrys_metadata_rescores_from_the_stored_rows():
    """number_sorting's scorer reads the sort direction from the entry's metadata: the stored
    answer column must carry it."""
    DATASETS["number_sorting"] = {}
    try:
        wf, steps, problems = play("number_sorting", "single", [IID(group_size=2)], n=3)
    finally:
        del DATASETS["number_sorting"]
    assert all("direction" in json.loads(a)["metadata"] for a in problems["answer"])
    assert steps.filter(pl.col("sample_idx") == 0)["local_reward"].to_list() == [1.0] * 3
    again = wf.rescore(steps, problems)
    assert again["rescored"].to_list() == again["local_reward"].to_list()


@pytest.mark.integration
def test_tool_plan_runs_the_tools_program_in_the_sandbox_and_survives_hostile_ones():
    programs = {
        1: "```python\nwhile True:\n    pass\n```",
        2: "```python\nprint('x' * 10_000_000)\n```",
        3: "```python\nimport os\nos._exit(3)\n```",
    }
    wf, steps, problems = play("simple_equations", "tool_plan", [IID(group_size=4)], n=2, programs=programs, sandbox_timeout=1.0)
    assert set(steps["agent_id"]) == {"tool", "planner"}
    tool = steps.filter(pl.col("agent_id") == "tool").sort("traj_uid")
    plan = steps.filter(pl.col("agent_id") == "planner").sort("traj_uid")
    assert tool["local_reward"].to_list() == [1.0, 0.0, 0.0, 0.0] * 2  # only the honest program printed the answer
    assert (plan.filter(pl.col("sample_idx") == 0)["local_reward"] == 1.0).all()
    assert (plan["global_reward"] == plan["local_reward"]).all()
    shown = [m[-1]["content"] for m in plan.filter(pl.col("sample_idx") == 1)["sampling_messages"].to_list()]
    assert all("timeout" in s for s in shown), shown
    long = [m[-1]["content"] for m in plan.filter(pl.col("sample_idx") == 2)["sampling_messages"].to_list()]
    assert all(len(s) < 600 for s in long)
    again = wf.rescore(steps, problems)
    assert again["rescored"].to_list() == again["local_reward"].to_list()


def test_reading_answers():
    assert extract_answer("  42 \n") == "42"
    assert extract_answer("think <answer>1</answer> then <answer> 7 </answer>") == "7"
    assert answers_agree("42", " 42.0") and answers_agree("<answer>abc</answer>", "abc")
    assert not answers_agree("42", "43") and not answers_agree("", "")


# -- bad input, the import guard, offline -----------------------------------------------------


@pytest.mark.parametrize(
    "options, said",
    [
        ({"dataset": "no_such_set"}, r"unknown dataset 'no_such_set'; the datasets are: .*basic_arithmetic, .*number_sequence"),
        ({}, r"needs a dataset: --workflow-options dataset=NAME; the datasets are: .*simple_equations"),
        ({"dataset": "basic_arithmetic", "bogus": 1}, r"dataset 'basic_arithmetic' has no option 'bogus' \(it takes: min_terms, max_terms, .*format_style"),
        ({"dataset": "basic_arithmetic", "max_terms": 0}, r"refused its options .*max_terms must be >= min_terms"),
        ({"dataset": "basic_arithmetic", "team": "trio"}, r"team must be one of \['single', 'solver_verifier', 'tool_plan'\]"),
        ({"dataset": "basic_arithmetic", "task_file": "x.jsonl"}, r"takes no task file"),
    ],
)
def test_a_bad_dataset_or_option_is_one_line_listing_what_exists(options, said):
    with pytest.raises(ConfigError) as err:
        load_workflow("reasoning_gym", **options)
    assert re.search(said, str(err.value)) and "\n" not in str(err.value), str(err.value)


def test_list_options_are_given_as_commas():
    task = ReasoningGymTask("basic_arithmetic", {"max_terms": 2, "max_digits": 1, "operators": "+,-"})
    assert task.options["operators"] == ("+", "-") or task.options["operators"] == ["+", "-"]
    assert all("*" not in p.question and "/" not in p.question for p in task.problems("train", 30, 0))


@pytest.mark.integration
def test_the_command_line_says_a_bad_dataset_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "maxit.cli", "run", "--workflow", "reasoning_gym", "--workflow-options", "dataset=nope", "--store", str(tmp_path / "s")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "unknown dataset 'nope'; the datasets are: " in lines[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_only_the_adapter_imports_reasoning_gym_and_without_the_extra_it_names_it(monkeypatch):
    package = ROOT / "pipeline" / "workflows" / "reasoning_gym"
    for path in (ROOT / "pipeline").rglob("*.py"):
        if package not in path.parents:
            assert not re.search(r"^\s*(import|from)\s+reasoning_gym\b", path.read_text(), re.M), path
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"needs the 'envs' extra \(reasoning-gym\): pip install -e \.\[envs\] \(scripts/setup\.sh installs it\)"):
        load_workflow("reasoning_gym", dataset="basic_arithmetic")


def test_generating_and_scoring_need_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in DATASETS:
        task = task_of(name)
        p = task.problems("heldout", 5, 123)[0]
        assert task.reward(p, json.loads(p.answer)["answer"]) == 1.0


# -- end to end -------------------------------------------------------------------------------


def test_maxit_run_one_round_on_a_tiny_model(tmp_path, tiny_model_dir):
    store = tmp_path / "rg"
    out = subprocess.run(
        [sys.executable, "-m", "maxit.cli", "run", "--workflow", "reasoning_gym", "--workflow-options", "dataset=basic_arithmetic", "max_terms=2",
         "max_digits=1", "--rounds", "1", "--problems", "6", "--samples", "2", "--strategies", "iid", "--eval-problems", "8", "--eval-samples", "1",
         "--epochs", "1", "--engine", "hf",
         "--model-dir", str(tiny_model_dir), "--store", str(store)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    steps = pl.read_parquet(store / "round=0" / "steps.parquet")
    problems = pl.read_parquet(store / "round=0" / "problems.parquet")
    assert set(steps["agent_id"]) == {"solver", "verifier"}
    wf = load_workflow("reasoning_gym", dataset="basic_arithmetic", max_terms=2, max_digits=1)
    again = wf.rescore(steps, problems)
    assert again["rescored"].to_list() == again["local_reward"].to_list()
    ev = pl.read_parquet(store / "round=0" / "evaluation.parquet")
    assert "accuracy" in set(ev.filter(pl.col("agent_id") == "solver")["metric"])


# -- the embedded model -----------------------------------------------------------------------


def test_the_embedded_model_starts_from_the_math_model_and_its_key_names_that_model(tmp_path, tiny_model_dir):
    import torch

    from pipeline.models import load_model
    from pipeline.models.build import ModelConfig, settings_key
    from pipeline.workflows.reasoning_gym.model import RGWarmStartConfig, build_settings, initial_model

    config, model_config = RGWarmStartConfig(), ModelConfig(seed=0)
    _, started = initial_model(config, model_config, tmp_path / "math", tiny_model_dir, log=lambda _: None)
    source = load_model(tiny_model_dir).state_dict()
    assert all(torch.equal(t, source[k]) for k, t in started.state_dict().items())
    _, fresh = initial_model(RGWarmStartConfig(init="random"), model_config, tmp_path / "random", None, log=lambda _: None)
    assert not all(torch.equal(t, source[k]) for k, t in fresh.state_dict().items())

    task = task_of("basic_arithmetic")
    keys = {settings_key(build_settings(task, config, model_config, Path(name))) for name in ("default-aaa", "default-bbb")}
    keys.add(settings_key(build_settings(task, RGWarmStartConfig(init="random"), model_config, None)))
    assert len(keys) == 3
    with pytest.raises(ConfigError, match="init must be one of"):
        RGWarmStartConfig(init="math-model")


def test_the_teams_single_agent_is_the_solver_on_the_same_dataset_and_model():
    # the trained single agent (`maxit baselines --trained-single`) starts from the single agent's
    # default model: the dataset's embedded model, not the math workflow's
    from pipeline.run.arms import single_workflow
    from pipeline.workflows.reasoning_gym import SingleSolver

    team = load_workflow("reasoning_gym", dataset="basic_arithmetic")
    single = single_workflow("reasoning_gym", dataset="basic_arithmetic")
    assert isinstance(team.single_agent(), SingleSolver) and isinstance(single, SingleSolver)
    assert single.task.dataset == "basic_arithmetic" and [a.agent_id for a in single.agents] == [team.solver_id]
    assert type(single).default_model is type(team).default_model
