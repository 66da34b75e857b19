"""The workflow API: loading by name/path, the contract checks, guarded user code, the team of
one, and the tutorial's team of three (examples/relay.py) end to end."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from fakes import FakeSampler, FakeTask, FakeTokenizer
from pipeline.rollout.agent import Agent
from pipeline.errors import ConfigError
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Feedback, PromptAug, Tree
from pipeline.types import Problem, Sample
from pipeline.workflows import Env, StepResult, Workflow, load_workflow
from pipeline.workflows.math import MathWorkflow, SingleWorkflow

ROOT = Path(__file__).resolve().parents[1]
RELAY = ROOT / "examples" / "relay.py"


class Echo:
    """A sampler that answers every prompt with `reply(prompt text, sample index, call index)`."""

    engine = "scripted"
    model_version = "scripted-v0"

    def __init__(self, reply=lambda prompt, j, call: "7") -> None:
        self.tokenizer = FakeTokenizer()
        self.reply = reply
        self.calls = 0

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        out = []
        for prompt in prompt_ids:
            text = self.tokenizer.decode(prompt)
            row = []
            for j in range(n):
                said = self.reply(text, j, self.calls)
                ids = self.tokenizer.encode(said)
                row.append(Sample(token_ids=ids, logprobs=[-0.1] * len(ids), text=said, finish_reason="stop"))
            out.append(row)
        self.calls += 1
        return out


def relay():
    return load_workflow(f"{RELAY}:Relay")


def last_sum(prompt: str) -> int:
    """The right answer of the relay's last "x+y=" question in a prompt."""
    import re

    x, y = re.findall(r"(-?\d+)\+(-?\d+)=", prompt)[-1]
    return int(x) + int(y)


def test_the_tutorial_relay_runs_its_team_of_three_with_local_and_team_rewards():
    wf = relay()
    problems = wf.problems("train", 4, 0)
    # the engine is called once per agent step (a group's identical prompts are one request):
    # call 1 is `second`, who errs by one; first's and third's local rewards stay 1, the team fails
    sampler = Echo(lambda prompt, j, call: str(last_sum(prompt) + (call == 1)))
    steps = pl.from_arrow(run_rollouts(problems, wf, [IID(group_size=2)], sampler, RolloutConfig()))
    assert steps.height == 4 * 2 * 3
    assert steps.group_by("traj_uid", maintain_order=True).agg(pl.col("agent_id"))["agent_id"].to_list()[0] == ["first", "second", "third"]
    local = dict(steps.group_by("agent_id").agg(pl.col("local_reward").mean()).iter_rows())
    assert local == {"first": 1.0, "second": 0.0, "third": 1.0}
    assert steps["global_reward"].to_list() == [0.0] * steps.height
    # without the mistake the team succeeds
    steps = pl.from_arrow(run_rollouts(problems, wf, [IID(group_size=2)], Echo(lambda p, j, c: str(last_sum(p))), RolloutConfig()))
    assert steps["global_reward"].to_list() == [1.0] * steps.height


def test_tree_copies_the_selected_branchs_state_to_every_branch():
    wf = relay()
    problems = wf.problems("train", 2, 0)
    # candidate 2 of every node is right, the others wrong: the next agent is handed candidate 2's number
    sampler = Echo(lambda prompt, j, call: str(last_sum(prompt) + (0 if j == 2 else 5)))
    steps = pl.from_arrow(run_rollouts(problems, wf, [Tree(group_size=3)], sampler, RolloutConfig(alpha=1.0)))
    assert steps.height == 2 * 3 * 3
    selected = steps.filter(pl.col("selected"))
    assert selected["sample_idx"].to_list() == [2] * selected.height
    later = steps.filter(pl.col("agent_id") == "second")
    for row in later.iter_rows(named=True):
        parent = steps.filter(pl.col("step_id") == row["parent_node_id"]).row(0, named=True)
        assert parent["selected"] and parent["completion_text"] in row["sampling_messages"][-1]["content"]
    assert steps.filter(pl.col("agent_id") == "third", pl.col("selected"))["global_reward"].to_list() == [1.0, 1.0]


class Broken(Workflow):
    """A workflow whose `step` misbehaves on some problems."""

    name = "broken"
    agents = (Agent("a"), Agent("b"))

    def __init__(self, how: str) -> None:
        self.how = how

    def problems(self, split, n, seed):
        return [Problem(uid=f"p{i}", question=str(i), answer=str(i), split=split) for i in range(n)]

    def reset(self, problem, strategy):
        return BrokenEnv(self.how, problem)


@dataclass
class BrokenEnv(Env):
    how: str
    problem: Problem

    def observe(self, agent_id):
        if self.how == "observe" and self.problem.uid == "p1":
            return "not messages"
        return [{"role": "user", "content": f"{agent_id}: {self.problem.question}"}]

    def step(self, agent_id, text):
        if self.problem.uid == "p1" and agent_id == "b":
            if self.how == "raise":
                raise RuntimeError("the environment broke")
            if self.how == "nan":
                return StepResult(reward=float("nan"))
            if self.how == "type":
                return {"reward": 1.0}
        return StepResult(reward=1.0)

    def team_reward(self):
        return 1.0


