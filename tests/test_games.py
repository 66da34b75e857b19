"""The game workflows (OpenSpiel through `pipeline.workflows.games`): tic-tac-toe and bargaining in
self-play, legal play with both players' rows, the illegal-move penalty, per-player rewards, the
scripted opponent, the evaluation's win/draw/loss metrics, problems and their splits, and the
one-line error without the `games` extra. Engine-free: a scripted sampler plays from the prompt."""

from __future__ import annotations

import sys

import polars as pl
import pytest

pytest.importorskip("pyspiel", reason="the games extra (scripts/setup.sh installs it)")

from pipeline.config import EvalConfig  # noqa: E402
from pipeline.errors import ConfigError  # noqa: E402
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Tree  # noqa: E402
from pipeline.types import Problem  # noqa: E402
from pipeline.workflows import WORKFLOW_NAMES, load_workflow  # noqa: E402
from pipeline.workflows.games import evaluation as games_eval  # noqa: E402
from pipeline.workflows.games.env import REWARDS, SPECS, GameEnv, prompt_text, read_action  # noqa: E402
from pipeline.workflows.games.opponents import ttt_forced, ttt_heuristic  # noqa: E402
from pipeline.workflows.games.positions import replay  # noqa: E402
from pipeline.workflows.games.spiel import Table, best_moves, load_game  # noqa: E402
from tests.test_grid import ScriptedSampler  # noqa: E402

TTT = SPECS["tic_tac_toe"]


def board_table(content: str) -> Table:
    """The tic-tac-toe table a prompt shows (its marks replayed x, o, x, ...)."""
    cells = "".join(c[0] for c in content.split("\n")[1].removeprefix("cells: ").split())
    xs = [i for i, c in enumerate(cells) if c == "x"]
    os_ = [i for i, c in enumerate(cells) if c == "o"]
    moves = [m for pair in zip(xs, os_ + [None]) for m in pair if m is not None][: len(xs) + len(os_)]
    return replay(TTT, ",".join(map(str, moves)), seed="t")


def first_free(content, j, rng) -> str:
    table = board_table(content)
    return "0" if table.done else str(table.legal()[0])  # a finished board: a game the opponent ended


def perfect(content, j, rng) -> str:
    table = board_table(content)
    return "0" if table.done else str(best_moves(table)[0])


def problem(history: str) -> Problem:
    return Problem(uid=f"tic_tac_toe:{history}", question=history, answer="", split="train")


def play(wf, problems, policy, group_size=1, strategy=None):
    cfg = RolloutConfig(round=0, temperature=1.0, max_tokens=64, seed=0)
    steps = run_rollouts(problems, wf, [strategy or IID(group_size=group_size)], ScriptedSampler(policy), cfg)
    return pl.from_arrow(steps).sort("traj_uid", "turn", "step")


def test_registered_and_built():
    assert {"tic_tac_toe", "bargaining"} <= set(WORKFLOW_NAMES)
    wf = load_workflow("tic_tac_toe", shared_policy=False)
    assert [a.agent_id for a in wf.agents] == ["player_0", "player_1"] and wf.policy_ids == ("player_0", "player_1")
    with pytest.raises(ConfigError, match="opponent 'minimax'"):
        load_workflow("tic_tac_toe", opponent="minimax")
    with pytest.raises(ConfigError, match="opening must be an even"):
        load_workflow("tic_tac_toe", opening=3)
    with pytest.raises(ConfigError, match=r"unknown reward 'value'; choose from \['outcome'\]"):
        load_workflow("bargaining", reward="value")
    for name, spec in SPECS.items():  # the spec states each game's default reward, one the game offers
        assert spec.reward in REWARDS[name] and load_workflow(name).reward == spec.reward
    assert load_workflow("tic_tac_toe").reward == "best" and load_workflow("tic_tac_toe", reward="value").reward == "value"


def test_read_action_checks_the_legal_actions():
    t = replay(TTT, "4", seed="s")  # x in the centre, o to move
    assert read_action(" 0\n", t) == 0
    assert read_action("4", t) is None  # occupied
    assert read_action("9", t) is None and read_action("banana", t) is None and read_action("", t) is None
    assert read_action("o(0,2)", t) == 2  # OpenSpiel's own text of the action
    b = Table("bargaining", 0)
    assert read_action("Agree", b) is None  # no offer to agree to yet
    assert read_action("offer: book: 0, hat: 0, basketball: 0", b) == 0


