"""The arms of a team (`maxit baselines --arm`, `pipeline.run.arms`, `pipeline.rollout.budget_matched`)
and the verdict (`pipeline.reporting.verdict`): each arm is what it claims (one agent on the team's
protocol, the team's other policy layout, the single agent doing the job), trains the team's rows,
is played on the team's held-out problems with the team's draws and calls; vote ties go to the
most likely sample; the verdict says pays / does not pay / no difference against 2 standard errors
in one store and against the seed spread over several."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

import test_baselines as tb
from fakes import ROLE_MARK, FakeSampler, FakeTokenizer
from pipeline.errors import ConfigError
from pipeline.rollout.agent import Agent
from pipeline.rollout.budget_matched import baseline_rows, calls_per_call, majority, play
from pipeline.rollout.workflow import ProtocolWorkflow, SoloWorkflow
from pipeline.types import Sample
from pipeline.workflows.grid import GridWorkflow
from pipeline.workflows.grid.game import MOVER, PLANNER, parse_puzzle

TOK = FakeTokenizer()
fake_tokenizer = tb.fake_tokenizer  # the fixture, under its name here


def test_vote_ties_go_to_the_most_likely_sample():
    assert majority(["4", "3", "3", "4"], [-5.0, -1.0, -9.0, -2.0]) == 1  # a tie: the most likely sample (key 3) is played
    assert majority(["4", "3", "3", "4"], [-3.0, -5.0, -9.0, -1.0]) == 3  # ... its own sample, not the key's first
    assert majority(["4", "3", "3"], [-0.1, -9.0, -9.0]) == 1  # no tie: the most frequent answer, however unlikely
    assert majority(["4", None, "3"], [-2.0, -0.1, float("nan")]) == 0  # no key does not vote; NaN is least likely
    assert majority(["4", "3"], [-1.0, -1.0]) == 0  # equal likelihoods: the first sampled
    assert majority(["4", "3", "3", "4"]) == 0  # without likelihoods: the first sampled, as before
    with pytest.raises(ValueError, match="2 keys but 1 likelihoods"):
        majority(["4", "3"], [-1.0])


@dataclass
class SplitVote:
    """Two samples per call on the grid: a wrong move first and unlikely, the right one second and
    likely; one sample per call: the wrong move."""

    engine: str = "fake"
    model_dir: Path = Path("fake")
    model_version: str = "fake-v0"

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        out = []
        for ids in prompt_ids:
            puzzle = parse_puzzle(TOK.decode(ids).rsplit(ROLE_MARK["user"], 1)[-1].split("\x04")[0].split("\n", 1)[1])
            right = sorted(puzzle.optimal_moves(puzzle.start))[0]
            wrong = next(m for m in "UDLR" if m not in puzzle.optimal_moves(puzzle.start))
            row = [Sample([ord(wrong)], [-5.0], wrong, "stop"), Sample([ord(right)], [-0.1], right, "stop")]
            out.append(row[:n] if n > 1 else row[:1])
        return out


def test_the_grid_vote_breaks_a_tie_by_likelihood_not_by_the_first_sample():
    grid = GridWorkflow()
    single = grid.single_agent()
    problems = grid.problems("heldout", 10, 3)
    args = dict(samples=1, temperature=1.0, max_tokens=4, seed=2)
    assert play(single, problems, SplitVote(), TOK, mode="plain", **args).success == 0.0
    assert play(single, problems, SplitVote(), TOK, mode="vote", m=2, **args).success == 1.0  # 1-1 ties, the likely move played


def test_a_team_of_separate_policies_plays_each_seat_with_its_own_weights():
    relay = tb.Relay()
    relay.agents = (Agent("a", policy_id="a"), Agent("b", policy_id="b"))
    samplers = {"a": FakeSampler(), "b": FakeSampler()}
    rows = baseline_rows(relay, None, relay.problems("heldout", 3, 0), lambda agent: (samplers[agent], TOK), k=2.0, source="test",
                         samples=1, temperature=1.0, max_tokens=lambda w: 16, seed=0, team_only=True)
    assert [len(c.prompts) for c in samplers["a"].calls] == [3] and [len(c.prompts) for c in samplers["b"].calls] == [3]
    assert {r["metric"]: r["value"] for r in rows}["calls"] == 2.0


@dataclass
class Recorder(tb.GridOracle):
    """The grid oracle, recording every call's prompts and seeds."""

    seen: list = field(default_factory=list)

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.seen.append(([TOK.decode(p) for p in prompt_ids], n, list(seed) if isinstance(seed, list) else seed))
        return super().generate(prompt_ids, n, temperature, max_tokens, seed)