@pytest.mark.parametrize(
    "how, message",
    [
        ("raise", "step('b'): RuntimeError: the environment broke"),
        ("nan", "step('b'): ValueError: step returned nan"),
        ("type", "step('b'): ValueError: step returned dict, expected a StepResult"),
    ],
)
def test_a_step_that_raises_or_returns_nonsense_is_a_named_error_on_its_row(how, message):
    steps = pl.from_arrow(run_rollouts(Broken(how).problems("train", 3, 0), Broken(how), [IID(group_size=2)], Echo(), RolloutConfig(alpha=1.0)))
    bad = steps.filter(pl.col("uid") == "p1", pl.col("agent_id") == "b")
    assert bad.height == 2 and bad["reward"].is_null().all()
    assert bad["reward_error"].str.contains(message, literal=True).all()
    good = steps.filter(pl.col("uid") != "p1")
    assert good["reward"].to_list() == [2.0] * good.height  # alpha 1 + local 1: the round went on


def test_an_observation_that_is_not_chat_messages_ends_only_its_episode():
    wf = Broken("observe")
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 3, 0), wf, [IID(group_size=2)], Echo(), RolloutConfig()))
    assert steps.filter(pl.col("uid") == "p1").height == 0
    assert steps.filter(pl.col("uid") != "p1").height == 2 * 2 * 2


class NoAgents(Workflow):
    name = "empty"

    def problems(self, split, n, seed):
        return []

    def reset(self, problem, strategy):
        return None


class Twins(NoAgents):
    name = "twins"
    agents = (Agent("a"), Agent("a"))


class Lost(NoAgents):
    name = "lost"
    agents = (Agent("a"),)
    turn_order = ("a", "ghost")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_workflow", "unknown workflow 'no_such_workflow'"),
        ("no_such_module_xyz:Thing", "cannot import module 'no_such_module_xyz'"),
        (f"{__name__}:Nothing", "has no 'Nothing'"),
        (f"{__name__}:NoAgents", "workflow 'empty': agents must be a non-empty tuple"),
        (f"{__name__}:Twins", "workflow 'twins': agent ids must be unique; repeated: ['a']"),
        (f"{__name__}:Lost", "workflow 'lost': turn_order names unknown agent(s) ['ghost']"),
        (f"{__name__}:Echo", "expected a pipeline.workflows.Workflow, got Echo"),
    ],
)
def test_a_broken_workflow_is_a_one_line_error_naming_it(spec, message):
    with pytest.raises(ConfigError) as err:
        load_workflow(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_feedback_on_a_workflow_without_it_is_refused_naming_the_workflow():
    with pytest.raises(ConfigError, match="workflow 'relay': does not support the feedback strategy"):
        run_rollouts(relay().problems("train", 1, 0), relay(), [Feedback()], Echo(), RolloutConfig())


SEEN: dict = {}


def relay_of(turns: int = 3, *, label: str = "relay"):
    """A factory function: its parameters are its options."""
    SEEN.update(turns=turns, label=label)
    return relay()


def relay_of_anything(**settings):
    """A factory that takes any keyword: it gets every option and every run setting."""
    SEEN.update(settings)
    return relay()


def test_an_unknown_workflow_option_is_a_one_line_error_naming_it_and_the_options_it_takes():
    with pytest.raises(ConfigError) as err:
        load_workflow(f"{RELAY}:Relay", no_such_option=7)
    assert str(err.value) == f"workflow '{RELAY}:Relay': unknown option 'no_such_option' (it takes no options)"
    with pytest.raises(ConfigError) as err:
        load_workflow("grid", size=5, sise=5, wals=2)
    message = str(err.value)
    assert message.startswith("workflow 'grid': unknown options 'sise', 'wals' (it takes: task_file, max_loop_num, size, walls, ") and "\n" not in message
    with pytest.raises(ConfigError, match=r"^workflow 'math': unknown option 'loops' \(it takes: task, agents, max_loop_num, final_answer, orchestra\)$"):
        load_workflow("math", loops=2)
    with pytest.raises(ConfigError, match=r"unknown option 'turn' \(it takes: turns, label\)$"):
        load_workflow(f"{__name__}:relay_of", turn=2)
    with pytest.raises(ConfigError, match=r"^workflow 'relay': unknown option 'size' \(it takes no options\)$"):
        load_workflow(relay(), size=2)  # a workflow already built takes no option


def test_the_runs_settings_go_only_to_a_workflow_that_takes_them():
    """`task`, `task_file` and `max_loop_num` are offered to every workflow by the run: a
    workflow without such a parameter is built without them; one with it gets it."""
    assert load_workflow(f"{RELAY}:Relay", task=FakeTask(), task_file="tasks.jsonl", max_loop_num=4).name == "relay"
    assert load_workflow("grid", size=5, max_loop_num=7, task=FakeTask()).max_loop_num == 7
    assert load_workflow("math", task=FakeTask(), max_loop_num=3, task_file=None).max_loop_num == 3
    SEEN.clear()
    load_workflow(f"{__name__}:relay_of", turns=5, max_loop_num=2)
    assert SEEN == {"turns": 5, "label": "relay"}
    SEEN.clear()
    load_workflow(f"{__name__}:relay_of_anything", colour="red", max_loop_num=2, task_file=None)
    assert SEEN == {"colour": "red", "max_loop_num": 2}  # None: not set


def test_an_unknown_workflow_option_on_the_command_line_stops_the_run_before_any_work(tmp_path):
    store = tmp_path / "store"
    out = subprocess.run(
        [sys.executable, "-m", "maxit.cli", "run", "--workflow", f"{RELAY}:Relay", "--workflow-options", "no_such_option=7", "--store", str(store)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith("unknown option 'no_such_option' (it takes no options)"), out.stderr[-2000:]
    assert not store.exists() or not any(store.iterdir())


def test_separate_policies_name_each_agents_policy():
    assert load_workflow(f"{RELAY}:Relay", shared_policy=False).policy_ids == ("first", "second", "third")
    assert load_workflow("math", shared_policy=False).policy_ids == ("solver", "verifier")
    assert load_workflow("single").policy_ids == ("shared",)


def test_single_is_the_solver_alone():
    wf = SingleWorkflow(FakeTask())
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 4, 0), wf, [IID(group_size=3), PromptAug(group_size=2), Tree(group_size=2)], FakeSampler(), RolloutConfig()))
    assert set(steps["agent_id"]) == {"solver"}
    assert set(steps["turn"]) == {0}
    # the team reward is the Solver's own correctness
    assert (steps["global_reward"] == steps["local_reward"]).all()
    fb = pl.from_arrow(run_rollouts(wf.problems("train", 2, 0), wf, [Feedback(group_size=2)], FakeSampler(), RolloutConfig()))
    assert sorted(set(fb["turn"])) == [0, 1] and set(fb["agent_id"]) == {"solver"}