def test_self_play_rows_of_both_players_alternate_and_end_with_the_game():
    wf = load_workflow("tic_tac_toe", reward="value")
    steps = play(wf, [problem("")], first_free)
    # first-free play: x 0, o 1, x 2, o 3, x 4, o 5, x 6 wins on the diagonal 2-4-6
    assert steps["agent_id"].to_list() == ["player_0", "player_1"] * 3 + ["player_0"]
    assert steps["completion_text"].to_list() == [str(i) for i in range(7)]
    assert steps["turn"].to_list() == [0, 0, 1, 1, 2, 2, 3]
    # local rewards: each move's minimax result for its mover (1 win, 0.5 draw, 0 loss)
    expected = []
    for n in range(1, 8):
        t = replay(TTT, ",".join(map(str, range(n))), seed="s")
        from pipeline.workflows.games.spiel import solved_value

        expected.append((solved_value(t, (n - 1) % 2) + 1) / 2)
    assert steps["local_reward"].to_list() == expected
    assert expected[-1] == 1.0 and expected[-2] == 0.0  # x's winning move; o's move that let it win
    assert steps["global_reward"].unique().to_list() == [1.0]  # a legal finish


def test_the_tic_tac_toe_prompt_numbers_its_cells():
    from dataclasses import replace

    t = replay(TTT, "4,0", seed="s")  # x in the centre, o in the corner; x to move
    assert prompt_text(TTT, t, 0) == "tic_tac_toe x\ncells: o0 .1 .2 .3 x4 .5 .6 .7 .8"
    assert prompt_text(TTT, t, 1) == "tic_tac_toe o\ncells: o0 .1 .2 .3 x4 .5 .6 .7 .8"
    # OpenSpiel's grid, and the mover's legal cells on a last line, where a spec asks for those
    listed = replace(TTT, board_cells=False, list_moves=True)
    assert prompt_text(listed, t, 0) == "tic_tac_toe x\no..\n.x.\n...\nmoves: 1 2 3 5 6 7 8"
    assert "moves:" not in prompt_text(listed, t, 1)  # not o's turn
    assert not SPECS["bargaining"].list_moves and not SPECS["bargaining"].board_cells  # its offers are many and long


def test_the_tic_tac_toe_model_reads_each_cell_as_one_token():
    from pipeline.workflows.games.model import CELL_TOKENS, ttt_tokenizer

    tok = ttt_tokenizer(256)
    t = replay(TTT, "4,0", seed="s")
    line = prompt_text(TTT, t, 0).splitlines()[1]
    assert [x for x in tok.tokenize(line) if x != "Ġ"][-9:] == ["o0", ".1", ".2", ".3", "x4", ".5", ".6", ".7", ".8"]
    assert len(CELL_TOKENS) == 27 and all(tok.convert_tokens_to_ids(c) != tok.unk_token_id for c in CELL_TOKENS)
    assert tok.tokenize("tic_tac_toe x")[-1] == "x" and tok.tokenize("4")[0] == "4"  # the seat and an answer stay characters


def test_illegal_move_ends_the_game_with_the_named_penalty():
    wf = load_workflow("tic_tac_toe", illegal_penalty=-2.5)

    def o_cheats(content, j, rng):
        return "0" if content.startswith("tic_tac_toe o") else first_free(content, j, rng)  # x took 0

    steps = play(wf, [problem("")], o_cheats)
    assert steps["agent_id"].to_list() == ["player_0", "player_1"]  # the game ended at o's move
    assert steps["local_reward"].to_list()[-1] == -2.5
    assert steps["global_reward"].to_list() == [0.0, 0.0]  # no legal finish
    garbage = play(wf, [problem("")], lambda c, j, rng: "e5")
    assert garbage.height == 1 and garbage["local_reward"].to_list() == [-2.5]