def test_the_protocol_is_the_teams_seats_by_one_agent_with_the_teams_calls_and_draws():
    grid = GridWorkflow()
    protocol = ProtocolWorkflow(grid)
    assert protocol.turn_order == (PLANNER,) and [a.agent_id for a in protocol.agents] == [PLANNER] and protocol.seats == (PLANNER, MOVER)
    assert protocol.name == "grid-protocol" and protocol.echo == ()
    problems = grid.problems("heldout", 12, 3)
    args = dict(samples=2, temperature=1.0, max_tokens=4, seed=7)
    team_engine, protocol_engine = Recorder(0.6), Recorder(0.6)
    team = play(grid, problems, team_engine, TOK, **args)
    alone = play(protocol, problems, protocol_engine, TOK, **args)
    # the same prompts in the same seats with the same seeds: one agent in the team's protocol is the team, untrained
    assert protocol_engine.seen == team_engine.seen and alone == team
    assert alone.calls == team.calls and alone.calls > 2  # two calls a turn, planner's seat then mover's


def test_tool_plans_single_agent_answers_directly_and_its_protocol_runs_the_program():
    pytest.importorskip("reasoning_gym")
    from pipeline.run.arms import arm_workflow
    from pipeline.workflows import load_workflow
    from pipeline.workflows.reasoning_gym.tool_plan import TOOL

    team = load_workflow("reasoning_gym", dataset="basic_arithmetic", team="tool_plan", allow_unisolated_network=True, shared_policy=False)
    single = team.single_agent()
    assert not isinstance(single, SoloWorkflow) and single.turn_order == (PLANNER,)
    assert single.agents[0].policy_id == "planner"  # the plan agent's weights, under its id
    problem = single.problems("heldout", 1, 0)[0]
    seen = single.reset(problem, None).observe(PLANNER)
    assert len(seen) == 1 and seen[0]["content"].startswith(problem.question) and "program" not in seen[0]["content"]
    protocol = arm_workflow(of="reasoning_gym", arm="protocol", dataset="basic_arithmetic", team="tool_plan", allow_unisolated_network=True)
    assert isinstance(protocol, ProtocolWorkflow) and protocol.seats == (TOOL, PLANNER) and protocol.turn_order == (TOOL,)


def test_arm_settings_name_the_arms_workflow_layout_problems_and_the_teams_rows(tmp_path, fake_tokenizer):
    from pipeline.run.arms import arm_settings, compute_baselines
    from pipeline.run.context import build_workflow

    store = tb.team_store(tmp_path, workflow="grid", calls=True, problems=64)
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))
    tb.trained(store, {0: 40, 1: 52})
    settings, rows = arm_settings(store, "protocol")
    assert (settings.workflow, settings.workflow_options[:2], settings.problems, rows) == ("pipeline.run.arms:arm_workflow", ("of=grid", "arm=protocol"), 64, {0: 40, 1: 52})
    built = build_workflow(settings.run_config())
    assert isinstance(built, ProtocolWorkflow) and built.seats == (PLANNER, MOVER) and built.policy_ids == ("shared",)
    settings, rows = arm_settings(store, "separate")
    assert (settings.workflow, settings.shared_policy, settings.problems, rows) == ("grid", False, 64, {0: 40, 1: 52})
    assert build_workflow(settings.run_config()).policy_ids == (PLANNER, MOVER)
    with pytest.raises(ConfigError, match="the team already trains one shared policy: it is arm 'shared' itself; its other layout is arm 'separate'"):
        arm_settings(store, "shared")
    with pytest.raises(ConfigError, match="arm must be one of"):
        arm_settings(store, "twin")
    # the math team's protocol: its task by name, the Solver taking the Verifier's seat
    math_store = tb.team_store(tmp_path / "m")
    tb.trained(math_store, {0: 30})
    settings, rows = arm_settings(math_store, "protocol")
    assert "task=arithmetic" in settings.workflow_options and rows == {0: 30}
    built = build_workflow(settings.run_config())
    assert built.seats == ("solver", "verifier") and built.team.task.name == "arithmetic"


