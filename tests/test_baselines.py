"""The budget-matched baselines (`pipeline.rollout.budget_matched`, `pipeline.run.arms`, `maxit
baselines`): the team's calls per problem, the majority vote and its ties, the self-refine loop's
length and its last answer, the single agent of math, single, grid and any workflow, the table
written once per store, `maxit report` showing it, and bad input."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

from fakes import FakeSampler, FakeTask, FakeTokenizer, ROLE_MARK
from pipeline.errors import ConfigError, DataError
from pipeline.rollout.agent import Agent
from pipeline.rollout.budget_matched import baseline_rows, calls_per_call, majority, play, team_calls
from pipeline.rollout.workflow import REFINE_PROMPT, Env, SoloWorkflow, StepResult, Workflow
from pipeline.types import Problem, Sample
from pipeline.workflows.grid import GridWorkflow
from pipeline.workflows.grid.game import parse_puzzle
from pipeline.workflows.math import MathWorkflow, SingleWorkflow

MAXIT = str(Path(sys.executable).with_name("maxit"))
TOK = FakeTokenizer()


def test_majority_takes_the_most_frequent_answer_ties_to_the_first_sampled():
    assert majority(["3", "4", "4"]) == 1
    assert majority(["4", "3", "3", "4"]) == 0  # a tie: the answer sampled first wins
    assert majority(["3", "4", "4", "3"]) == 0
    assert majority([None, "7", None, "5", "5"]) == 3  # unreadable answers do not vote
    assert majority([None, None]) == 0  # nothing read: the first sample is played


def evaluation(calls: dict[int, dict[str, float]]) -> pl.DataFrame:
    rows = [{"round": r, "policy_id": "shared", "agent_id": a, "split": "heldout", "metric": "calls", "value": v, "n": 10}
            for r, per in calls.items() for a, v in per.items()]
    return pl.DataFrame(rows, schema_overrides={"round": pl.Int32})


def test_team_calls_from_the_evaluation_else_from_iid_steps():
    k, source = team_calls(evaluation({-1: {"planner": 3.0, "mover": 3.0}, 0: {"planner": 2.5, "mover": 2.5}}))
    assert k == 6.0 and source.startswith("evaluation: ") and "round -1" in source
    no_calls = pl.DataFrame({"round": [0], "policy_id": ["shared"], "agent_id": ["solver"], "split": ["heldout"], "metric": ["accuracy"], "value": [0.5], "n": [4]})
    steps = pl.DataFrame({"round": [0, 0, 0, 0, 1, 1], "strategy": ["iid", "iid", "iid", "tree", "iid", "iid"],
                          "traj_uid": ["a", "a", "b", "t", "c", "c"]})
    k, source = team_calls(no_calls, steps)
    assert k == 2.0 and source.startswith("steps: ") and "(round 1)" in source  # round 0: 1.5 per trajectory, round 1: 2
    with pytest.raises(DataError, match="calls per problem cannot be derived"):
        team_calls(no_calls, steps.filter(pl.col("strategy") == "tree"))
    assert calls_per_call(3.4, 1.0) == 3 and calls_per_call(8.4, 4.5) == 2 and calls_per_call(0.5, 2.0) == 1


def heldout(n: int = 30) -> list[Problem]:
    return FakeTask().problems("heldout", n, 1)


def test_single_agent_calls_vote_and_refine_lengths():
    single = MathWorkflow(task=FakeTask()).single_agent()
    assert isinstance(single, SingleWorkflow) and single.turn_order == ("solver",) and single.compares_answers
    problems = heldout()
    runs = {}
    for mode, m in (("plain", 1), ("vote", 5), ("refine", 3)):
        sampler = FakeSampler(solver_accuracy=0.5)
        runs[mode] = play(single, problems, sampler, TOK, samples=2, temperature=1.0, max_tokens=32, seed=5, mode=mode, m=m), sampler.calls
    (plain, plain_calls), (vote, vote_calls), (refine, refine_calls) = runs["plain"], runs["vote"], runs["refine"]
    assert (plain.calls, vote.calls, refine.calls) == (1.0, 5.0, 3.0) and plain.episodes == vote.episodes == 60
    assert [c.n for c in plain_calls] == [1] and [c.n for c in vote_calls] == [5] and [c.n for c in refine_calls] == [1, 1, 1]
    # the refine calls see the previous attempt and the refine prompt; the first does not
    assert REFINE_PROMPT not in TOK.decode(refine_calls[0].prompts[0])
    later = TOK.decode(refine_calls[2].prompts[0])
    assert later.count(REFINE_PROMPT) == 1 and later.count(ROLE_MARK["assistant"]) == 2
    # wrong answers scatter, so the majority of five is right far more often than one sample
    assert vote.success > plain.success + 0.15


@dataclass
class FlipSampler(FakeSampler):
    """Right at the first attempt, wrong once asked to answer again: the last answer must count."""

    def _sample(self, prompt, rng, max_tokens):
        out = super()._sample(prompt, rng, max_tokens)
        if REFINE_PROMPT in prompt:
            return Sample(out.token_ids, out.logprobs, "The answer is -1.", out.finish_reason)
        return out


def test_self_refine_plays_the_last_answer():
    single = SingleWorkflow(task=FakeTask())
    args = dict(samples=1, temperature=1.0, max_tokens=32, seed=1)
    assert play(single, heldout(), FlipSampler(solver_accuracy=1.0, hint_bonus=0.0), TOK, mode="plain", **args).success == 1.0
    assert play(single, heldout(), FlipSampler(solver_accuracy=1.0, hint_bonus=0.0), TOK, mode="refine", m=2, **args).success == 0.0


@dataclass
class GridOracle:
    """Plays the grid from the prompt: an optimal move with probability `skill`, else a random one."""

    skill: float = 1.0
    engine: str = "fake"
    model_dir: Path = Path("fake")
    calls: list = field(default_factory=list)
    model_version: str = "fake-v0"

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.calls.append((len(prompt_ids), n))
        out = []
        for i, ids in enumerate(prompt_ids):
            user = TOK.decode(ids).rsplit(ROLE_MARK["user"], 1)[-1].split("\x04")[0]
            puzzle = parse_puzzle(user.split("\n", 1)[1])
            best = sorted(puzzle.optimal_moves(puzzle.start))
            row = []
            for j in range(n):
                rng = random.Random(f"{seed[i] if isinstance(seed, list) else seed}/{j}")
                move = best[0] if rng.random() < self.skill else rng.choice("UDLR")
                row.append(Sample([ord(move)], [-0.1], move, "stop"))
            out.append(row)
        return out


def test_grid_single_agent_plays_both_roles_one_call_per_turn():
    grid = GridWorkflow()
    single = grid.single_agent()
    assert single.turn_order == ("planner",) and single.compares_answers and single.answer_key("planner", " D ") == "D"
    problems = grid.problems("heldout", 20, 3)
    perfect = play(single, problems, GridOracle(1.0), TOK, samples=1, temperature=1.0, max_tokens=4, seed=2)
    shortest = sum(parse_puzzle(p.question).shortest for p in problems) / len(problems)
    assert perfect.success == 1.0 and perfect.calls == pytest.approx(shortest)  # each call is a committed move
    team = play(grid, problems, GridOracle(1.0), TOK, samples=1, temperature=1.0, max_tokens=4, seed=2)
    assert team.success == 1.0 and team.calls == pytest.approx(2 * shortest)  # planner and mover each turn
    weak = [play(single, problems, GridOracle(0.5), TOK, samples=3, temperature=1.0, max_tokens=4, seed=2, mode=mode, m=m) for mode, m in (("plain", 1), ("vote", 5))]
    assert weak[1].success > weak[0].success


class Relay(Workflow):
    """Two agents with no baseline methods of their own: the first writes a number, the second
    must repeat it; right when it does."""

    name = "relay"
    agents = (Agent("a"), Agent("b"))

    def problems(self, split, n, seed):
        return [Problem(uid=f"r{i}", question=f"What is {i} + 1?", answer=str(i + 1), split=split) for i in range(n)]

    def reset(self, problem, strategy):
        return RelayEnv(problem)


class RelayEnv(Env):
    def __init__(self, problem):
        self.problem, self.said, self.seen = problem, None, []

    def copy(self):
        raise NotImplementedError

    def observe(self, agent_id):
        self.seen.append(agent_id)
        return [{"role": "user", "content": self.problem.question}]

    def step(self, agent_id, text):
        if agent_id == "a":
            self.said = text
            return StepResult(0.0, False)
        return StepResult(1.0 if text == self.said else 0.0, True)

    def team_reward(self):
        return 1.0 if self.said is not None else 0.0


def test_the_default_single_agent_takes_every_seat_and_the_vote_is_a_note():
    relay = Relay()
    single = relay.single_agent()
    assert isinstance(single, SoloWorkflow) and single.turn_order == ("a",) and not single.compares_answers
    env = single.reset(relay.problems("heldout", 1, 0)[0], None)
    env.observe("a"), env.step("a", "x"), env.observe("a")
    assert env.env.seen == ["a", "b"]  # the one agent plays a's seat, then b's
    rows = pl.DataFrame(baseline_rows(relay, single, relay.problems("heldout", 4, 0), lambda agent: (FakeSampler(), TOK), k=2.0, source="test",
                                      samples=1, temperature=1.0, max_tokens=lambda w: 16, seed=0))
    by = {(r["baseline"], r["metric"]): r for r in rows.iter_rows(named=True)}
    assert by[("single", "calls")]["value"] == 2.0 and by[("self_refine", "calls")]["calls_per_call"] == 1
    vote = by[("best_of_k", "success")]
    assert vote["value"] is None and "do not compare" in vote["note"]
    assert set(rows["baseline"]) == {"team", "single", "best_of_k", "self_refine"} and (rows["round"] == -1).all()


class Lonely(Relay):
    def single_agent(self):
        return None


def test_a_workflow_without_a_single_agent_gets_notes_not_missing_rows():
    relay = Lonely()
    rows = pl.DataFrame(baseline_rows(relay, None, relay.problems("heldout", 2, 0), lambda agent: (FakeSampler(), TOK), k=2.0, source="test",
                                      samples=1, temperature=1.0, max_tokens=lambda w: 16, seed=0))
    notes = rows.filter(pl.col("baseline") != "team")
    assert set(notes["baseline"]) == {"single", "best_of_k", "self_refine"} and notes["value"].is_null().all()
    assert notes["note"].str.contains("has no single agent").all()


@dataclass
class ArithmeticSampler(FakeSampler):
    """Plays the arithmetic task's prompts ("a+b=" / "a-b="; the Verifier's "Proposed answer:"):
    a right sum with probability `solver_accuracy`, a verdict right with `verifier_accuracy`."""

    def _sample(self, prompt, rng, max_tokens):
        user = prompt.rsplit(ROLE_MARK["user"], 1)[-1]
        a, op, b = re.search(r"(-?\d+)([+-])(\d+)=", prompt).groups()
        x = int(a) + int(b) if op == "+" else int(a) - int(b)
        if "Proposed answer:" in user:
            said = re.search(r"Proposed answer: (.*)\n", user).group(1)
            right = said.strip() == str(x)
            text = "yes" if (right if rng.random() < self.verifier_accuracy else not right) else "no"
        else:
            text = str(x if rng.random() < self.solver_accuracy else x + rng.choice([-2, -1, 1, 2, 10]))
        return Sample([ord(c) for c in text], [-0.5] * len(text), text, "stop")


class FakePool:
    """The engine pool's `get` and `close`, every policy on one scripted sampler."""

    def __init__(self, sampler):
        self.sampler, self.gets, self.options = sampler, 0, {}

    def get(self, policy_id, path, **options):
        self.gets += 1
        return self.sampler

    def close(self):
        pass


