import dataclasses
import math
import time
from collections import Counter, defaultdict

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from fakes import FakeSampler, FakeTask
from pipeline.rollout.agent import Agent
from pipeline.workflows.math.orchestra import default_agents
from pipeline.workflows.math import MathWorkflow
from pipeline.errors import ConfigError, DataError
from pipeline.models.chat import encode_prompt, prompt_hash
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig, merge_shards, plan_call, request_seed, shard_of
from pipeline.store import read_table
from pipeline.strategies import IID, Feedback, PromptAug, Tree
from schemas import STEPS, validate

ALL = (IID(group_size=4), PromptAug(group_size=3), Feedback(group_size=4), Tree(group_size=3))


class RecordingSampler(FakeSampler):
    """Remembers every Sample it returned, to check rows carry them verbatim and exactly once."""

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        out = super().generate(prompt_ids, n, temperature, max_tokens, seed)
        self.returned = getattr(self, "returned", []) + [(list(p), s) for p, row in zip(prompt_ids, out) for s in row]
        return out


def run(strategies=ALL, n_problems=5, sampler=None, config=None, task=None, agents=None, keep_uids=None, loops=2):
    task = task or FakeTask()
    sampler = sampler or RecordingSampler()
    problems = task.problems("train", n_problems, 0)
    if keep_uids is not None:
        problems = [p for p in problems if p.uid in keep_uids]
    workflow = MathWorkflow(task, agents or default_agents(), max_loop_num=loops)
    table = run_rollouts(problems, workflow, list(strategies), sampler, config or RolloutConfig())
    return table, pl.from_arrow(table), sampler


@pytest.mark.parametrize("strategy", ALL, ids=lambda s: s.strategy_id)
def test_every_strategy_produces_valid_documented_rows(strategy):
    table, df, _ = run([strategy])
    validate(table, STEPS)
    assert table.column_names == STEPS.schema.names
    assert set(df["strategy"]) == {strategy.strategy_id}
    assert set(df["agent_id"]) == {"solver", "verifier"}
    assert df["active"].all()
    assert df["step_id"].n_unique() == df.height
    assert (df["node_id"] == df["step_id"]).all()
    assert (df["step"] == 2 * df["turn"] + (df["agent_id"] == "verifier").cast(pl.Int32)).all()
    assert set(df["model_version"]) == {"fake-v0"} and set(df["engine"]) == {"fake"}


def test_rows_keep_exact_prompts_and_verbatim_completions():
    table, df, sampler = run()
    tok = sampler.tokenizer
    for row in df.iter_rows(named=True):
        assert row["prompt_ids"] == encode_prompt(tok, row["sampling_messages"])
        assert row["prompt_hash"] == prompt_hash(row["prompt_ids"])
        assert len(row["completion_ids"]) == len(row["completion_logprobs"])
        assert row["completion_text"] == tok.decode([t for t in row["completion_ids"] if t != 0])
    # every Sample the engine returned is one row, ids and logprobs unchanged (float32 storage)
    f32 = lambda xs: tuple(np.asarray(xs, dtype=np.float32).tolist())  # noqa: E731
    returned = Counter((tuple(p), tuple(s.token_ids), f32(s.logprobs)) for p, s in sampler.returned)
    stored = Counter((tuple(r["prompt_ids"]), tuple(r["completion_ids"]), f32(r["completion_logprobs"])) for r in df.iter_rows(named=True))
    assert returned == stored
    assert table.schema.field("completion_logprobs").type == pa.list_(pa.float32())


def test_engine_calls_per_agent_step_carry_request_seeds():
    table, df, sampler = run(n_problems=7)
    steps = sorted(set(df["step"]))
    # one engine call per distinct request size of an agent step, each prompt with its own seed
    calls_rows = sum(len(call.prompts) * call.n for call in sampler.calls)
    assert calls_rows == df.height
    for call in sampler.calls:
        assert isinstance(call.seed, list) and len(call.seed) == len(call.prompts)
        assert len({call.n}) == 1
    assert len(sampler.calls) >= len(steps)
    for row in df.select("step", "seed").unique().iter_rows(named=True):
        assert 0 <= row["seed"] < 2**31 - 1
    # merged requests: the first Solver step sends each problem's distinct prompt once, n = its count
    first_step = df.filter(pl.col("step") == 0)
    assert first_step["seed"].n_unique() == first_step.select("uid", "prompt_hash").n_unique()
    # a request's seed is request_seed of its first traj_uid
    iid0 = df.filter((pl.col("strategy") == "iid") & (pl.col("step") == 0) & (pl.col("sample_idx") == 0))
    for row in iid0.iter_rows(named=True):
        assert row["seed"] == request_seed(0, 0, 0, row["traj_uid"])