def stand_in_stages(monkeypatch, staged: list) -> None:
    """`maxit run`'s stages replaced: the sampling stages write a view of 100 + r rows of every
    policy of the run's workflow, the policy stage registers what it reads (per policy)."""
    import pyarrow.parquet as pq

    import assets.jobs as jobs
    from pipeline.learn.views import STATS_METADATA_KEY
    from pipeline.run.context import build_workflow

    def materialize(instance, tables, r, settings, engine, quiet, stages=None):
        staged.append((r, stages))
        policies = build_workflow(settings.run_config()).policy_ids
        if stages[0] == "problems":
            view = tb.synthetic_view(100 + r, r)
            view = view.set_column(view.schema.get_field_index("policy_id"), "policy_id",
                                   __import__("pyarrow").array([policies[i % len(policies)] for i in range(view.num_rows)]))
            tables.write(r, "training_view", view.replace_schema_metadata({STATS_METADATA_KEY: b'{"n_rows": %d}' % view.num_rows}))
            return
        view = pq.read_table(tables.path(r, "training_view"))
        counts = view.group_by("policy_id").aggregate([("step_id", "count")]).to_pylist()
        from pipeline.store.registry import PolicyRegistry

        for c in counts:
            PolicyRegistry(tables.root).register(r, c["policy_id"], tables.root.parent / "model", metrics={"rows": float(c["step_id_count"]), "steps": 1.0})
        from pipeline.store import table_path, write_table

        ev = pl.DataFrame({"round": [r], "policy_id": "shared", "agent_id": "team", "split": "heldout", "metric": "success", "value": 0.5, "n": 24},
                          schema_overrides={"round": pl.Int32, "n": pl.Int64})
        write_table(ev, table_path(tables.root, r, "evaluation"), "evaluation")

    monkeypatch.setattr(jobs, "materialize_round", materialize)


@pytest.mark.parametrize("arm", ["protocol", "separate"])
def test_an_arm_trains_exactly_the_teams_rows_of_each_round(tmp_path, fake_tokenizer, monkeypatch, capfd, arm):
    from maxit.baseline_commands import _run_arm
    from pipeline.run.arms import arm_settings, arm_store, compute_baselines, train_rows

    store = tb.team_store(tmp_path, workflow="grid", calls=True, problems=16)
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))
    tb.trained(store, {0: 37, 1: 90})
    staged: list = []
    stand_in_stages(monkeypatch, staged)
    _run_arm(store, arm_store(store, arm), arm, *arm_settings(store, arm))
    sibling = arm_store(store, arm)
    assert sibling.name == f"team-{arm}" and train_rows(sibling) == {0: 37, 1: 90}  # summed over its policies, equal to the team's
    recorded = json.loads((sibling / "experiment.json").read_text())["settings"]
    if arm == "separate":
        assert recorded["workflow"] == "grid" and recorded["shared_policy"] is False
        from pipeline.store.registry import PolicyRegistry

        assert {rec.policy_id for rec in PolicyRegistry(sibling).records()} == {PLANNER, MOVER}
    else:
        assert recorded["workflow"] == "pipeline.run.arms:arm_workflow" and "arm=protocol" in recorded["workflow_options"]
    out = capfd.readouterr().out
    assert "round 0: trained 37 of its 100 rows (the team's round 0: 37 rows)" in out


