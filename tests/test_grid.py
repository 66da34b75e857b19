"""The grid workflow (a planner and a mover in a maze, several turns): its environment's step and
copy semantics, rewards, episode ends, problem generation and files, the tree strategy carrying
the selected candidate's state, the default evaluation, and the embedded model's build.
Engine-free: a scripted sampler plays from the prompt text."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest

from pipeline.errors import ConfigError, DataError
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Feedback, PromptAug, Tree
from pipeline.types import Sample
from pipeline.workflows import load_workflow
from pipeline.workflows.grid.game import MOVER, PLANNER, GridEnv, mover_text, parse_puzzle, planner_text, read_move
from pipeline.workflows.grid import GridWorkflow
from tests.fakes import FakeTokenizer, ROLE_MARK

# A at (0,0), G at (0,3), a wall at (0,2): the shortest path goes down and around (5 moves)
MAZE = "A.#G\n....\n.#..\n...."


def test_puzzle_distances_optimal_moves_hint():
    p = parse_puzzle(MAZE)
    assert p.start == (0, 0) and p.goal == (0, 3) and p.shortest == 5
    assert set(p.optimal_moves((0, 0))) == {"R", "D"}
    assert p.optimal_moves((1, 2)) == ("R",)
    assert p.after((0, 1), "R") == (0, 1)  # a wall: no move
    assert p.after((0, 0), "U") == (0, 0)  # the edge: no move
    path = p.path()
    pos = p.start
    for m in path:
        assert m in p.optimal_moves(pos)
        pos = p.after(pos, m)
    assert pos == p.goal and len(path) == 5
    hint = p.hint().splitlines()
    assert hint[0][0] == path[0] and "A" not in p.hint() and hint[0][3] == "G"
    assert parse_puzzle("S.#G/..../.#../....") == p  # "S" and "/" are accepted too


def test_env_step_rewards_and_copy_independence():
    p = parse_puzzle(MAZE)
    env = GridEnv(p, cap=7)
    assert env.observe(PLANNER)[0]["content"] == planner_text(p, (0, 0)) == "plan\n" + MAZE
    r = env.step(PLANNER, "R")
    assert r.reward == 1.0 and not r.done and env.plan == "R"
    assert env.observe(MOVER)[0]["content"] == "move R\n" + MAZE
    twin = env.copy()
    r = env.step(MOVER, " D ")  # the mover overrides the plan; D is optimal too
    assert r.reward == 1.0 and not r.done and env.pos == (1, 0) and env.turn == 1
    # the copy did not move with it
    assert twin.pos == (0, 0) and twin.turn == 0 and twin.plan == "R" and twin.moves == ""
    assert twin.observe(MOVER)[0]["content"] == "move R\n" + MAZE
    # wrong moves: a non-optimal move, a wall, text that is not one letter
    assert env.step(PLANNER, "U").reward == 0.0
    assert env.observe(MOVER)[0]["content"].startswith("move U\n")
    r = env.step(MOVER, "L")  # the edge: stays, earns nothing, the turn is spent
    assert r.reward == 0.0 and env.pos == (1, 0) and env.turn == 2
    assert env.step(PLANNER, "go right").reward == 0.0 and env.plan is None
    assert env.observe(MOVER)[0]["content"].startswith("move ?\n")
    assert env.step(MOVER, "RR").reward == 0.0 and env.pos == (1, 0)
    assert env.team_reward() == 0.0 and twin.team_reward() == 0.0
    assert read_move("R") == "R" and read_move("r") is None and read_move("") is None


def test_done_at_goal_and_at_turn_cap():
    p = parse_puzzle("A.G\n...")
    env = GridEnv(p, cap=4)
    env.step(PLANNER, "R")
    assert not env.step(MOVER, "R").done
    env.step(PLANNER, "R")
    r = env.step(MOVER, "R")
    assert r.done and r.reward == 1.0 and env.team_reward() == 1.0
    env = GridEnv(p, cap=2)
    env.step(PLANNER, "L")
    assert not env.step(MOVER, "L").done
    env.step(PLANNER, "L")
    r = env.step(MOVER, "D")
    assert r.done and r.reward == 0.0 and env.team_reward() == 0.0
    # the workflow's caps: shortest path + slack, or max_loop_num
    wf = GridWorkflow(slack=3)
    problem = wf._problem(p, "train")
    assert wf.reset(problem, IID()).cap == 2 + 3
    assert GridWorkflow(max_loop_num=9).reset(problem, IID()).cap == 9
    assert GridWorkflow(max_loop_num=9).max_turns == 9 and GridWorkflow().max_turns == 6 + 2


def test_generator_deterministic_and_splits_disjoint():
    wf = load_workflow("grid")
    a, b = wf.problems("train", 50, 7), wf.problems("train", 50, 7)
    assert a == b and len({p.uid for p in a}) == 50
    assert wf.problems("train", 50, 8) != a
    held = wf.problems("heldout", 200, 3)
    assert {p.question for p in held}.isdisjoint(p.question for q in range(5) for p in wf.problems("train", 200, q))
    assert all(p.split == "train" for p in a) and all(p.split == "heldout" for p in held)
    for p in a + held:
        puzzle = parse_puzzle(p.question)
        assert 2 <= puzzle.shortest <= 6 and p.answer == puzzle.path() and p.hint == puzzle.hint()
    big = load_workflow("grid", size=5, walls=5, max_loop_num=12)
    assert big.max_turns == 12 and all(len(parse_puzzle(p.question).rows) == 5 for p in big.problems("train", 5, 0))


def test_options_and_contract_errors():
    with pytest.raises(ConfigError, match="size"):
        GridWorkflow(size=11)
    with pytest.raises(ConfigError, match="min_dist"):
        GridWorkflow(min_dist=5, max_dist=3)
    with pytest.raises(ConfigError, match="max_loop_num"):
        load_workflow("grid", max_loop_num=0)
    with pytest.raises(ConfigError, match="feedback"):
        run_rollouts(GridWorkflow().problems("train", 1, 0), GridWorkflow(), [Feedback()], ScriptedSampler(), RolloutConfig())
    assert load_workflow("grid", shared_policy=False).policy_ids == (PLANNER, MOVER)


def test_task_file_rows_and_bad_rows_name_the_line(tmp_path):
    good = tmp_path / "mazes.jsonl"
    rows = [{"grid": MAZE, "split": "train"}, {"grid": ["S..", ".#G"], "split": "heldout", "uid": "m2"}, {"grid": "A.G/..."}]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    wf = load_workflow("grid", task_file=str(good))
    train, held = wf.problems("train", 10, 0), wf.problems("heldout", 10, 0)
    assert len(train) + len(held) == 3 and [p.uid for p in held if p.uid == "m2"] == ["m2"]
    assert wf.max_turns == 5 + 2  # the file's longest shortest path + slack
    assert {p.question for p in train}.isdisjoint(p.question for p in held)
    cases = {
        '{"grid": "A.#\\n..G"}\n{"grid": "A..\\n.G"}\n': "line 2: the grid's rows differ",
        '{"grid": "A.G"}\n\nnot json\n': "line 3: not JSON",
        '{"grid": "A#G"}\n': "line 1: the goal cannot be reached",
        '{"grid": "A.X.G"}\n': "line 1: the grid holds",
        '{"grid": "A..G", "split": "test"}\n': "line 1: 'split' must be",
        '["A..G"]\n': "line 1: expected a JSON object",
        '{"grid": "A..G"}\n{"grid": "A..G"}\n': "line 2: uid",
        '{"grid": "AA.G"}\n': "line 1: the grid needs exactly one start",
    }
    for i, (text, message) in enumerate(cases.items()):
        bad = tmp_path / f"bad{i}.jsonl"
        bad.write_text(text)
        with pytest.raises(DataError, match=message) as err:
            GridWorkflow(task_file=str(bad))
        assert str(bad) in str(err.value)
    # through the loader (what `maxit run --task-file` calls) the message is kept
    with pytest.raises((DataError, ConfigError), match="line 1: the grid holds"):
        load_workflow("grid", task_file=str(tmp_path / "bad3.jsonl"))


# -- a scripted sampler ---------------------------------------------------------------------


def scripted_move(content: str, j: int) -> str:
    """Candidate j of a call whose user message is `content`: 0 writes no move, 1 an optimal move,
    2 a valid move that is not optimal (or a wall), 3+ optimal again."""
    puzzle = parse_puzzle(content.split("\n", 1)[1])
    best = puzzle.optimal_moves(puzzle.start)
    if j == 0:
        return "??"
    if j == 2:
        others = [m for m in "UDLR" if m not in best]
        moving = [m for m in others if puzzle.after(puzzle.start, m) != puzzle.start]
        return (moving or others)[0]
    return best[0]


@dataclass
class ScriptedSampler:
    """Plays from the prompt text: `policy(user_content, sample_index, rng) -> text`."""

    policy: object = None
    engine: str = "scripted"
    model_dir: str = "scripted"
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    calls: int = 0

    @property
    def model_version(self) -> str:
        return "scripted-v0"

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.calls += 1
        seeds = seed if isinstance(seed, (list, tuple)) else [seed] * len(prompt_ids)
        out = []
        for prompt, s in zip(prompt_ids, seeds):
            content = self.tokenizer.decode(prompt).rsplit(ROLE_MARK["user"], 1)[1].split("\x04", 1)[0]
            row = []
            for j in range(n):
                rng = random.Random(f"{s}/{j}")
                text = (self.policy or (lambda c, j, rng: scripted_move(c, j)))(content, j, rng)
                ids = self.tokenizer.encode(text)[:max_tokens]
                row.append(Sample(token_ids=ids, logprobs=[-0.5] * len(ids), text=self.tokenizer.decode(ids), finish_reason="stop"))
            out.append(row)
        return out


def test_tree_continues_from_the_selected_candidates_state():
    wf = GridWorkflow()
    problem = wf._problem(parse_puzzle(MAZE), "train")
    steps = run_rollouts([problem], wf, [Tree(group_size=3)], ScriptedSampler(), RolloutConfig(alpha=0.0, local_weight=1.0))
    rows = steps.to_pylist()
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    puzzle = parse_puzzle(MAZE)
    pos, plan = puzzle.start, None
    for step in sorted(by_step):
        cands = sorted(by_step[step], key=lambda r: r["sample_idx"])
        assert len(cands) == 3 and len({r["prompt_hash"] for r in cands}) == 1
        agent = cands[0]["agent_id"]
        seen = cands[0]["sampling_messages"][-1]["content"]
        # the observation is the state the selected candidate of the previous step left
        assert seen == (planner_text(puzzle, pos) if agent == PLANNER else mover_text(puzzle, pos, plan))
        chosen = [r for r in cands if r["selected"]]
        assert len(chosen) == 1 and chosen[0]["sample_idx"] == 1 and chosen[0]["local_reward"] == 1.0
        assert [r["local_reward"] for r in cands] == [0.0, 1.0, 0.0]
        move = chosen[0]["completion_text"]
        if agent == PLANNER:
            plan = move
        else:
            pos = puzzle.after(pos, move)
            plan = None
            # the team reward right after the step: 1 only for the candidate that reached the goal
            assert [r["global_reward"] for r in cands][1] == (1.0 if pos == puzzle.goal else 0.0)
    assert pos == puzzle.goal and len(by_step) == 2 * puzzle.shortest


def test_iid_and_prompt_aug_episodes_and_rewards():
    wf = GridWorkflow()
    problems = wf.problems("train", 6, 0)

    def policy(content, j, rng):  # optimal with probability 0.7, else a random letter
        return scripted_move(content, 1) if rng.random() < 0.7 else rng.choice("UDLR")

    steps = run_rollouts(problems, wf, [IID(group_size=2), PromptAug(group_size=2)], ScriptedSampler(policy), RolloutConfig(seed=3))
    rows = steps.to_pylist()
    assert {r["agent_id"] for r in rows} == {PLANNER, MOVER}
    hinted = [r for r in rows if r["strategy"] == "prompt_aug" and r["agent_id"] == PLANNER]
    assert hinted and all(r["sampling_messages"][0]["content"].startswith("Hint: ") for r in hinted)
    assert not any(r["sampling_messages"][0]["role"] == "system" for r in rows if r["agent_id"] == MOVER)
    for traj in {r["traj_uid"] for r in rows}:
        mine = sorted((r for r in rows if r["traj_uid"] == traj), key=lambda r: r["step"])
        puzzle = parse_puzzle(next(p.question for p in problems if p.uid == mine[0]["uid"]))
        pos = puzzle.start
        for r in mine:
            if r["agent_id"] == MOVER:
                assert r["local_reward"] == (1.0 if read_move(r["completion_text"]) in puzzle.optimal_moves(pos) else 0.0)
                pos = puzzle.after(pos, read_move(r["completion_text"]))
        assert len(mine) <= 2 * (puzzle.shortest + wf.slack)
        assert {r["global_reward"] for r in mine} == {1.0 if pos == puzzle.goal else 0.0}


def test_default_evaluation_reports_the_table_metrics():
    from pipeline.rollout.evaluation import EvalConfig, evaluate_workflow

    wf = load_workflow("grid")
    sampler = ScriptedSampler(lambda c, j, rng: scripted_move(c, 1))
    df = evaluate_workflow(wf, {"shared": sampler}, {"shared": sampler.tokenizer}, EvalConfig(problems=8, samples=2), 0)
    values = {(r["agent_id"], r["metric"]): r["value"] for r in df.to_dicts()}
    for agent, metric, _ in wf.table_metrics:
        assert (agent, metric) in values
    assert values[("team", "success")] == 1.0 and values[("team", "success_greedy")] == 1.0
    assert values[(PLANNER, "reward")] == 1.0 and values[(MOVER, "follows_plan")] == 1.0


def test_embedded_model_builds_and_is_cached(tmp_path):
    from pipeline.models import load_model, load_tokenizer
    from pipeline.models.build import ModelConfig
    from pipeline.models.chat import encode_prompt
    from pipeline.workflows.grid.model import GridGame, GridWarmStartConfig, build_grid_model

    small = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    warm = GridWarmStartConfig(steps=3, clean_steps=1, batch_size=8, warmup_steps=1)
    logs: list[str] = []
    out = build_grid_model(tmp_path, GridGame(), warm, small, log=logs.append, measure=False)
    assert out.name.startswith("grid-") and (out / "maxit_build.json").is_file() and logs
    tok, model = load_tokenizer(out), load_model(out)
    ids = encode_prompt(tok, [{"role": "user", "content": planner_text(parse_puzzle(MAZE), (0, 0))}])
    assert len(ids) == 2 + len("plan\n" + MAZE) + 1  # one token per character
    assert tok.decode(tok.encode("R", add_special_tokens=False)) == "R"
    assert model.config.vocab_size == len(tok)
    again: list[str] = []
    assert build_grid_model(tmp_path, GridGame(), warm, small, log=again.append, measure=False) == out and not again
