"""The plan_path workflow (a tool agent whose path the environment runs, a plan agent that reads
the call and its output and commits): the executor on hand-made mazes and hostile text, what
the plan agent sees, rewards and episode ends, the single agent, the engine's rollouts and
evaluation metrics, and the embedded model's build. Engine-free: a scripted sampler plays from the
prompt text."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from pipeline.errors import ConfigError
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, PromptAug, Tree
from pipeline.types import Sample
from pipeline.workflows import load_workflow
from pipeline.workflows.grid.game import parse_puzzle
from pipeline.workflows.plan_path import PLAN, TOOL, PlanPathEnv, PlanPathWorkflow, plan_text, read_path, run_path, tool_text
from pipeline.workflows.plan_path.game import parse_plan_text
from tests.fakes import FakeTokenizer, ROLE_MARK

# A at (0,0), G at (0,3), a wall at (0,2): the shortest path goes down and around (5 moves: DRRRU)
MAZE = "A.#G\n....\n.#..\n...."


def test_executor_walls_goal_end():
    p = parse_puzzle(MAZE)
    start = p.start
    assert run_path(p, start, "DRRRU") == run_path(p, start, " DRRRU\n")
    t = run_path(p, start, "DRRRU")
    assert (t.output, t.reached, t.end, t.ran) == ("goal 5", True, (0, 3), "DRRRU")
    t = run_path(p, start, "DRRRUDD")  # stops at the goal: the letters after it are not run
    assert (t.output, t.reached, t.end, t.ran) == ("goal 5", True, (0, 3), "DRRRU")
    t = run_path(p, start, "RR")  # move 2 runs into the wall at (0,2)
    assert (t.output, t.reached, t.end, t.ran) == ("wall 2", False, (0, 1), "R")
    t = run_path(p, start, "U")  # off the grid
    assert (t.output, t.reached, t.end, t.ran) == ("wall 1", False, start, "")
    t = run_path(p, start, "DDR")  # move 3 runs into the wall at (2,1)
    assert (t.output, t.reached, t.end, t.ran) == ("wall 3", False, (2, 0), "DD")
    t = run_path(p, start, "DDDR")  # every move ran, off the goal
    assert (t.output, t.reached, t.end, t.ran) == ("end 4", False, (3, 1), "DDDR")
    # from another position
    t = run_path(p, (3, 3), "UUU")
    assert (t.output, t.reached, t.end) == ("goal 3", True, (0, 3))


@pytest.mark.parametrize("text", ["", "   ", "x", "r", "R D", "R\nD", "UDLRUDLRUDLRU", "RR" * 1000, "→", "\x00", "<answer>R</answer>",
                                  None, 7, b"R", ["R"], float("nan")])
def test_executor_bad_calls_give_an_error_output(text):
    p = parse_puzzle(MAZE)
    t = run_path(p, p.start, text)
    assert (t.moves, t.output, t.reached, t.end, t.ran) == (None, "bad", False, p.start, "")
    assert read_path(text) is None


def test_random_text_never_raises():
    p = parse_puzzle(MAZE)
    rng = random.Random(0)
    alphabet = "UDLRudlr \n\t#.GA0123456789?!\x00é"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        t = run_path(p, p.start, text)
        assert t.output == "bad" or t.output.split()[0] in ("goal", "wall", "end")


def test_plan_agent_sees_the_call_and_its_output_and_commits():
    p = parse_puzzle(MAZE)
    env = PlanPathEnv(p, turns=2)
    assert env.observe(TOOL)[0]["content"] == tool_text(p, p.start) == "path\n" + MAZE
    r = env.step(TOOL, "RR")
    assert r.reward == 0.0 and not r.done
    assert env.pos == p.start  # a trial does not move the team
    seen = env.observe(PLAN)[0]["content"]
    assert seen == "plan\n" + MAZE + "\ncall RR\nwall 2" == plan_text(p, p.start, run_path(p, p.start, "RR"))
    assert parse_plan_text(seen) == ("RR", "wall 2")
    twin = env.copy()
    r = env.step(PLAN, "DRR")  # the commit runs for real: the team stands at (1,2)
    assert r.reward == 0.0 and not r.done and env.pos == (1, 2) and env.turn == 1 and env.path == "DRR"
    assert twin.pos == p.start and twin.turn == 0 and "call RR" in twin.observe(PLAN)[0]["content"]
    # turn 2 from where the commit left the team; a bad call is shown as "?" with output "bad"
    assert env.observe(TOOL)[0]["content"] == tool_text(p, (1, 2))
    assert env.step(TOOL, "go right!").reward == 0.0
    assert env.observe(PLAN)[0]["content"].endswith("\ncall ?\nbad")
    r = env.step(PLAN, "RU")
    assert r.reward == 1.0 and r.done and env.team_reward() == 1.0 and env.path == "DRRRU"
    assert twin.team_reward() == 0.0


def test_rewards_and_episode_end():
    p = parse_puzzle(MAZE)
    env = PlanPathEnv(p, turns=2)
    for call, reward in (("RR", 0.0), ("DRRR", 0.0), ("DRRRUL", 1.0), ("nope", 0.0), ("DRRRU", 1.0)):
        assert env.step(TOOL, call).reward == reward and env.pos == p.start  # a trial never moves the team
    assert "call DRRRU\ngoal 5" in env.observe(PLAN)[0]["content"]
    r = env.step(PLAN, "UU")  # ignoring a verified call: off the grid, no move, a turn spent
    assert r.reward == 0.0 and not r.done and env.pos == p.start
    env.step(TOOL, "DRRRU")
    r = env.step(PLAN, "D")
    assert r.done and r.reward == 0.0 and env.team_reward() == 0.0  # the last turn is spent
    # the single agent commits directly, one call a turn, from the tool's prompt
    env = PlanPathEnv(p, turns=1, single=True)
    assert env.observe(PLAN) == env.observe(TOOL)
    r = env.step(PLAN, "DRRRU")
    assert r.reward == 1.0 and r.done and env.team_reward() == 1.0


def test_single_agent_is_one_agent_without_the_tool():
    wf = PlanPathWorkflow()
    assert wf.turn_order == (TOOL, PLAN) and wf.max_turns == 2
    solo = wf.single_agent()
    assert len(solo.agents) == 1 and solo.turn_order == (PLAN,) and solo.agents[0] == wf.agents[1]
    assert solo.max_turns == wf.max_turns and solo.problems("heldout", 5, 0) == wf.problems("heldout", 5, 0)
    assert wf.turn_order == (TOOL, PLAN) and len(wf.agents) == 2  # the team is left as it was
    env = solo.reset(solo.problems("train", 1, 0)[0], IID())
    assert env.observe(PLAN)[0]["content"].startswith("path\n")
    assert {m for _, m, _ in solo.table_metrics} == {"success", "success_greedy", "reward"}
    assert load_workflow("plan_path", team="single").turn_order == (PLAN,)
    assert load_workflow("plan_path", shared_policy=False).single_agent().policy_ids == (PLAN,)
    assert solo.answer_key(PLAN, " DR ") == "DR" and solo.answer_key(PLAN, "go") is None


def test_options_and_problems():
    wf = load_workflow("plan_path")
    a = wf.problems("train", 30, 4)
    assert a == wf.problems("train", 30, 4) and len({p.uid for p in a}) == 30
    held = wf.problems("heldout", 100, 1)
    assert {p.question for p in a}.isdisjoint(p.question for p in held)
    for prob in a:
        assert 2 <= parse_puzzle(prob.question).shortest <= 6 and prob.hint
    assert load_workflow("plan_path", max_loop_num=3).max_turns == 3
    assert load_workflow("plan_path", turns=4).max_turns == 4
    for bad, match in (({"turns": 0}, "turns"), ({"team": "trio"}, "team"), ({"size": 11}, "size"), ({"max_dist": 13}, "max_dist"),
                       ({"min_dist": 5, "max_dist": 3}, "min_dist")):
        with pytest.raises(ConfigError, match=match):
            load_workflow("plan_path", **bad)


# -- the engine with a scripted sampler -----------------------------------------------------


def scripted(content: str, j: int, rng: random.Random) -> str:
    """Tool: sample 0 writes a right path, 1 a path into a wall, 2 prose. Plan: keeps a call that
    reached the goal, else writes the right path on sample 0 and a wrong one otherwise."""
    lines = content.split("\n")
    if lines[0] == "path":
        p = parse_puzzle("\n".join(lines[1:]))
        return [p.path(), "U" * 3 if p.start[0] == 0 else "UUUU", "go!"][j % 3]
    read = parse_plan_text(content)
    p = parse_puzzle("\n".join(lines[1:-2]))
    call, output = read
    if output.startswith("goal"):
        return call
    return p.path() if j == 0 else "L"


@dataclass
class ScriptedSampler:
    policy: object = scripted
    engine: str = "scripted"
    model_dir: str = "scripted"
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)

    @property
    def model_version(self) -> str:
        return "scripted-v0"

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        seeds = seed if isinstance(seed, (list, tuple)) else [seed] * len(prompt_ids)
        out = []
        for prompt, s in zip(prompt_ids, seeds):
            content = self.tokenizer.decode(prompt).rsplit(ROLE_MARK["user"], 1)[1].split("\x04", 1)[0]
            row = []
            for j in range(n):
                text = self.policy(content, j, random.Random(f"{s}/{j}"))
                ids = self.tokenizer.encode(text)[:max_tokens]
                row.append(Sample(token_ids=ids, logprobs=[-0.5] * len(ids), text=self.tokenizer.decode(ids), finish_reason="stop"))
            out.append(row)
        return out


def test_rollouts_the_plan_rows_carry_the_tools_output():
    wf = PlanPathWorkflow()
    problems = wf.problems("train", 4, 0)
    steps = run_rollouts(problems, wf, [IID(group_size=3), PromptAug(group_size=3), Tree(group_size=3)], ScriptedSampler(), RolloutConfig(seed=1))
    rows = steps.to_pylist()
    tools = [r for r in rows if r["agent_id"] == TOOL]
    plans = [r for r in rows if r["agent_id"] == PLAN]
    assert tools and plans and {r["agent_id"] for r in rows} == {TOOL, PLAN}
    for r in plans:
        tool = next(t for t in tools if t["traj_uid"] == r["traj_uid"] and t["step"] == r["step"] - 1) if r["strategy"] != "tree" else None
        content = r["sampling_messages"][-1]["content"]
        call, output = parse_plan_text(content)
        p = parse_puzzle("\n".join(content.split("\n")[1:-2]))
        assert output == run_path(p, p.start, call).output if call else output == "bad"
        if tool is not None:
            assert call == read_path(tool["completion_text"])
            assert tool["local_reward"] == (1.0 if output.startswith("goal") else 0.0)
    assert any(r["sampling_messages"][0]["content"].startswith("Hint: ") for r in tools if r["strategy"] == "prompt_aug")
    # iid: a tool sample that writes the right path is kept by the plan agent, so its episode ends at the goal
    for traj in {r["traj_uid"] for r in rows if r["strategy"] == "iid"}:
        mine = sorted((r for r in rows if r["traj_uid"] == traj), key=lambda r: r["step"])
        if mine[0]["sample_idx"] % 3 == 0:
            assert len(mine) == 2 and {r["global_reward"] for r in mine} == {1.0}


def test_evaluation_reports_the_table_metrics():
    from pipeline.rollout.evaluation import EvalConfig, evaluate_workflow

    wf = load_workflow("plan_path")
    sampler = ScriptedSampler(lambda c, j, rng: scripted(c, 0, rng))
    df = evaluate_workflow(wf, {"shared": sampler}, {"shared": sampler.tokenizer}, EvalConfig(problems=8, samples=2), 0)
    values = {(r["agent_id"], r["metric"]): r["value"] for r in df.to_dicts()}
    assert values[("team", "success")] == 1.0 and values[(TOOL, "reward")] == 1.0 and values[(PLAN, "keeps_goal")] == 1.0
    # a tool that never reaches the goal: the plan agent rescues with the right path every time
    sampler = ScriptedSampler(lambda c, j, rng: "go!" if c.startswith("path") else scripted(c, 0, rng))
    df = evaluate_workflow(wf, {"shared": sampler}, {"shared": sampler.tokenizer}, EvalConfig(problems=8, samples=2), 0)
    values = {(r["agent_id"], r["metric"]): r["value"] for r in df.to_dicts()}
    assert values[(TOOL, "reward")] == 0.0 and values[(PLAN, "rescues")] == 1.0 and values[("team", "success")] == 1.0
    assert (PLAN, "keeps_goal") not in values


def test_embedded_model_builds_and_is_cached(tmp_path):
    from pipeline.models import load_model, load_tokenizer
    from pipeline.models.build import ModelConfig
    from pipeline.models.chat import encode_prompt
    from pipeline.workflows.plan_path.model import PlanPathGame, PlanPathWarmStartConfig, build_plan_path_model, play

    small = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    warm = PlanPathWarmStartConfig(steps=3, clean_steps=1, batch_size=8, warmup_steps=1)
    logs: list[str] = []
    out = build_plan_path_model(tmp_path, PlanPathGame(), warm, small, log=logs.append, measure=False)
    assert out.name.startswith("plan_path-") and (out / "maxit_build.json").is_file() and logs
    tok, model = load_tokenizer(out), load_model(out)
    p = parse_puzzle(MAZE)
    content = plan_text(p, p.start, run_path(p, p.start, "DRRRU"))
    assert len(encode_prompt(tok, [{"role": "user", "content": content}])) == 2 + len(content) + 1  # one token per character
    result = play(model, tok, [p], (TOOL, PLAN), temperature=1.0, samples=2, seed=0)
    assert set(result) == {"success", "tool_reward", "plan_reward"} and 0 <= result["success"] <= 1
    again: list[str] = []
    assert build_plan_path_model(tmp_path, PlanPathGame(), warm, small, log=again.append, measure=False) == out and not again


def test_model_scale_builds_a_deeper_model_for_the_wide_arm(monkeypatch):
    """`model_scale=2` (what the wide arm adds to the team's options) asks for the embedded model
    twice as deep, the same game and warm start; the single agent keeps it; a bad scale is named."""
    import pipeline.workflows.plan_path.model as pp_model
    from pipeline.models.build import ModelConfig

    built = []
    monkeypatch.setattr(pp_model, "build_plan_path_model", lambda cache_dir, game, warm, model_config=None: built.append((game, warm, model_config)) or "m")
    load_workflow("plan_path").default_model()
    load_workflow("plan_path", model_scale=2).single_agent().default_model()
    (game1, warm1, config1), (game2, warm2, config2) = built
    assert config1 is None and config2.num_layers == 2 * ModelConfig.num_layers
    assert (game1, warm1) == (game2, warm2)
    for bad in (0, 9, "2", True):
        with pytest.raises(ConfigError, match="workflow 'plan_path': model_scale"):
            load_workflow("plan_path", model_scale=bad)