def test_rewards_by_hand():
    t = replay(TTT, "0,3,1,4", seed="s")  # x: 0 1, o: 3 4; x to move
    env = GameEnv(TTT, t.clone(), {"player_0": 0, "player_1": 1}, -1.0, reward="value")
    win = env.step("player_0", "2")
    assert win.reward == 1.0 and win.done and env.result(0) == 1.0 and env.result(1) == 0.0
    env = GameEnv(TTT, t.clone(), {"player_0": 0, "player_1": 1}, -1.0, reward="value")
    blunder = env.step("player_0", "8")  # leaves o its win at 5
    assert blunder.reward == 0.0 and not blunder.done
    assert env.step("player_1", "5").reward == 1.0 and env.result(1) == 1.0
    # reward="best": 1.0 for an optimal move (the grid's rule), 0.0 for another legal one
    best = load_workflow("tic_tac_toe", reward="best")
    env = best.reset(problem("0,3,8,4"), IID(group_size=1))  # x must block at 5
    assert env.step("player_0", "5").reward == 1.0
    env = best.reset(problem("0,3,8,4"), IID(group_size=1))
    assert env.step("player_0", "1").reward == 0.0
    with pytest.raises(ConfigError, match="unknown reward 'best'"):
        load_workflow("bargaining", reward="best")
    # the tree strategy's copy: an independent table
    env = GameEnv(TTT, replay(TTT, "", seed="s"), {"player_0": 0, "player_1": 1}, -1.0)
    twin = env.copy()
    env.step("player_0", "4")
    assert twin.table.history() == [] and env.table.history() == [4]


def test_tree_strategy_runs_on_a_game():
    wf = load_workflow("tic_tac_toe")
    steps = play(wf, [problem("")], lambda c, j, rng: perfect(c, j, rng) if j else "x", strategy=Tree(group_size=3))
    selected = steps.filter(pl.col("selected"))
    assert selected.height >= 5 and (selected["local_reward"] >= 0.5).all()


def test_the_outcome_team_reward_gives_each_player_its_own_result():
    wf = load_workflow("tic_tac_toe", team="outcome")
    steps = play(wf, [problem("")], first_free)  # x wins with its fourth move (the 2-4-6 diagonal)
    side = dict(steps.group_by("agent_id").agg(pl.col("global_reward").unique()).iter_rows())
    assert side == {"player_0": [1.0], "player_1": [0.0]}
    legal = play(load_workflow("tic_tac_toe"), [problem("")], first_free)
    assert steps["local_reward"].to_list() == legal["local_reward"].to_list()  # the local rewards are the game's
    # a forfeit loses: o answers nonsense, x gets the win on its rows
    forfeit = play(wf, [problem("")], lambda c, j, rng: "?" if "tic_tac_toe o" in c else first_free(c, j, rng))
    assert forfeit["global_reward"].to_list() == [1.0, 0.0] and forfeit["local_reward"].to_list()[-1] == -1.0
    # the tree: each candidate's own result right after its step (an unfinished game is a draw)
    tree = play(wf, [problem("0,3,1,4")], lambda c, j, rng: "2" if j == 0 else "8", strategy=Tree(group_size=2))
    first = tree.filter(pl.col("turn") == 0).sort("sample_idx")
    assert first["global_reward"].to_list() == [1.0, 0.5] and first["selected"].to_list() == [True, False]
    # x passes up its win at 2; o's candidates: 5 wins for o, 2 goes on
    tree = play(wf, [problem("0,3,1,4")], lambda c, j, rng: "8" if "tic_tac_toe x" in c else ("5" if j == 0 else "2"), strategy=Tree(group_size=2))
    o_rows = tree.filter(pl.col("agent_id") == "player_1").filter(pl.col("turn") == 0).sort("sample_idx")
    assert o_rows["global_reward"].to_list() == [1.0, 0.5]
    # bargaining: each player's own deal value / 10
    deal = load_workflow("bargaining", team="outcome")
    p = deal.problems("train", 1, 0)[0]
    rows = play(deal, [p], lambda c, j, rng: "Agree" if "P0 offers" in c else "Offer: Book: 0, Hat: 0, Basketball: 0")
    side = dict(rows.group_by("agent_id").agg(pl.col("global_reward").unique()).iter_rows())
    assert side == {"player_0": [0.0], "player_1": [1.0]}
    with pytest.raises(ConfigError, match=r"unknown team reward 'joint'; choose from \['legal', 'outcome'\]"):
        load_workflow("tic_tac_toe", team="joint")