def team_store(tmp_path: Path, workflow: str = "math", calls: bool = False, **settings) -> Path:
    """A store as `maxit run` leaves it after round 0: its record (a model folder of its own), the
    evaluation of rounds -1 and 0 and round 0's iid steps (two calls per trajectory)."""
    from pipeline.run.experiment_record import record_experiment
    from pipeline.rollout.synthetic import synthetic_steps
    from pipeline.run.settings import Settings
    from pipeline.store import table_path, write_table

    store, model = tmp_path / "team", tmp_path / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    record_experiment(store, Settings(workflow=workflow, model_dir=str(model), eval_problems=12, eval_samples=2, **settings), "hf")
    for r in (-1, 0):
        rows = [("solver", "accuracy", 0.4 + 0.2 * (r + 1))] + ([("planner", "calls", 1.5), ("mover", "calls", 1.5)] if calls else [])
        ev = pl.DataFrame({"round": [r] * len(rows), "policy_id": "shared", "agent_id": [a for a, _, _ in rows], "split": "heldout",
                           "metric": [m for _, m, _ in rows], "value": [v for _, _, v in rows], "n": 24}, schema_overrides={"round": pl.Int32, "n": pl.Int64})
        write_table(ev, table_path(store, r, "evaluation"), "evaluation")
    steps = synthetic_steps(n_problems=6, samples=2, seed=0, full=True).with_columns(pl.lit(0, pl.Int32).alias("round"))
    write_table(steps, table_path(store, 0, "steps"))
    return store