def test_a_batching_engine_gets_each_agent_step_as_one_batch_and_the_same_rows():
    """An engine with `generate_calls` receives an agent step's requests of every count together,
    and the rows are those of the same requests sent one count at a time."""

    class Batching(RecordingSampler):
        def generate_calls(self, calls):
            self.batches = getattr(self, "batches", []) + [[c.n for c in calls]]
            return [self.generate(*c) for c in calls]

    _, plain, one_at_a_time = run(n_problems=5)
    _, batched, sampler = run(n_problems=5, sampler=Batching())
    assert batched.equals(plain)
    mixed = [b for b in sampler.batches if len(b) > 1]
    assert mixed and all(sorted(b) == b and len(set(b)) == len(b) for b in mixed)  # counts, each once
    steps = batched["step"].n_unique()
    assert len(one_at_a_time.calls) > steps  # the plain engine got more than one call in some step
    # every step reaches the batching engine in one call (a single count needs no batching)
    assert len(sampler.batches) + sum(1 for c in sampler.calls) - sum(len(b) for b in sampler.batches) == steps


def test_request_seeds_do_not_depend_on_the_other_problems():
    """The rows of a problem are the same whether it is sampled alone or with others (shards)."""
    class PositionFree(FakeSampler):
        def generate(self, prompt_ids, n, temperature, max_tokens, seed):
            import random

            out = []
            for p, s in zip(prompt_ids, seed):
                text = self.tokenizer.decode(p)
                out.append([self._sample(text, random.Random(f"{s}/{j}"), max_tokens) for j in range(n)])
            return out

    _, whole, _ = run(n_problems=6, sampler=PositionFree())
    uids = whole["uid"].unique(maintain_order=True).to_list()
    parts = []
    for shard in range(2):
        keep = [u for u in uids if shard_of(u, 2) == shard]
        assert keep, "both shards hold problems"
        _, part, _ = run(n_problems=6, sampler=PositionFree(), keep_uids=keep)
        parts.append(part)
    merged = pl.from_arrow(merge_shards([p.to_arrow() for p in parts], uids, [s.strategy_id for s in ALL]))
    assert merged.equals(whole)


def test_agent_budgets_and_temperature_reach_the_engine():
    cfg = RolloutConfig(temperature=0.7, max_tokens=40, max_tokens_by_agent={"verifier": 3})
    _, df, sampler = run(config=cfg)
    rows_at = Counter()
    for c in sampler.calls:
        rows_at[c.max_tokens] += len(c.prompts) * c.n
    assert rows_at == {40: df.filter(pl.col("agent_id") == "solver").height, 3: df.filter(pl.col("agent_id") == "verifier").height}
    assert {c.temperature for c in sampler.calls} == {0.7}
    v = df.filter(pl.col("agent_id") == "verifier")
    assert (v["completion_ids"].list.len() <= 3).all()
    # "yes" + end-of-sequence is 4 tokens: cut to 3 and marked "length"
    yes = v.filter(pl.col("completion_text").str.starts_with("ye"))
    assert yes.height > 0 and set(yes["finish_reason"]) == {"length"}


def test_tree_invariants():
    n = 3
    _, df, _ = run([Tree(group_size=n)], n_problems=6, sampler=RecordingSampler(verifier_accuracy=0.5))
    assert df["uid"].n_unique() == 6 and df.height >= 6 * 2 * n  # every problem's tree, Solver and Verifier nodes at least
    for (uid, agent, turn), node in df.group_by(["uid", "agent_id", "turn"]):
        assert node.height == n
        assert node["selected"].sum() == 1
        assert node["prompt_hash"].n_unique() == 1
        assert node["parent_node_id"].n_unique() == 1
        assert sorted(node["sample_idx"]) == list(range(n))
        best = node.filter(pl.col("selected"))["reward"][0]
        assert best == node["reward"].max()  # greedy argmax
        assert node["reward"].arg_max() == node["selected"].arg_max()  # first on ties
    for uid, tree in df.group_by("uid"):
        by_step = {s: g for s, g in tree.group_by("step")}
        steps = sorted(k[0] for k in by_step)
        assert steps == list(range(len(steps)))
        assert by_step[(0,)]["parent_node_id"].is_null().all()
        for s in steps[1:]:
            parent = by_step[(s - 1,)].filter(pl.col("selected"))["node_id"][0]
            assert set(by_step[(s,)]["parent_node_id"]) == {parent}
        # branch i is one trajectory through every step
        assert tree.group_by("traj_uid").len()["len"].n_unique() == 1