def test_the_reports_rollout_success_reads_the_first_players_side_of_an_outcome_game(tmp_path):
    """`maxit report`'s success_<strategy> (`trajectory_success`) takes one number per episode: with
    one reward per side, the first agent's (player_0), not whoever moved last; a store of such a run
    has no trained single agent (one agent playing both seats has no reward per side)."""
    from pipeline.run.arms import trained_single_settings
    from pipeline.run.experiment_record import record_experiment
    from pipeline.reporting.report import trajectory_success
    from pipeline.run.settings import Settings

    wf = load_workflow("tic_tac_toe", team="outcome")
    forfeit = play(wf, [problem("")], lambda c, j, rng: "?" if "tic_tac_toe o" in c else first_free(c, j, rng))
    assert forfeit["agent_id"].to_list() == ["player_0", "player_1"]  # o's forfeit is the last row
    assert trajectory_success(forfeit.lazy()).collect()["global_reward"].to_list() == [1.0]
    won = play(wf, [problem("")], first_free)  # x's winning move is the last row
    assert trajectory_success(won.lazy()).collect()["global_reward"].to_list() == [1.0]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    record_experiment(tmp_path / "store", Settings(workflow="tic_tac_toe", workflow_options=("team=outcome",), model_dir=str(model)), "hf")
    (tmp_path / "store" / "round=0").mkdir()
    with pytest.raises(ConfigError, match="gives each seat its own result"):
        trained_single_settings(tmp_path / "store")


def test_a_per_side_team_reward_that_leaves_an_agent_out_is_named_on_its_rows(monkeypatch):
    monkeypatch.setattr(GameEnv, "team_reward", lambda self: {"player_0": 1.0})
    steps = play(load_workflow("tic_tac_toe"), [problem("")], first_free)
    other = steps.filter(pl.col("agent_id") == "player_1")
    assert other["global_reward"].is_null().all()
    assert other["reward_error"].str.contains("team_reward gave no value for agent 'player_1'").all()
    assert steps.filter(pl.col("agent_id") == "player_0")["global_reward"].to_list() == [1.0] * 4
    monkeypatch.setattr(GameEnv, "team_reward", lambda self: {"player_0": float("nan"), "player_1": 0.0})
    steps = play(load_workflow("tic_tac_toe"), [problem("")], first_free)
    assert steps["global_reward"].is_null().all() and steps["reward_error"].str.contains(r"team_reward\['player_0'\] returned nan").all()


def test_evaluation_and_baselines_score_an_outcome_run_as_a_team(monkeypatch):
    from pipeline.rollout.budget_matched import play as play_baseline

    legal, _ = _evaluate(monkeypatch, perfect, first_free)
    outcome, _ = _evaluate(monkeypatch, perfect, first_free, team="outcome")
    assert outcome == legal  # the self-play success is a legal finish under either
    wf = load_workflow("tic_tac_toe", team="outcome")
    assert wf.scored_as_a_team().team == "legal" and wf.team == "outcome"
    problems = wf.problems("heldout", 6, 0)
    sampler = ScriptedSampler(first_free)
    kw = dict(samples=1, temperature=1.0, max_tokens=4, seed=0)
    raw = play_baseline(wf, problems, sampler, sampler.tokenizer, **kw)
    scored = play_baseline(wf.scored_as_a_team(), problems, sampler, sampler.tokenizer, **kw)
    assert scored.success == 1.0 and raw.errors == 0  # every game finished legally
    assert raw.team_reward == pytest.approx(sum(env_result(p) for p in problems) / 6)  # player_0's side read


def env_result(p: Problem) -> float:
    """x's result of first-free self-play from `p`."""
    env = GameEnv(TTT, replay(TTT, p.question, seed="r"), {"player_0": 0, "player_1": 1}, -1.0)
    while not env.over:
        env.step(("player_0", "player_1")[env.table.agent_selection], str(env.table.legal()[0]))
    return env.result(0)


def test_heuristic_wins_then_blocks_else_random():
    import random

    t = replay(TTT, "0,3,1,4", seed="s")  # x to move: wins at 2 (and could block 5)
    assert ttt_heuristic(t, random.Random(0)) == 2
    t = replay(TTT, "0,3,8,4", seed="s")  # x to move, no win: blocks o at 5
    assert ttt_heuristic(t, random.Random(0)) == 5
    t = replay(TTT, "4", seed="s")
    assert {ttt_heuristic(t, random.Random(i)) for i in range(30)} == set(t.legal())


def test_problems_are_distinct_positions_and_the_splits_disjoint():
    wf = load_workflow("tic_tac_toe")
    train = wf.problems("train", 300, 0)
    held = wf.problems("heldout", 200, 0)
    assert train == wf.problems("train", 300, 0)
    boards = lambda ps: {str(wf.table(p).state) for p in ps}  # noqa: E731
    assert len(boards(train)) == 300 and len(boards(held)) == 200
    assert not boards(train) & boards(held)
    assert all(len(p.question.split(",")) % 2 == 0 or p.question == "" for p in train)
    with pytest.raises(ConfigError, match="heldout has .* positions"):
        wf.problems("heldout", 5000, 0)
    bargaining = load_workflow("bargaining")
    assert len({p.question for p in bargaining.problems("train", 50, 1)}) == 50