@pytest.fixture
def fake_tokenizer(monkeypatch):
    import pipeline.models.loading as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda path: TOK)


def test_store_baselines_written_once_and_shown_by_the_report(tmp_path, fake_tokenizer):
    from pipeline.run.arms import compute_baselines, read_baselines
    from pipeline.reporting.markdown import baselines_summary, markdown_round_table

    from pipeline.store.registry import PolicyRegistry

    store = team_store(tmp_path)
    PolicyRegistry(store).register(0, "shared", tmp_path / "model", metrics={"rows": 120.0})  # round 0's trained checkpoint
    pool = FakePool(ArithmeticSampler(solver_accuracy=0.5))
    both = compute_baselines(store, engines=pool)
    assert read_baselines(store) is not None and pool.gets
    # round 0's table: the trained team alone, played as the baselines are
    trained = both.filter(pl.col("round") == 0)
    assert set(trained["baseline"]) == {"team"} and (store / "round=0" / "baselines.parquet").is_file()
    table = both.filter(pl.col("round") == -1)
    by = {(r["baseline"], r["metric"]): r["value"] for r in table.iter_rows(named=True)}
    assert table["team_calls"][0] == 6.0 and table["calls_source"][0].startswith("steps: rows per iid trajectory")
    assert by[("single", "calls")] == 1.0 and by[("best_of_k", "calls")] == 6.0 and by[("self_refine", "calls")] == 6.0
    assert 1.0 <= by[("team", "calls")] <= 4.0  # the Solver/Verifier loop: 2 or 4 calls
    # computed once: a second call reads the table and samples nothing
    again = FakePool(ArithmeticSampler())
    assert compute_baselines(store, engines=again).equals(both) and again.gets == 0
    frame, where = baselines_summary(store)
    assert "6.00 (steps: rows per iid trajectory" in where
    assert frame["who"].to_list()[:4] == ["team, untrained (played as the baselines are)", "single agent, untrained, 1 call per turn",
                                          "single agent, untrained, best-of-6 majority vote", "single agent, untrained, self-refine x6"]
    assert frame["who"].to_list()[4:] == ["team, round 0 (played as the baselines are)", "team, start", "team, round 0"]
    assert frame["note"][6].endswith("; 120 training rows")
    assert frame["success"].to_list()[5:] == pytest.approx([0.4, 0.6])
    text = markdown_round_table(store)
    assert "baselines (the starting model as a single agent at the team's budget;" in text
    assert "| single agent, untrained, best-of-6 majority vote | 6.00 |" in text