def test_tree_broadcasts_the_selected_state():
    _, df, _ = run([Tree(group_size=3)], n_problems=6, sampler=RecordingSampler(verifier_accuracy=0.5, garbage=0.0), loops=3)
    mixed_verifier_nodes = 0
    for uid, tree in df.group_by("uid"):
        for s in sorted(set(tree["step"])):
            node = tree.filter(pl.col("step") == s)
            chosen = node.filter(pl.col("selected")).row(0, named=True)
            # greedy: the selected candidate has the node's best mixed reward
            assert chosen["reward"] == node["reward"].max()
            if chosen["agent_id"] == "verifier" and node["reward"].n_unique() > 1:
                mixed_verifier_nodes += 1
            nxt = tree.filter(pl.col("step") == s + 1)
            if nxt.height == 0:
                continue
            msgs = nxt["sampling_messages"][0].to_list()
            if chosen["agent_id"] == "solver":  # the Verifier judges the selected attempt
                assert chosen["completion_text"] in msgs[-1]["content"]
            else:  # the Solver's next turn continues from the selected attempt and verdict
                assert chosen["completion_text"] in msgs[-1]["content"]
                assert msgs[-2]["role"] == "assistant"
    assert mixed_verifier_nodes > 0  # the Verifier's candidates disagreed somewhere: selection mattered


def test_tree_not_greedy_selects_candidate_zero():
    _, df, _ = run([Tree(group_size=4, greedy=False)], n_problems=4)
    assert df.filter(pl.col("selected"))["sample_idx"].unique().to_list() == [0]


def test_active_mask_stops_approved_samples():
    # a Verifier that always approves: every ordinary sample stops after loop 0
    _, df, _ = run([IID(), PromptAug()], sampler=RecordingSampler(verifier_accuracy=1.0, garbage=0.0, solver_accuracy=1.0), loops=4)
    assert set(df["turn"]) == {0}
    # a Verifier that never approves: every sample loops max_loop_num times
    _, df, _ = run([IID()], sampler=RecordingSampler(verifier_accuracy=1.0, garbage=0.0, solver_accuracy=0.0), loops=3)
    assert df.group_by("traj_uid").len()["len"].unique().to_list() == [6]
    # mixed: no trajectory has rows after an approval, and an unapproved one runs to the end
    _, df, _ = run([IID(group_size=8)], n_problems=8, loops=3)
    task = FakeTask()
    for traj, rows in df.sort("step").group_by("traj_uid"):
        verdicts = [task.parse_verdict(t) for t in rows.filter(pl.col("agent_id") == "verifier")["completion_text"]]
        approved_at = [i for i, v in enumerate(verdicts) if v is True]
        if approved_at:
            assert approved_at == [len(verdicts) - 1]
        else:
            assert len(verdicts) == 3


def test_solver_retries_after_a_rejection_see_attempt_and_rejection():
    _, df, _ = run([IID()], sampler=RecordingSampler(verifier_accuracy=1.0, garbage=0.0, solver_accuracy=0.0))
    assert df["traj_uid"].n_unique() > 0
    for traj, rows in df.sort("step").group_by("traj_uid"):
        rows = rows.sort("step")
        attempt0, verdict0, retry = rows.row(0, named=True), rows.row(1, named=True), rows.row(2, named=True)
        msgs = retry["sampling_messages"]
        assert msgs[: len(attempt0["sampling_messages"])] == attempt0["sampling_messages"]
        assert msgs[-2] == {"role": "assistant", "content": attempt0["completion_text"]}
        assert msgs[-1]["role"] == "user" and verdict0["completion_text"] in msgs[-1]["content"]
        assert retry["parent_node_id"] == verdict0["node_id"] and verdict0["parent_node_id"] == attempt0["node_id"]