def test_bargaining_rewards_each_players_deal_and_the_joint_value():
    wf = load_workflow("bargaining")
    p = wf.problems("train", 1, 0)[0]
    env = wf.reset(p, IID(group_size=1))
    pool = env.observe("player_0")[0]["content"]
    assert pool.startswith("bargaining p0\nPool: ")
    offer = env.step("player_0", "Offer: Book: 0, Hat: 0, Basketball: 0")  # p0 offers to take nothing
    assert offer.reward == 0.0 and not offer.done
    deal = env.step("player_1", "Agree")
    u0, u1 = env.table.rewards()
    assert deal.done and deal.reward == u1 / 10 and u0 == 0.0 and u1 == 10.0
    assert env.team_reward() == (u0 + u1) / 20 and env.result(1) == 1.0
    steps = play(wf, [p], lambda c, j, rng: "Agree" if "P0 offers" in c else "Offer: Book: 0, Hat: 0, Basketball: 0")
    assert steps["agent_id"].to_list() == ["player_0", "player_1"]
    bad = play(wf, [p], lambda c, j, rng: "Agree")  # nothing to agree to: a forfeit, no deal
    assert bad.height == 1 and bad["local_reward"].to_list() == [-1.0] and bad["global_reward"].to_list() == [0.0]


def test_the_starting_policy_holds_the_other_seat():
    wf = load_workflow("tic_tac_toe", shared_policy=False)
    for seat in (0, 1):
        versus = games_eval.Versus(wf, seat, "base")
        policies = {a.agent_id: a.policy_id for a in versus.agents}
        assert policies == {f"player_{seat}": f"player_{seat}", f"player_{1 - seat}": games_eval.BASE_POLICY}
        steps = play(versus, [problem("")], first_free)
        assert set(steps.select("agent_id", "policy_id").unique().iter_rows()) == set(policies.items())
    assert [a.agent_id for a in games_eval.Versus(wf, 1, "scripted").agents] == ["player_1"]


def _evaluate(monkeypatch, policy, base_policy, **options):
    monkeypatch.setattr(games_eval, "_base_sampler", lambda game, samplers: ScriptedSampler(base_policy))
    wf = load_workflow("tic_tac_toe", **options)
    frame = wf.evaluate({"shared": ScriptedSampler(policy)}, {}, EvalConfig(problems=12, samples=2, greedy=False), 3)
    return {(r["agent_id"], r["metric"]): r["value"] for r in frame.iter_rows(named=True)}, frame


def test_evaluation_against_the_scripted_player_and_the_base(monkeypatch):
    from pipeline.workflows.games.spiel import solved_value

    m, frame = _evaluate(monkeypatch, perfect, first_free)
    assert m[("team", "win_vs_base")] > m[("team", "loss_vs_base")]  # perfect play beats first-free play
    positions = load_workflow("tic_tac_toe").problems("heldout", 12, EvalConfig().seed)
    # perfect play loses only from positions already lost for its seat (the opponent moving first
    # cannot improve on the position's value for it)
    lost = sum(solved_value(replay(TTT, p.question, "s"), seat) == -1 for p in positions for seat in (0, 1)) / 24
    for opp in ("scripted", "base"):
        assert m[("team", f"win_vs_{opp}")] + m[("team", f"draw_vs_{opp}")] + m[("team", f"loss_vs_{opp}")] == pytest.approx(1.0)
        assert m[("team", f"illegal_vs_{opp}")] == 0.0
        assert m[("team", f"loss_vs_{opp}")] <= lost
        assert ("player_0", f"win_vs_{opp}") in m and ("player_1", f"win_vs_{opp}") in m
    assert m[("team", "success")] == 1.0  # self-play: every game finished legally
    for opp in ("scripted", "base"):
        n = frame.filter((pl.col("metric") == f"win_vs_{opp}") & (pl.col("agent_id") == "team"))["n"].item()
        assert n == 12 * 2 * 2  # positions x samples x seats: every game counted
    cols = {metric for agent, metric, _ in type(load_workflow("tic_tac_toe")).table_metrics}
    assert {"win_vs_scripted", "win_vs_base", "loss_vs_scripted"} <= cols  # the round table shows them
    m, _ = _evaluate(monkeypatch, lambda c, j, rng: "?", first_free)
    # every game is forfeited at the team's first move, but in o's seat the scripted x, moving
    # first, wins at once where it has two in a line (the held-out starts are 4-ply positions)
    moves = sum(ttt_forced(replay(TTT, p.question, "s")) is None or ttt_forced(replay(TTT, p.question, "s"))[1] != "win" for p in positions)
    assert m[("team", "illegal_vs_scripted")] == pytest.approx((12 + moves) / 24) and moves > 0
    assert m[("team", "win_vs_scripted")] == 0.0 and m[("team", "success")] == 0.0