def test_store_baselines_for_grid_count_the_evaluations_calls(tmp_path, fake_tokenizer):
    from pipeline.run.arms import compute_baselines, trained_single_settings

    store = team_store(tmp_path, workflow="grid", calls=True)
    table = compute_baselines(store, engines=FakePool(GridOracle(0.6)))
    trained(store, {0: 40})
    by = {(r["baseline"], r["metric"]): r for r in table.iter_rows(named=True)}
    assert by[("best_of_k", "success")]["agent_id"] == "planner" and table["team_calls"][0] == 3.0
    assert table["calls_source"][0].startswith("evaluation: agents' `calls`")
    assert by[("best_of_k", "success")]["value"] is not None and by[("self_refine", "success")]["value"] is not None
    settings, rounds = trained_single_settings(store)
    assert settings.workflow == "pipeline.run.arms:arm_workflow" and settings.workflow_options[:2] == ("of=grid", "arm=single") and rounds == {0: 40}
    from pipeline.run.context import build_workflow

    single = build_workflow(settings.run_config())
    assert isinstance(single, SoloWorkflow) and single.turn_order == ("planner",) and single.echo == ("mover",)


def trained(store: Path, rows: dict[int, int], policies: tuple[str, ...] = ("shared",)) -> None:
    """Register round r's checkpoint of each of `policies` with its share of `rows[r]` training
    rows (the `rows` metric the policy stage registers), rounds' evaluations written as complete."""
    from pipeline.store import table_path, write_table
    from pipeline.store.registry import PolicyRegistry

    folder = store.parent / "model"
    for r, n in rows.items():
        for i, pid in enumerate(policies):
            PolicyRegistry(store).register(r, pid, folder, metrics={"rows": float(n // len(policies) + (n % len(policies) if i == 0 else 0)), "steps": 2.0})
        if not (store / f"round={r}" / "evaluation.parquet").exists():
            ev = pl.DataFrame({"round": [r], "policy_id": "shared", "agent_id": "solver", "split": "heldout", "metric": "accuracy", "value": 0.5, "n": 24},
                              schema_overrides={"round": pl.Int32, "n": pl.Int64})
            write_table(ev, table_path(store, r, "evaluation"), "evaluation")


def test_trained_single_of_math_is_the_single_workflow_at_the_teams_rows(tmp_path, fake_tokenizer):
    from pipeline.run.arms import compute_baselines, train_rows, trained_single_settings

    store = team_store(tmp_path, problems=64)
    compute_baselines(store, engines=FakePool(ArithmeticSampler()))
    with pytest.raises(DataError, match=r"round\(s\) \[0\] have no training rows in the policy registry"):
        trained_single_settings(store)
    trained(store, {0: 301, 1: 455}, policies=("solver", "verifier"))  # the team's rows of each round, summed over its policies
    assert train_rows(store) == {0: 301, 1: 455}
    settings, rows = trained_single_settings(store)
    # sampled at about the team's calls (6 per episode, 1 single call) and cut to the team's rows per round
    assert (settings.workflow, settings.problems, rows) == ("single", 384, {0: 301, 1: 455})
    assert trained_single_settings(store, problems=100)[0].problems == 100  # --single-problems: e.g. as many sampled rows as the team's
    with pytest.raises(ConfigError, match="problems per round must be a whole number >= 1, got 0"):
        trained_single_settings(store, problems=0)


def test_match_rows_keeps_a_seeded_subset_of_exactly_the_teams_rows():
    import pyarrow as pa

    from pipeline.run.arms import match_rows, match_seed

    view = pa.table({"step_id": [f"s{i}" for i in range(50)], "x": list(range(50))}).replace_schema_metadata({"k": "v"})
    kept = match_rows(view, 20, match_seed(0, 1))
    ids = kept.column("x").to_pylist()
    assert kept.num_rows == 20 and len(set(ids)) == 20 and ids == sorted(ids) and kept.schema.metadata == {b"k": b"v"}
    assert match_rows(view, 20, match_seed(0, 1)).equals(kept)  # the same seed, the same rows
    assert match_rows(view, 20, match_seed(1, 1)).column("x").to_pylist() != ids  # another run seed, another subset
    assert match_rows(view, 20, match_seed(0, 2)).column("x").to_pylist() != ids  # another round, another subset
    assert match_rows(view, 50, 0).equals(view) and match_rows(view, 80, 0).equals(view)  # no more rows than the view has
    assert match_rows(view, 0, 0).num_rows == 0
    with pytest.raises(Exception, match="rows must be >= 0"):
        match_rows(view, -1, 0)


def test_the_trained_single_agents_rounds_train_the_teams_rows(tmp_path, fake_tokenizer, monkeypatch, capfd):
    """`maxit baselines --trained-single`'s rounds: each round's sampled view cut to the team's rows
    of that round before its policy stage reads it; a complete round kept. The stages are stand-ins
    (the real ones are `maxit run`'s) that write a view of 100 + r rows and train what they read."""
    import pyarrow.parquet as pq

    import assets.jobs as jobs
    from maxit.baseline_commands import _run_single
    from pipeline.learn.views import STATS_METADATA_KEY
    from pipeline.run.arms import compute_baselines, single_store, train_rows, trained_single_settings
    from pipeline.store import Tables

    store = team_store(tmp_path, problems=8)
    compute_baselines(store, engines=FakePool(ArithmeticSampler()))
    trained(store, {0: 37, 1: 120})  # round 1: more rows than the single agent's view will have
    staged = []

    def materialize(instance, tables, r, settings, engine, quiet, stages=None):
        staged.append((r, stages))
        if stages[0] == "problems":
            view = synthetic_view(100 + r, r)
            tables.write(r, "training_view", view.replace_schema_metadata({STATS_METADATA_KEY: b'{"n_rows": %d}' % view.num_rows}))
            return
        assert stages == ("policy", "evaluation")
        view = pq.read_table(tables.path(r, "training_view"))
        trained(tables.root, {r: view.num_rows}, policies=("shared",))

    monkeypatch.setattr(jobs, "materialize_round", materialize)
    _run_single(store, single_store(store), *trained_single_settings(store))
    sibling = single_store(store)
    assert train_rows(sibling) == {0: 37, 1: 101}  # the team's 37, and all 101 of a view short of the team's 120
    assert [s[0] for s in staged] == [0, 0, 1, 1]
    kept = pq.read_table(sibling / "round=0" / "training_view.parquet")
    assert kept.schema.metadata[STATS_METADATA_KEY] == b'{"n_rows": 100}'  # the view's own statistics kept beside the cut
    out = capfd.readouterr().out
    assert "round 0: trained 37 of its 100 rows (the team's round 0: 37 rows)" in out and "round 1: trained 101 of its 101 rows" in out
    assert json.loads((sibling / "experiment.json").read_text())["settings"]["workflow"] == "single"
    staged.clear()
    _run_single(store, sibling, *trained_single_settings(store))  # resumed: complete rounds are kept
    assert staged == [] and "round 1 already complete" in capfd.readouterr().out
    from pipeline.reporting.markdown import baselines_summary

    frame, _ = baselines_summary(store)
    note = frame.filter(pl.col("who") == "trained single agent, round 1")["note"][0]
    assert "training rows per round (its/the team's): 0: 37/37, 1: 101/120; in all 138/157" in note


def synthetic_view(n: int, r: int):
    """A `training_view` table of `n` rows of round `r`."""
    import pyarrow as pa

    from schemas import TRAINING_VIEW

    cols = {"step_id": [f"r{r}-s{i}" for i in range(n)], "policy_id": ["shared"] * n, "agent_id": ["solver"] * n, "strategy": ["iid"] * n,
            "train_prompt_ids": [[1, 2]] * n, "completion_ids": [[3]] * n, "sampling_logprobs": [[-0.5]] * n, "advantage": [1.0] * n,
            "sample_weight": [1.0] * n, "reward": [1.0] * n, "context_swapped": [False] * n, "round": [r] * n, "turn": [0] * n, "temperature": [1.0] * n}
    return pa.table(cols, schema=TRAINING_VIEW.schema)


def test_bad_input_is_one_line(tmp_path):
    store = team_store(tmp_path)
    for path in (store / "round=-1" / "evaluation.parquet", store / "round=0" / "evaluation.parquet"):
        path.unlink()
    for argv, message in (
        (["--store", str(store)], f"maxit baselines: error: store {store}: no evaluation table (run `maxit run --store {store}` first)"),
        (["--store", str(tmp_path / "nowhere")], f"maxit baselines: error: store {tmp_path / 'nowhere'}: not a store"),
        (["--store", str(store), "--single-problems", "5"], "maxit baselines: error: --single-problems is the trained arms': give it with --arm (or --trained-single)"),
        (["--store", str(store), "--arm", "twin"], "maxit baselines: error: --arm must be one of single, protocol, separate, shared, wide, got 'twin'"),
        (["--store", str(store), "--store", str(store)], f"maxit baselines: error: --store: {store} is given twice"),
        (["--store", str(store), "--trained-single", "--single-problems", "0"], "maxit baselines: error: --single-problems must be >= 1, got 0"),
    ):
        proc = subprocess.run([MAXIT, "baselines", *argv], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and proc.stderr.startswith(message) and proc.stderr.count("\n") == 1 and proc.stdout == "", proc.stderr


def test_a_team_whose_calls_cannot_be_counted_is_named(tmp_path, fake_tokenizer):
    from pipeline.run.arms import compute_baselines

    store = team_store(tmp_path)
    (store / "round=0" / "steps.parquet").unlink()
    with pytest.raises(DataError, match="the team's calls per problem cannot be derived: its evaluation has no `calls` rows"):
        compute_baselines(store, engines=FakePool(ArithmeticSampler()))
    assert not (store / "round=-1" / "baselines.parquet").exists()