def test_feedback_gives_every_sample_a_second_attempt_after_task_feedback():
    task = FakeTask()
    fb = Feedback(group_size=4, train_context="problem")
    _, df, _ = run([fb], task=task, sampler=RecordingSampler(verifier_accuracy=1.0, garbage=0.0, solver_accuracy=1.0), loops=1)
    second = df.filter((pl.col("agent_id") == "solver") & (pl.col("turn") == 1))
    assert second.height == 5 * 4  # even after an approved, correct attempt1
    assert df["turn"].max() == 1
    problems = {p.uid: p for p in task.problems("train", 5, 0)}
    for row in second.iter_rows(named=True):
        msgs = row["sampling_messages"]
        first = df.filter(pl.col("node_id") == df.filter(pl.col("node_id") == row["parent_node_id"])["parent_node_id"][0]).row(0, named=True)
        assert msgs[-2] == {"role": "assistant", "content": first["completion_text"]}
        assert msgs[-1] == task.feedback_message(problems[row["uid"]], first["completion_text"])
        assert fb.training_messages(msgs, 1, "solver") == task.solver_messages(problems[row["uid"]])


def test_prompt_aug_samples_with_the_hint():
    task = FakeTask()
    _, df, _ = run([PromptAug(group_size=2)], task=task)
    problems = {p.uid: p for p in task.problems("train", 5, 0)}
    assert df.filter(pl.col("agent_id") == "solver").height > 0 and df.filter(pl.col("agent_id") == "verifier").height > 0
    for row in df.filter(pl.col("agent_id") == "solver").iter_rows(named=True):
        assert {"role": "system", "content": "Hint: " + problems[row["uid"]].hint} in row["sampling_messages"]
    for row in df.filter(pl.col("agent_id") == "verifier").iter_rows(named=True):
        assert not any(m["content"].startswith("Hint: ") for m in row["sampling_messages"])


def test_rewards_of_ordinary_trajectories():
    task = FakeTask()
    problems = {p.uid: p for p in task.problems("train", 6, 0)}
    alpha = 0.5
    _, df, _ = run([IID(group_size=6), Feedback(group_size=3)], n_problems=6, config=RolloutConfig(alpha=alpha), loops=3)
    assert df["reward_error"].is_null().all()
    for traj, rows in df.group_by("traj_uid"):
        rows = rows.sort("step")
        solver_rows = rows.filter(pl.col("agent_id") == "solver")
        final = task.reward(problems[rows["uid"][0]], solver_rows["completion_text"][-1])
        verdicts = rows.filter(pl.col("agent_id") == "verifier")["completion_text"].to_list()
        if rows["strategy"][0] != "feedback" and not (verdicts and task.parse_verdict(verdicts[-1]) is True):
            # the team plays its first answer unless the Verifier approved a retry (`final_answer`)
            final = task.reward(problems[rows["uid"][0]], solver_rows["completion_text"][0])
        if rows["strategy"][0] == "feedback":
            # the first attempt is credited with its own outcome, before the feedback; the second with the final one
            first = task.reward(problems[rows["uid"][0]], solver_rows["completion_text"][0])
            assert rows["global_reward"].to_list() == [first if t == 0 else final for t in rows["turn"]]
        else:
            assert rows["global_reward"].to_list() == [final] * rows.height
        for s in solver_rows.iter_rows(named=True):
            assert s["local_reward"] == task.reward(problems[s["uid"]], s["completion_text"])
        for i, v in enumerate(rows.filter(pl.col("agent_id") == "verifier").iter_rows(named=True)):
            verdict = task.parse_verdict(v["completion_text"])
            judged = task.reward(problems[v["uid"]], solver_rows["completion_text"][i]) == 1.0
            assert v["local_reward"] == (0.0 if verdict is None else float(verdict == judged))
        assert rows["reward"].to_list() == [alpha * g + l for g, l in zip(rows["global_reward"], rows["local_reward"])]


class RaisingTask(FakeTask):
    def reward(self, problem, completion_text):
        if problem.uid.endswith("-1"):
            raise ValueError("cannot score this")
        return super().reward(problem, completion_text)