def test_without_the_extra_one_line_error_names_it(monkeypatch):
    load_game.cache_clear()
    monkeypatch.setitem(sys.modules, "pyspiel", None)
    try:
        with pytest.raises(ConfigError, match="install the 'games' extra"):
            load_workflow("tic_tac_toe").reset(problem(""), IID(group_size=1))
    finally:
        load_game.cache_clear()


def test_only_the_adapter_imports_the_game_libraries():
    """pyspiel, shimmy and pettingzoo are imported by `pipeline/workflows/games/spiel.py` alone."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted((root / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("pyspiel", "shimmy", "pettingzoo", "open_spiel") for n in names):
                found.append(str(path.relative_to(root)))
    assert set(found) == {"pipeline/workflows/games/spiel.py"}


def test_ttt_critical_counts_the_positions_and_scores_an_oracle_and_its_opposite():
    """scripts/ttt_critical.py (docs/results/games.md): every non-terminal tic-tac-toe position
    once (5,478 reachable minus 958 finished), and a model that always names a best move scores
    100% where one that names a worst move scores 0% at the critical positions."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from pipeline.workflows.grid.model import build_grid_tokenizer

    spec = importlib.util.spec_from_file_location("ttt_critical", Path(__file__).resolve().parents[1] / "scripts" / "ttt_critical.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    items = tc.positions()
    assert len(items) == 4520 and len({p for p, *_ in items}) == 4520
    assert all(best and set(best) <= set(legal) for _, legal, best in items)
    critical = [it for it in items if len(it[2]) < len(it[1])]
    tok = build_grid_tokenizer(512)
    table = {p: (best, [c for c in legal if c not in best]) for p, legal, best in items}

    class Picks(torch.nn.Module):  # names one cell of each position: a best one, or a worst one
        def __init__(self, worst: bool):
            super().__init__()
            self.worst = worst

        def forward(self, input_ids, attention_mask, **_):
            logits = torch.zeros(*input_ids.shape, len(tok))
            for i, ids in enumerate(input_ids):
                best, rest = next(v for p, v in table.items() if p in tok.decode(ids))
                logits[i, -1, tok.convert_tokens_to_ids(str((rest or best)[0] if self.worst else best[0]))] = 20.0
            return SimpleNamespace(logits=logits)

    sample = critical[:40] + items[:10]
    good, bad = tc.measure(Picks(False), tok, sample), tc.measure(Picks(True), tok, sample)
    assert good["all greedy"] == good["critical greedy"] == 1.0 and good["critical mass"] > 0.99
    assert bad["critical greedy"] == 0.0 and bad["critical mass"] < 0.01


def test_ttt_critical_reference_mlp_reads_the_cells_and_learns_best_moves(capsys):
    """scripts/ttt_critical.py --mlp-steps: the reference learner's inputs are the prompt's nine
    cells one-hot and the mover, and on the warm start's examples it finds best moves at most
    critical positions within a few hundred steps (the contrast docs/results/games.md draws)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ttt_critical", Path(__file__).resolve().parents[1] / "scripts" / "ttt_critical.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    f = tc.cell_features("tic_tac_toe o\ncells: x0 .1 o2 .3 .4 .5 .6 .7 x8")
    assert len(f) == 28 and f[:9] == [1, 0, 0, 0, 0, 1, 0, 1, 0] and f[-1] == 0.0
    with pytest.raises(ValueError, match="not a tic-tac-toe board"):
        tc.cell_features("tic_tac_toe x\ncells: x0 .1")
    tc.mlp_curve(tc.positions(), 300, 1e-3)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("| MLP on the cells, same examples, step 300")
    critical_greedy = float(last.split("|")[4])
    assert critical_greedy > 60.0, last


def test_ttt_critical_versus_weighs_every_branch_against_the_scripted_player():
    """scripts/ttt_critical.py --versus: exact expected results against the scripted player (it
    wins if it can, blocks if it must, else plays a uniformly random free cell), by hand from one
    position where x (to move) wins at 2 and o threatens 5."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ttt_critical", Path(__file__).resolve().parents[1] / "scripts" / "ttt_critical.py")
    tc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tc)
    start = [replay(TTT, "0,3,1,4", seed="v")]
    wins = tc.versus(lambda prompt, legal, best: {2: 1.0}, start)
    # as x it wins at once; as o the scripted x moves first and wins: o never moves
    assert (wins["win x"], wins["win o"], wins["win"], wins["draw"]) == (1.0, 0.0, 0.5, 0.0)
    assert wins["visits win available"] == 0.5 and wins["off best win available"] == 0.0
    half = tc.versus(lambda prompt, legal, best: {2: 0.5, 8: 0.5}, start)  # 8 lets the scripted o win at 5
    assert half["win x"] == 0.5 and half["off best win available"] == 0.5
    taken = tc.versus(lambda prompt, legal, best: {0: 1.0}, start)  # a taken cell forfeits
    assert taken["win"] == taken["draw"] == 0.0
    # the scripted player's random replies weighed uniformly: an x playing a uniformly random best
    # move from "x 0, o 4" wins 1/6 as sampled games count it (4,000 games, about 0.6 points of
    # standard error; were the scripted o's free choice its first free cell, 2/7)
    import random

    from pipeline.workflows.games.opponents import ttt_heuristic

    exact = tc.versus(lambda prompt, legal, best: {c: 1.0 / len(best) for c in best}, [replay(TTT, "0,4", seed="v")])
    rng, won = random.Random(0), 0
    for i in range(4000):
        env = GameEnv(TTT, replay(TTT, "0,4", seed="v"), {"me": 0}, -1.0, opponent=ttt_heuristic, judge=0, seed=str(i))
        while not env.over:
            env.step("me", str(rng.choice(best_moves(env.table))))
        won += env.result(0) == 1.0
    assert exact["win x"] == pytest.approx(1 / 6) and won / 4000 == pytest.approx(1 / 6, abs=0.03)