def test_trained_arms_are_played_on_the_teams_problems_and_draws_and_judged(tmp_path, fake_tokenizer, monkeypatch, capsys):
    from maxit.baseline_commands import _run_arm
    from pipeline.run.arms import arm_settings, arm_store, compute_arm_baselines, compute_baselines
    from pipeline.reporting.markdown import baselines_markdown
    from pipeline.reporting.verdict import arm_results

    store = tb.team_store(tmp_path, workflow="grid", calls=True, problems=16)
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))
    tb.trained(store, {0: 37})
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))  # the trained team's round-0 row
    stand_in_stages(monkeypatch, [])
    for arm in ("protocol", "single"):
        _run_arm(store, arm_store(store, arm), arm, *arm_settings(store, arm, problems=8))
        compute_arm_baselines(store, arm, engines=tb.FakePool(tb.GridOracle(0.6)))
    team, arms = arm_results(store)
    by = {a.arm: a for a in arms}
    assert set(by) == {"protocol", "single", "single_best_of_k", "single_self_refine"} and set(team) == {0}
    # every checkpoint is the same engine here: the protocol played with the team's draws is the team
    assert (by["protocol"].success, by["protocol"].calls, by["protocol"].n) == (team[0].success, team[0].calls, team[0].n)
    k = 3.0  # the team's calls per problem (the evaluation's, planner 1.5 + mover 1.5)
    m = calls_per_call(k, by["single"].calls)
    assert by["single_best_of_k"].calls == pytest.approx(m * by["single"].calls) and by["single_self_refine"].calls == pytest.approx(m * by["single"].calls)
    text = "\n".join(baselines_markdown(store))
    assert "| the team's protocol played by one trained agent | " in text
    assert f"- against the team's protocol played by one trained agent: no difference: {100 * team[0].success:.1f} against {100 * team[0].success:.1f}, +0.0 points" in text
    assert "verdict of store" in text and "in short: " in text
    # computed once: a second call reads the table back and samples nothing
    again = tb.FakePool(tb.GridOracle(0.6))
    compute_arm_baselines(store, "protocol", engines=again)
    assert again.gets == 0
    # the study script: the arms' rows per round and the verdict over the stores given (one here: no seed spread to judge by)
    import importlib.util

    spec = importlib.util.spec_from_file_location("teams_study", Path(__file__).resolve().parents[1] / "scripts" / "teams_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    study.main([str(store)])
    out = capsys.readouterr().out
    assert "| round | team's training rows | the trained single agent's | the team's protocol played by one trained agent's |" in out
    assert "| 0 | 37 (37..37) | 37 (37..37) | 37 (37..37) |" in out
    assert "- against the team's protocol played by one trained agent: no verdict over seeds (one store): the team " in out


def test_eval_problems_plays_the_team_and_its_arms_on_that_many_problems_and_judges_one_number(tmp_path, fake_tokenizer, monkeypatch):
    from maxit.baseline_commands import _run_arm
    from pipeline.run.arms import arm_settings, arm_store, compute_arm_baselines, compute_baselines, read_baselines
    from pipeline.reporting.verdict import arm_results, verdict_across, verdict_lines

    store = tb.team_store(tmp_path, workflow="grid", calls=True, problems=16)  # its evaluation: 12 held-out problems x 2 samples
    tb.trained(store, {0: 37})
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))
    assert set(read_baselines(store)["n"].to_list()) == {24}
    stand_in_stages(monkeypatch, [])
    _run_arm(store, arm_store(store, "protocol"), "protocol", *arm_settings(store, "protocol"))
    compute_arm_baselines(store, "protocol", engines=tb.FakePool(tb.GridOracle(0.6)))
    # the team played again on 20 problems; the arm, still on 12, is not judged against it
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)), problems=20)
    table = read_baselines(store)
    assert set(table.filter(pl.col("value").is_not_null())["n"].to_list()) == {40} and set(table["round"].to_list()) == {-1, 0}
    text = "\n".join(verdict_lines(store))
    assert "no verdict: the team was played on 40 episodes, the arm on 24" in text and "--eval-problems N" in text
    assert "no verdict: store" in "\n".join(verdict_across([store, store]))
    # the arm played on the same 20: the same problems and draws as the team's (one engine here: the same success)
    compute_arm_baselines(store, "protocol", engines=tb.FakePool(tb.GridOracle(0.6)), problems=20)
    team, arms = arm_results(store)
    assert [(a.arm, a.n, a.success) for a in arms] == [("protocol", 40, team[0].success)]
    assert "- against the team's protocol played by one trained agent: no difference" in "\n".join(verdict_lines(store))
    # kept when played on that number already; played again on another
    again = tb.FakePool(tb.GridOracle(0.6))
    compute_baselines(store, engines=again, problems=20)
    compute_arm_baselines(store, "protocol", engines=again, problems=20)
    assert again.gets == 0
    compute_baselines(store, engines=again)  # no number asked: what is there is kept
    assert again.gets == 0
    with pytest.raises(ConfigError, match=r"--eval-problems must be an integer >= 1, got 0"):
        compute_baselines(store, engines=again, problems=0)