class HangingTask(FakeTask):
    def reward(self, problem, completion_text):
        if problem.uid.endswith("-2"):
            time.sleep(1.5)
        return super().reward(problem, completion_text)


def test_a_raising_reward_gives_null_rewards_and_an_error():
    table, df, _ = run(task=RaisingTask(), n_problems=3)
    validate(table, STEPS)
    bad = df.filter(pl.col("uid").str.ends_with("-1"))
    good = df.filter(~pl.col("uid").str.ends_with("-1"))
    assert bad.height > 0 and bad["reward"].is_null().all() and bad["global_reward"].is_null().all()
    assert bad["reward_error"].str.contains("ValueError: cannot score this").all()
    assert good["reward"].is_not_null().all() and good["reward_error"].is_null().all()


class RaisingFeedbackTask(FakeTask):
    def feedback_message(self, problem, attempt_text):
        if problem.uid.endswith("-1"):
            raise RuntimeError("no feedback for this one")
        return super().feedback_message(problem, attempt_text)


def test_a_raising_feedback_message_stops_that_sample_with_an_error():
    table, df, _ = run([Feedback(group_size=2), IID(group_size=2)], task=RaisingFeedbackTask(), n_problems=3)
    validate(table, STEPS)
    bad = df.filter(pl.col("uid").str.ends_with("-1") & (pl.col("strategy") == "feedback"))
    assert bad.height > 0 and bad["turn"].max() == 0  # stopped before attempt2
    assert bad["reward"].is_null().all()
    assert bad["reward_error"].str.contains("RuntimeError: no feedback for this one").all()
    others = df.filter(~(pl.col("uid").str.ends_with("-1") & (pl.col("strategy") == "feedback")))
    assert others["reward"].is_not_null().all()
    assert others.filter(pl.col("strategy") == "feedback")["turn"].max() == 1


def test_a_hanging_reward_times_out():
    _, df, _ = run([IID(group_size=2)], task=HangingTask(), n_problems=3, config=RolloutConfig(reward_timeout=0.1), loops=1)
    bad = df.filter(pl.col("uid").str.ends_with("-2"))
    assert bad["reward"].is_null().all()
    assert bad["reward_error"].str.contains("step timed out after 0.1s").all()
    assert df.filter(~pl.col("uid").str.ends_with("-2"))["reward"].is_not_null().all()


def test_agents_on_their_own_policies_use_their_own_engines():
    solver_engine, verifier_engine = RecordingSampler(), RecordingSampler()
    _, df, _ = run(
        [IID(group_size=2)], agents=default_agents(shared_policy=False), sampler={"solver": solver_engine, "verifier": verifier_engine},
        loops=2,
    )
    assert df.filter(pl.col("agent_id") == "solver")["policy_id"].unique().to_list() == ["solver"]
    assert df.filter(pl.col("agent_id") == "verifier")["policy_id"].unique().to_list() == ["verifier"]
    for engine, agent in ((solver_engine, "solver"), (verifier_engine, "verifier")):
        assert sum(len(c.prompts) * c.n for c in engine.calls) == df.filter(pl.col("agent_id") == agent).height
    with pytest.raises(ConfigError, match="no sampler for policy id"):
        run(agents=default_agents(shared_policy=False), sampler={"solver": solver_engine})


def test_same_seed_same_table_other_seed_other_samples():
    a, _, _ = run()
    b, _, _ = run()
    c, _, _ = run(config=RolloutConfig(seed=1))
    assert a.equals(b)
    assert a.column("completion_ids") != c.column("completion_ids")


def test_round_is_in_every_id():
    _, df, _ = run(config=RolloutConfig(round=3))
    assert set(df["round"]) == {3}
    assert df["step_id"].str.starts_with("r3-").all() and df["traj_uid"].str.starts_with("r3-").all()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"round": -1}, "round"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"alpha": float("inf")}, "alpha"),
        ({"seed": 1.5}, "seed"),
        ({"reward_timeout": 0}, "reward_timeout"),
        ({"max_tokens_by_agent": {"verifier": 0}}, "max_tokens_by_agent"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"RolloutConfig.{field}"):
        RolloutConfig(**kwargs)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RolloutConfig().seed = 3