def test_a_games_best_round_and_regressions_judge_its_wins_not_its_losses_or_draws(tmp_path):
    """A game's judged metrics are its self-play success and win rates (`judged_metrics`): they pick
    the `--start-from best` checkpoint and are what the regression warning names; the loss and draw
    rates, whose fall is progress, are neither averaged in nor named."""
    from pipeline.run.context import RoundContext
    from pipeline.reporting.regression import round_regressions
    from pipeline.run.settings import Settings
    from pipeline.store import Tables
    from pipeline.workflows.games.workflow import TicTacToeWorkflow

    assert TicTacToeWorkflow.judged_metrics == (("team", "success"), ("team", "win_vs_scripted"), ("team", "win_vs_base"))
    tables = Tables(tmp_path)
    ctx = RoundContext(tables, Settings(workflow="tic_tac_toe", start_from="best").run_config())
    for r in (-1, 0, 1):
        folder = tmp_path / "ckpt" / str(r)
        folder.mkdir(parents=True)
        ctx.registry.register(r, "shared", folder)
    # round 0 plays itself more legally; round 1 wins more and loses less: all seven metrics'
    # mean would pick round 0 (win + draw + loss is 1 per opponent), the judged ones pick round 1
    values = {-1: (0.6, 0.10, 0.10, 0.80), 0: (0.95, 0.10, 0.20, 0.70), 1: (0.80, 0.30, 0.30, 0.40)}
    for r, (selfplay, win, draw, loss) in values.items():
        rows = [("success", selfplay)] + [(f"{k}_vs_{opp}", v) for opp in ("scripted", "base") for k, v in (("win", win), ("draw", draw), ("loss", loss))]
        frame = pl.DataFrame([{"round": r, "policy_id": "shared", "agent_id": "team", "split": "heldout", "metric": m, "value": v, "n": 800} for m, v in rows])
        tables.write(r, "evaluation", frame.cast({"round": pl.Int32}))
    assert ctx.checkpoints.start_checkpoints(2)["shared"] == (tmp_path / "ckpt" / "1").resolve()

    ev = pl.concat([tables.read(r, "evaluation") for r in (-1, 0, 1)])
    ev = ev.with_columns(value=pl.when((pl.col("round") == 1) & (pl.col("metric") == "success")).then(0.5).otherwise(pl.col("value")))
    found = round_regressions(ev, TicTacToeWorkflow.table_metrics, judged=TicTacToeWorkflow().judged())
    assert list(found) == [1] and found[1].startswith("selfplay 50.0% < 95.0% (round 0, ")
    assert "draw" not in found[1] and "loss" not in found[1]  # round 1's draws rose 10 points, its losses 30 points fewer
    # a judged pair is judged whatever its name: the workflow, not a naming rule, says what counts
    named = round_regressions(ev, TicTacToeWorkflow.table_metrics, judged=[("team", "loss_vs_scripted")])
    assert list(named) == [0, 1] and named[1].startswith("loss_scripted 40.0% < 80.0% (round -1, ")