def result(arm: str, success: float, n: int = 400, round_: int = 4):
    from pipeline.reporting.verdict import ArmResult

    return ArmResult(arm, {"team": "the team", "single": "the trained single agent, 1 call", "protocol": "the protocol"}[arm], round_, success, n, 2.0)


def test_one_stores_verdict_weighs_the_difference_against_two_standard_errors(monkeypatch):
    import pipeline.reporting.verdict as report

    monkeypatch.setattr(report, "arm_results", lambda store: ({4: result("team", 0.80)}, [result("single", 0.70), result("protocol", 0.79)]))
    lines = report.verdict_lines("S")
    se = 200 * math.sqrt(0.8 * 0.2 / 400 + 0.7 * 0.3 / 400)
    assert lines[1] == f"- against the trained single agent, 1 call: the team pays: 80.0 against 70.0, +10.0 points (2 se = {se:.1f}, 2.00 against 2.00 calls); round 4"
    assert lines[2].startswith("- against the protocol: no difference: 80.0 against 79.0, +1.0 points")
    assert lines[3] == "in short: the team pays against the trained single agent, 1 call; no difference against the protocol"
    monkeypatch.setattr(report, "arm_results", lambda store: ({4: result("team", 0.60)}, [result("single", 0.75)]))
    assert report.verdict_lines("S")[1].startswith("- against the trained single agent, 1 call: the team does not pay: 60.0 against 75.0, -15.0 points")
    monkeypatch.setattr(report, "arm_results", lambda store: ({}, []))
    assert report.verdict_lines("S")[0].startswith("verdict of store S: no trained arm to judge the team against yet: maxit baselines --store S --arm single")


def test_the_verdict_over_seeds_is_no_difference_inside_the_seed_spread(monkeypatch):
    import pipeline.reporting.verdict as report

    seeds = {
        "A": ({4: result("team", 0.80)}, [result("single", 0.70), result("protocol", 0.79)]),
        "B": ({4: result("team", 0.82)}, [result("single", 0.72), result("protocol", 0.83)]),
        "C": ({4: result("team", 0.81)}, [result("single", 0.71), result("protocol", 0.80)]),
    }
    monkeypatch.setattr(report, "arm_results", lambda store: seeds[str(store)])
    lines = report.verdict_across(["A", "B", "C"])
    assert lines[1] == "- against the trained single agent, 1 call: the team pays: the team 81.0 (80.0..82.0) against 71.0 (70.0..72.0), difference +10.0 (+10.0..+10.0)"
    assert lines[2].startswith("- against the protocol: no difference: the team 81.0 (80.0..82.0) against 80.7 (79.0..83.0)")
    seeds["B"] = ({4: result("team", 0.82)}, [result("single", 0.72)])  # an arm one store lacks is named, not averaged over fewer
    assert report.verdict_across(["A", "B", "C"])[2] == "- against the protocol: no verdict: store B has no played arm row"


def test_the_verdict_over_seeds_names_each_stores_k_where_the_votes_differ(monkeypatch):
    import pipeline.reporting.verdict as report
    from pipeline.reporting.verdict import PLAYED_ARMS, ArmResult

    def vote(m: int, success: float) -> ArmResult:
        return ArmResult("wide_best_of_k", PLAYED_ARMS["wide_best_of_k"].format(m=m), 4, success, 400, float(m))

    seeds = {"A": ({4: result("team", 0.70)}, [vote(3, 0.80)]), "B": ({4: result("team", 0.71)}, [vote(2, 0.81)]),
             "C": ({4: result("team", 0.72)}, [vote(3, 0.82)])}
    monkeypatch.setattr(report, "arm_results", lambda store: seeds[str(store)])
    assert report.verdict_across(["A", "B", "C"])[1].startswith(
        "- against the trained single agent with the team's parameters, best-of-k vote at the team's calls (k = 3, 2, 3 by store): "
        "the team does not pay")
    seeds["B"] = ({4: result("team", 0.71)}, [vote(3, 0.81)])  # one k everywhere: the label as it is
    assert report.verdict_across(["A", "B", "C"])[1].startswith(
        "- against the trained single agent with the team's parameters, best-of-3 vote at the team's calls: the team does not pay")