def test_bad_inputs_are_named():
    with pytest.raises(ConfigError, match="repeated: \\['iid'\\]"):
        run([IID(), IID(group_size=2)])
    with pytest.raises(ConfigError, match="at least one strategy"):
        run([])
    with pytest.raises(ConfigError, match="workflow 'math' needs one agent per role \\['solver', 'verifier'\\]"):
        run(agents=[Agent("solver", "solver")])
    with pytest.raises(ConfigError, match="MathWorkflow.max_loop_num|max_loop_num must be an integer >= 1"):
        run(loops=0)
    with pytest.raises(ConfigError, match="feedback strategy trains agent 'solver' context-swapped, but workflow 'math' gives feedback to 'alice'"):
        run([Feedback()], agents=[Agent("alice", "solver"), Agent("bob", "verifier")])
    _, df, _ = run([Feedback(agent_id="alice")], agents=[Agent("alice", "solver"), Agent("bob", "verifier")])
    assert set(df["agent_id"]) == {"alice", "bob"}
    _, df, _ = run([IID(group_size=2)], agents=[Agent("alice", "solver"), Agent("bob", "verifier")])
    assert set(df["agent_id"]) == {"alice", "bob"}
    task = FakeTask()
    p = task.problems("train", 1, 0)[0]
    with pytest.raises(DataError, match="uids must be unique"):
        run_rollouts([p, p], MathWorkflow(task), [IID()], FakeSampler(), RolloutConfig())


class LossySampler(FakeSampler):
    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        out = super().generate(prompt_ids, n, temperature, max_tokens, seed)
        s = out[0][0]
        out[0][0] = dataclasses.replace(s, logprobs=s.logprobs[:-1])
        return out


def test_engine_logprob_mismatch_is_an_error_naming_the_row():
    with pytest.raises(DataError, match="logprobs for step_id 'r0-iid-"):
        run([IID()], sampler=LossySampler())


def test_plan_call_merges_identical_prompts():
    plan = plan_call([([1, 2], 4), ([3], 4), ([1, 2], 4), ([1, 2], 4)])
    assert plan.n == 4
    assert plan.prompts == [[1, 2], [1, 2], [1, 2], [3]]
    slots = [s for req in plan.slots for s in req]
    assert len(slots) == len(set(slots)) == 16
    assert all(plan.prompts[p] == [1, 2] for p, _ in plan.slots[2])
    plan = plan_call([([1], 1), ([2], 3), ([1], 1)])
    assert plan.n == 1 and len(plan.prompts) == 5
    plan = plan_call([([1], 6), ([2], 4)])
    assert plan.n == 2 and plan.prompts == [[1], [1], [1], [2], [2]]
    assert plan_call([]).prompts == []


def test_steps_round_trip_through_the_table_owner(tmp_path):
    from pipeline.store import Tables

    table, df, _ = run(config=RolloutConfig(round=2))
    tables = Tables(tmp_path)
    info = tables.write(2, "steps", table)
    assert tables.path(2, "steps") == tmp_path / "round=2" / "steps.parquet" and info.rows == df.height
    back = read_table(tables.path(2, "steps"), STEPS)
    assert back.height == df.height and back["step_id"].to_list() == df["step_id"].to_list()
    with pytest.raises(DataError, match="round\\(s\\) \\[2\\]"):
        tables.write(1, "steps", table)
    assert not tables.exists(1, "steps")


def test_a_group_of_each_strategy_is_well_defined():
    _, df, _ = run(n_problems=4, loops=1)
    sizes = df.filter(pl.col("turn") == 0).group_by(["uid", "strategy", "agent_id"]).len()
    expected = {s.strategy_id: s.group_size for s in ALL}
    for row in sizes.iter_rows(named=True):
        assert row["len"] == expected[row["strategy"]]
    fb1 = df.filter((pl.col("strategy") == "feedback") & (pl.col("turn") == 1)).group_by(["uid", "agent_id"]).len()
    assert fb1["len"].unique().to_list() == [4]


# --- the real tiny default model on the HF engine ------------------------------------------