def test_a_round_with_replay_draws_nearly_all_of_a_finite_train_split():
    """tic-tac-toe's train split is a finite set of positions: a round that asks for most of it,
    a quarter of them replayed from earlier rounds, still draws as many distinct problems, the
    replayed first (the draw used to ask the split for problems + replayed, more than it holds,
    and stopped the run at round 1)."""
    from pipeline.run.problems import draw_problems

    workflow = load_workflow("tic_tac_toe")
    with pytest.raises(ConfigError, match=r"train has (\d+) positions"):
        workflow.problems("train", 10_000, 0)
    earlier = draw_problems(workflow, 128, seed=1, round_=0)
    drawn = draw_problems(workflow, 480, seed=2, round_=1, replay=earlier)  # of the 496 the train split holds
    uids = drawn["uid"].to_list()
    assert len(uids) == len(set(uids)) == 480
    assert uids[:128] == earlier["uid"].to_list()
    # a split large enough draws what it drew before: the n + replayed draw, the replayed removed
    small = draw_problems(workflow, 64, seed=2, round_=1, replay=earlier.head(16))
    fresh = [p.uid for p in workflow.problems("train", 80, 2) if p.uid not in set(earlier.head(16)["uid"])]
    assert small["uid"].to_list() == earlier.head(16)["uid"].to_list() + fresh[:48]


def test_tic_tac_toe_runs_at_its_own_budget_unless_told_otherwise():
    """`maxit run --workflow tic_tac_toe` samples 256 positions a round in groups of 8 (the
    workflow's `run_defaults`); a flag given wins; the math default keeps the library's."""
    from maxit.cli import build_parser
    from pipeline.run.settings import Settings, settings_from_args

    def cli(*argv):
        return settings_from_args(build_parser().parse_args(["run", *argv]))

    own = cli("--workflow", "tic_tac_toe")
    assert (own.problems, own.samples) == (256, 8)
    assert (cli("--workflow", "tic_tac_toe", "--samples", "4").samples, cli("--workflow", "tic_tac_toe", "--problems", "128").problems) == (4, 128)
    assert (cli().problems, cli().samples) == (Settings().problems, Settings().samples) == (128, 4)
    from pipeline.run.settings import setting_help

    assert f"tic_tac_toe {own.problems};" in setting_help("problems") and f"tic_tac_toe {own.samples})" in setting_help("samples")
    # the game's train split holds the positions a round asks for, a quarter replayed on top
    assert len(load_workflow("tic_tac_toe").problems("train", round(own.problems * (1 + own.problem_replay)), 0)) >= own.problems


def test_a_game_built_directly_refuses_an_unknown_reward_or_team_reward():
    spec = SPECS["tic_tac_toe"]
    seats = {"player_0": 0, "player_1": 1}
    with pytest.raises(ConfigError, match=r"tic_tac_toe: unknown team reward 'nope'; choose from \['legal', 'outcome'\]"):
        GameEnv(spec, replay(spec, "", seed="t"), seats, -1.0, team="nope")
    with pytest.raises(ConfigError, match=r"tic_tac_toe: unknown reward 'nope'; choose from \['best', 'value'\]"):
        GameEnv(spec, replay(spec, "", seed="t"), seats, -1.0, reward="nope")
    assert GameEnv(spec, replay(spec, "", seed="t"), seats, -1.0, team="outcome").team == "outcome"


def test_ttt_critical_versus_without_a_model_is_a_one_line_error():
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "ttt_critical.py"
    out = subprocess.run([sys.executable, str(script), "--versus", "--sft-steps", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.strip().endswith("error: --versus plays model folders: give at least one")