def test_the_wide_arm_is_the_single_agent_on_a_model_of_the_teams_parameters(tmp_path, fake_tokenizer, monkeypatch):
    import pipeline.workflows.grid.model as grid_model
    from pipeline.models.build import ModelConfig, count_parameters, untrained_model
    from pipeline.run.arms import arm_settings, compute_baselines
    from pipeline.run.context import build_workflow

    store = tb.team_store(tmp_path, workflow="grid", calls=True, problems=64)
    compute_baselines(store, engines=tb.FakePool(tb.GridOracle(0.6)))
    tb.trained(store, {0: 40})
    with pytest.raises(ConfigError, match=f"the team starts from --model {tmp_path / 'model'}, not a model its workflow builds in code: it has no wide arm"):
        arm_settings(store, "wide")
    record = json.loads((store / "experiment.json").read_text())
    record["settings"]["model_dir"] = None  # the team on the workflow's own embedded model
    (store / "experiment.json").write_text(json.dumps(record))
    settings, rows = arm_settings(store, "wide")
    single, _ = arm_settings(store, "single")
    assert settings.workflow_options == (single.workflow_options[0], "arm=wide", *single.workflow_options[2:], "model_scale=2")
    assert settings.problems == single.problems and rows == {0: 40}  # sampled as the single agent is, cut to the team's rows
    wide = build_workflow(settings.run_config())
    assert isinstance(wide, SoloWorkflow) and wide.turn_order == (PLANNER,) and wide.echo == (MOVER,)  # the single agent, committing moves
    built = []
    monkeypatch.setattr(grid_model, "build_grid_model", lambda cache_dir, game, warm, model_config=None: built.append(model_config) or Path("m"))
    wide.default_model()
    assert built[0].num_layers == 2 * ModelConfig.num_layers
    # about the parameters of two policies of the default model
    tok = grid_model.build_grid_tokenizer()
    sizes = [count_parameters(untrained_model(c, tok, tmp_path / f"m{i}")[1]) for i, c in enumerate((ModelConfig(), built[0]))]
    assert 1.9 < sizes[1] / sizes[0] < 2.05, sizes
    math_store = tb.team_store(tmp_path / "m")
    tb.trained(math_store, {0: 30})
    record = json.loads((math_store / "experiment.json").read_text())
    record["settings"]["model_dir"] = None
    (math_store / "experiment.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="workflow 'math' does not scale its embedded model"):
        arm_settings(math_store, "wide")


def test_the_study_script_names_an_arm_some_stores_lack_and_leaves_it_out_when_asked(monkeypatch, capsys):
    import importlib.util

    import polars as pl

    import pipeline.reporting.markdown as markdown

    blocks = {
        "A": [("the team, round 4", 0.75, 2.9), ("the protocol", 0.74, 3.0), ("the team, a trained policy per agent", 0.70, 2.9),
              ("the trained single agent, best-of-3 vote at the team's calls", 0.9, 3.0), ("single agent, untrained, self-refine x2", 0.1, 2.0)],
        "B": [("the team, round 4", 0.76, 2.9), ("the protocol", 0.73, 3.0),
              ("the trained single agent, best-of-4 vote at the team's calls", 0.8, 4.0), ("single agent, untrained, self-refine x2", 0.2, 2.0)],
    }
    monkeypatch.setattr(markdown, "baselines_summary", lambda store: (pl.DataFrame(
        [{"who": w, "success": s, "calls": c} for w, s, c in blocks[str(store)]]),))
    spec = importlib.util.spec_from_file_location("teams_study", Path(__file__).resolve().parents[1] / "scripts" / "teams_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    with pytest.raises(SystemExit, match="arm 'the team, a trained policy per agent' is in 1 of the 2 stores"):
        study.arms([Path("A"), Path("B")])
    kept = study.arms([Path("A"), Path("B")], partial=True)
    # a vote of 3 calls in one store and 4 in another (each store's team calls) is one arm, its k named by store
    assert [name for name, _, _ in kept] == ["the team, last round", "the protocol", "the trained single agent, best-of-k vote at the team's calls (k = 3, 4 by store)",
                                             "single agent, untrained, self-refine x2"]
    assert kept[1][1] == [0.74, 0.73] and kept[2][1] == [0.9, 0.8]
    assert "left out, in 1 of the 2 stores: the team, a trained policy per agent" in capsys.readouterr().err