class CountingSampler:
    """Wraps a real engine and records each generate call's (number of prompts, n)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def model_version(self):
        return self.inner.model_version

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.calls.append((len(prompt_ids), n))
        return self.inner.generate(prompt_ids, n, temperature, max_tokens, seed)


@pytest.fixture(scope="module")
def hf_engine(default_model_dir):
    from pipeline.engines import make_sampler

    sampler = make_sampler("hf", default_model_dir)
    yield sampler
    sampler.close()


def test_real_model_mixed_round_is_swappable(hf_engine, default_model_dir, tmp_path):
    """A mixed round on the real tiny model through the HF engine: every strategy, both agents,
    rows that reproduce their prompts, one engine call per distinct request size of a step.
    (Its speed is benchmarks/rollouts.py's business, not a test's.)"""
    from pipeline.models import load_tokenizer
    from pipeline.tasks import make_task

    task = make_task()
    problems = task.problems("train", 8, 0)
    strategies = [IID(group_size=4), PromptAug(group_size=4), Feedback(group_size=4), Tree(group_size=4)]
    engine = CountingSampler(hf_engine)
    tokenizer = load_tokenizer(default_model_dir)
    table = run_rollouts(problems, MathWorkflow(task), strategies, engine, RolloutConfig(max_tokens=32), tokenizer=tokenizer)
    validate(table, STEPS)
    df = pl.from_arrow(table)
    assert set(df["strategy"]) == {"iid", "prompt_aug", "feedback", "tree"}
    assert set(df["agent_id"]) == {"solver", "verifier"}
    assert set(df["engine"]) == {"hf"} and set(df["model_version"]) == {hf_engine.model_version}
    assert len(engine.calls) >= df["step"].n_unique()  # one call per distinct request size of a step
    assert sum(p * n for p, n in engine.calls) == df.height
    for row in df.iter_rows(named=True):
        assert row["prompt_ids"] == encode_prompt(tokenizer, row["sampling_messages"])
        assert len(row["completion_ids"]) == len(row["completion_logprobs"]) > 0
        assert all(lp <= 0 for lp in row["completion_logprobs"])
    tree = df.filter(pl.col("strategy") == "tree")
    for _, node in tree.group_by(["uid", "agent_id", "turn"]):
        assert node.height == 4 and node["selected"].sum() == 1 and node["prompt_hash"].n_unique() == 1
    # rewards are numbers for every row of the default task
    assert df["reward"].is_not_null().all()
    from pipeline.store import Tables

    assert Tables(tmp_path).write(0, "steps", table).rows == df.height


def test_real_model_rows_reproduce_the_engine_logprobs(hf_engine, default_model_dir):
    """Stored logprobs are those the engine sampled with: a teacher-forced pass of the model
    over prompt_ids + completion_ids at the same temperature gives the same values."""
    import torch

    from pipeline.models import load_model
    from pipeline.tasks import make_task

    task = make_task()
    temperature = 0.8
    table = run_rollouts(task.problems("train", 3, 1), MathWorkflow(task), [IID(group_size=2)], hf_engine, RolloutConfig(temperature=temperature, max_tokens=16))
    model = load_model(default_model_dir)
    model.eval()
    assert table.num_rows >= 6
    for row in pl.from_arrow(table).head(6).iter_rows(named=True):
        ids = row["prompt_ids"] + row["completion_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float() / temperature
        logp = torch.log_softmax(logits, -1)
        start = len(row["prompt_ids"])
        expected = [logp[start - 1 + i, t].item() for i, t in enumerate(row["completion_ids"])]
        assert np.allclose(expected, row["completion_logprobs"], atol=2e-3)


def test_the_feedback_first_attempt_is_not_credited_with_the_second_attempts_result():
    """Under a mixed reward a wrong first attempt must not earn the right second attempt's team
    reward: the second attempt came after privileged feedback."""
    sampler = RecordingSampler(solver_accuracy=0.3, garbage=0.0)
    _, df, _ = run([Feedback(group_size=4)], n_problems=8, sampler=sampler, config=RolloutConfig(alpha=1.0))
    first = df.filter(pl.col("agent_id") == "solver", pl.col("turn") == 0)
    second = df.filter(pl.col("agent_id") == "solver", pl.col("turn") == 1).select("traj_uid", pl.col("local_reward").alias("second"))
    joined = first.join(second, on="traj_uid")
    wrong_then_right = joined.filter(pl.col("local_reward") == 0.0, pl.col("second") == 1.0)
    assert wrong_then_right.height > 0  # the case exists in this draw
    assert (wrong_then_right["global_reward"] == 0.0).all() and (wrong_then_right["reward"] == 0.0).all()