def test_math_workflow_refuses_a_team_without_its_roles():
    with pytest.raises(ConfigError, match="workflow 'math' needs one agent per role"):
        MathWorkflow(FakeTask(), agents=(Agent("solver"), Agent("critic")))


def test_the_tutorial_workflow_runs_end_to_end_from_the_command_line(tmp_path, default_model_dir):
    store = tmp_path / "relay"
    out = subprocess.run(
        [sys.executable, "-m", "maxit.cli", "run", "--workflow", f"{RELAY}:Relay", "--rounds", "1", "--problems", "8", "--samples", "2",
         "--eval-problems", "16", "--store", str(store)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    steps = pl.read_parquet(store / "round=0" / "steps.parquet")
    assert set(steps["agent_id"]) == {"first", "second", "third"}
    assert set(steps["strategy"]) == {"iid", "prompt_aug", "tree"}  # the default mix, less feedback
    ev = pl.read_parquet(store / "round=0" / "evaluation.parquet")
    assert {"success", "success_greedy"} <= set(ev.filter(pl.col("agent_id") == "team")["metric"])
    assert set(ev.filter(pl.col("metric") == "reward")["agent_id"]) == {"first", "second", "third"}
    assert "success" in out.stdout and "greedy" in out.stdout


@pytest.mark.parametrize(
    "turns, approved, last",
    [
        # rejected twice: "approved" plays the first answer, "last" the retry nobody approved
        ([("s", "46"), ("v", "45"), ("s", "45"), ("v", "44")], 1.0, 0.0),
        ([("s", "47"), ("v", "46"), ("s", "46"), ("v", "45")], 0.0, 1.0),
        # an approved retry is played under both rules
        ([("s", "47"), ("v", "46"), ("s", "46"), ("v", "46")], 1.0, 1.0),
        ([("s", "46"), ("v", "45"), ("s", "45"), ("v", "45")], 0.0, 0.0),
        # an approved first answer stops the loop
        ([("s", "46"), ("v", "46")], 1.0, 1.0),
    ],
)
def test_the_math_team_plays_its_first_answer_unless_the_verifier_approved_a_retry(turns, approved, last):
    """`final_answer`: the blind Verifier approves when its own sum equals the Solver's (12+34=46)."""
    from pipeline.strategies import IID
    from pipeline.tasks.arithmetic import ArithmeticTask

    for rule, team in (("approved", approved), ("last", last)):
        wf = MathWorkflow(ArithmeticTask(), final_answer=rule)
        env = wf.reset(wf.task.make_problem(12, "+", 34), IID(group_size=1))
        results = [env.step(wf.solver_id if who == "s" else wf.verifier_id, text) for who, text in turns]
        assert results[-1].done
        assert env.team_reward() == team, rule
        assert env.copy().team_reward() == team  # a tree branch keeps what was approved
    with pytest.raises(ConfigError, match=r"^workflow 'math': final_answer must be one of \['approved', 'last'\], got 'first'$"):
        MathWorkflow(ArithmeticTask(), final_answer="first")
