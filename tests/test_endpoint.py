"""The OpenAI-compatible endpoint (`pipeline.rollout.endpoint`) and the program workflow
(`pipeline.workflows.program`): a program of plain `openai` calls played by the rollout engine.

- recorded rows: the completion tokens and logprobs equal a direct engine call's with the row's
  seed, the prompt ids are the messages rendered with the model's chat template, and the text the
  program received is the detokenized completion (vLLM on the tiny model);
- the endpoint listens on 127.0.0.1 only and is gone when the round's `run_rollouts` returns;
- hostile programs (an exception, a hang, a call after returning, an unknown model, a malformed
  body, a return value that is no reward, no call at all) end their own episode only, each row
  marked with its error, and the round goes on;
- strategies: `prompt_aug` hints the hinted agent through the endpoint; tree and feedback refused;
- the example (`examples/openai_team.py`) runs a round of `maxit run`.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest

from fakes import FakeTokenizer
from pipeline.errors import ConfigError
from pipeline.rollout.endpoint import Endpoint
from pipeline.rollout.http_server import HOST
from pipeline.rollout.loop import run_rollouts
from pipeline.rollout.sampling import RolloutConfig
from pipeline.strategies import IID, Feedback, PromptAug, Tree
from pipeline.types import Sample
from pipeline.workflows import load_workflow

ROOT = Path(__file__).resolve().parents[1]


class Adder:
    """A scripted engine: answers the last "a+b=" of a prompt with its sum (one token per character)."""

    engine = "scripted"
    model_version = "scripted-v0"

    def __init__(self) -> None:
        self.tokenizer = FakeTokenizer()
        self.calls = 0

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        self.calls += 1
        out = []
        for prompt in prompt_ids:
            found = re.findall(r"(\d+)\+(\d+)=", self.tokenizer.decode(prompt))
            said = str(int(found[-1][0]) + int(found[-1][1])) if found else "?"
            ids = self.tokenizer.encode(said)
            out.append([Sample(token_ids=ids, logprobs=[-0.25] * len(ids), text=said, finish_reason="stop") for _ in range(n)])
        return out


def program_file(tmp_path: Path, name: str, body: str) -> tuple[str, object]:
    """A program module written to `tmp_path` -> (its --workflow spec's file part, the module
    once loaded: what its functions recorded)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path), name


def loaded(name: str):
    return sys.modules[f"maxit_workflow_{name}"]


TEAM = """
import re
AGENTS = ["proposer", "checker"]
SEEN = {}       # response id (chatcmpl-<step_id>) -> the text the program received
SENT = []       # the messages the program sent
URLS = []

def problems(split, n, seed):
    return [{"uid": f"{split}-{i}", "question": f"{10 + i}+{20 + i}=", "answer": str(30 + 2 * i), "hint": "the tens digit is 3"} for i in range(n)]

def run(problem, client):
    URLS.append(str(client.base_url))
    answers = {}
    for agent in AGENTS:
        messages = [{"role": "user", "content": problem.question}]
        SENT.append(messages)
        reply = client.chat.completions.create(model=agent, messages=messages)
        SEEN[reply.id] = reply.choices[0].message.content
        answers[agent] = reply.choices[0].message.content
    return {a: float(answers[a].strip() == problem.answer) for a in AGENTS}
"""


def test_a_program_s_calls_are_rows_with_its_agents_turns_and_rewards(tmp_path):
    spec, name = program_file(tmp_path, "team_prog", TEAM)
    wf = load_workflow(f"program:{spec}:run")
    assert [a.agent_id for a in wf.agents] == ["proposer", "checker"] and wf.hinted_agents == ("proposer",)
    problems = wf.problems("train", 3, 0)
    steps = pl.from_arrow(run_rollouts(problems, wf, [IID(group_size=2), PromptAug(group_size=2)], Adder(), RolloutConfig(seed=3)))
    assert steps.height == 3 * 2 * 2 * 2  # problems x strategies x samples x agents
    assert steps["reward_error"].null_count() == steps.height
    assert steps["local_reward"].to_list() == [1.0] * steps.height
    proposer = steps.filter(pl.col("agent_id") == "proposer")
    checker = steps.filter(pl.col("agent_id") == "checker")
    assert set(proposer["step"]) == {0} and set(checker["step"]) == {1} and set(steps["turn"]) == {0}
    # the checker's call follows the proposer's in its episode
    assert checker["parent_node_id"].to_list() == [s.replace("-checker-", "-proposer-") for s in checker["step_id"]]
    # every response named its row; the text the program got is the row's completion
    by_id = dict(zip(steps["step_id"], steps["completion_text"]))
    assert {k.removeprefix("chatcmpl-"): v for k, v in loaded(name).SEEN.items()} == by_id
    # prompt_aug: the endpoint adds the hint to the hinted agent's messages only; the program never saw it
    hinted = steps.filter(pl.col("strategy") == "prompt_aug")
    for agent_id, messages in zip(hinted["agent_id"], hinted["sampling_messages"]):
        has_hint = any(m["content"].startswith("Hint: ") for m in messages)
        assert has_hint == (agent_id == "proposer")
    assert not any("Hint" in m["content"] for ms in loaded(name).SENT for m in ms)
    # seeds are the rows' own, so the same program draws the same rows again
    again = pl.from_arrow(run_rollouts(problems, wf, [IID(group_size=2), PromptAug(group_size=2)], Adder(), RolloutConfig(seed=3)))
    assert again.drop("sampling_messages").equals(steps.drop("sampling_messages"))


def test_the_endpoint_listens_on_loopback_only_and_is_gone_when_the_round_returns(tmp_path):
    spec, name = program_file(tmp_path, "url_prog", TEAM)
    wf = load_workflow(f"program:{spec}:run")
    run_rollouts(wf.problems("train", 2, 0), wf, [IID(group_size=1)], Adder(), RolloutConfig())
    urls = loaded(name).URLS
    assert urls and all(u.startswith(f"http://{HOST}:") and "/ep/" in u for u in urls)
    port = int(urls[0].split(":")[2].split("/")[0])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=2).close()
    # bound to the loopback address itself, not to every interface
    sampler = Adder()
    endpoint = Endpoint(wf.agents, {"shared": sampler}, {"shared": sampler.tokenizer}, RolloutConfig())
    with endpoint:
        assert endpoint._server.socket.getsockname()[0] == "127.0.0.1"


HOSTILE = """
import threading, time
import httpx, openai
AGENTS = ["proposer", "checker"]
GOT = {}
KINDS = ["good", "raises", "hangs", "late", "unknown_model", "malformed", "bad_return", "no_call"]

def problems(split, n, seed):
    return [{"uid": k, "question": "1+2=", "answer": "3"} for k in KINDS[:n]]

def ask(client, agent="proposer"):
    return client.chat.completions.create(model=agent, messages=[{"role": "user", "content": "1+2="}]).choices[0].message.content

def run(problem, client):
    kind = problem.uid
    if kind == "no_call":
        return 1.0
    ask(client)
    if kind == "raises":
        raise RuntimeError("boom")
    if kind == "hangs":
        time.sleep(60)
    if kind == "late":
        threading.Thread(target=lambda: (time.sleep(0.2), GOT.setdefault("late", _try(ask, client)))).start()
    if kind == "unknown_model":
        GOT["unknown_model"] = _try(ask, client, "nobody")
    if kind == "malformed":
        GOT["malformed"] = httpx.post(str(client.base_url) + "chat/completions", content=b"{not json").json()
    if kind == "bad_return":
        return "yes"
    return 1.0

def _try(fn, *args):
    try:
        return fn(*args)
    except openai.APIStatusError as err:
        return (err.status_code, err.body)
"""


def test_a_hostile_program_fails_its_own_episodes_and_the_round_goes_on(tmp_path, caplog):
    spec, name = program_file(tmp_path, "hostile_prog", HOSTILE)
    wf = load_workflow(f"program:{spec}:run", timeout=1.0)
    problems = wf.problems("train", 8, 0)
    start = time.monotonic()
    steps = pl.from_arrow(run_rollouts(problems, wf, [IID(group_size=1)], Adder(), RolloutConfig()))
    assert time.monotonic() - start < 30  # the hang was abandoned at its timeout, not waited for
    error = dict(zip(steps["uid"], steps["reward_error"]))
    reward = dict(zip(steps["uid"], steps["reward"]))
    assert set(error) == {"good", "raises", "hangs", "late", "unknown_model", "malformed", "bad_return"}  # no_call: no row
    assert error["good"] is None and reward["good"] == 1.0
    # the program's one return value is both rewards: each column names the error
    assert error["raises"] == "global_reward: the program raised RuntimeError: boom; local_reward: the program raised RuntimeError: boom"
    assert "the program ran past its timeout (1 s" in error["hangs"]
    assert "409 episode_closed" in error["late"]
    assert "404 model_not_found" in error["unknown_model"]
    assert "400 invalid_json" in error["malformed"]
    assert "the program returned 'yes', expected a number or None" in error["bad_return"]
    assert all(reward[k] is None for k in error if k != "good")
    got = loaded(name).GOT
    # OpenAI-style error bodies: the unknown model's names the team's agents
    status, body = got["unknown_model"]
    assert status == 404 and body["code"] == "model_not_found" and "['checker', 'proposer']" in body["message"]
    assert got["malformed"]["error"]["code"] == "invalid_json"
    assert got["late"][0] == 409
    assert "1 of 8 episodes have no row" in caplog.text and "no_call" in caplog.text


def test_the_console_names_a_program_s_first_error_and_the_query_that_lists_them(tmp_path):
    from pipeline.reporting.report import reward_error_lines
    from pipeline.store import Tables

    spec, _ = program_file(tmp_path, "console_prog", HOSTILE)
    wf = load_workflow(f"program:{spec}:run", timeout=1.0)
    table = run_rollouts(wf.problems("train", 2, 0), wf, [IID(group_size=1)], Adder(), RolloutConfig())
    Tables(tmp_path / "store").write(0, "steps", table)
    lines = "\n".join(reward_error_lines(tmp_path / "store", 0))
    assert "1 of 2 rows carry a reward_error" in lines and "the program raised RuntimeError: boom" in lines
    assert "reward_error IS NOT NULL" in lines


def test_tree_and_feedback_are_refused_by_name_and_so_are_bad_programs(tmp_path):
    spec, _ = program_file(tmp_path, "refused_prog", TEAM)
    wf = load_workflow(f"program:{spec}:run")
    problems = wf.problems("train", 1, 0)
    with pytest.raises(ConfigError, match="cannot run the tree strategy"):
        run_rollouts(problems, wf, [Tree(group_size=2)], Adder(), RolloutConfig())
    with pytest.raises(ConfigError, match="feedback"):
        run_rollouts(problems, wf, [Feedback(group_size=2)], Adder(), RolloutConfig())
    no_agents, _ = program_file(tmp_path, "no_agents", "def run(problem, client):\n    return 1.0\ndef problems(s, n, seed):\n    return []\n")
    with pytest.raises(ConfigError, match="declare the agents"):
        load_workflow(f"program:{no_agents}:run")
    with pytest.raises(ConfigError, match="has no 'nothing'"):
        load_workflow(f"program:{spec}:nothing")
    with pytest.raises(ConfigError, match="unknown option 'bogus'"):
        load_workflow(f"program:{spec}:run", bogus=1)


ASYNC = """
import asyncio
from pipeline.workflows.program import team

def problems(split, n, seed):
    return [{"uid": f"p{i}", "question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]

@team("a", "b", hinted=["b"])
async def run(problem, client):
    replies = await asyncio.gather(*(client.chat.completions.create(model=m, messages=[{"role": "user", "content": problem.question}]) for m in ("a", "b")))
    return {"a": 1.0, "b": 0.0, "team": 0.5}
"""


def test_an_async_program_with_a_decorated_team_and_per_agent_rewards(tmp_path):
    spec, _ = program_file(tmp_path, "async_prog", ASYNC)
    wf = load_workflow(f"program:{spec}:run")
    assert [a.agent_id for a in wf.agents] == ["a", "b"] and wf.hinted_agents == ("b",)
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 2, 0), wf, [IID(group_size=2)], Adder(), RolloutConfig()))
    assert steps.height == 8 and steps["reward_error"].null_count() == 8
    assert set(zip(steps["agent_id"], steps["local_reward"], steps["global_reward"])) == {("a", 1.0, 0.5), ("b", 0.0, 0.5)}
    assert sorted(set(steps["step"])) == [0, 1]  # concurrent calls: steps in arrival order


ENGINE = """
AGENTS = ["proposer", "checker"]
SEEN = {}

def problems(split, n, seed):
    return [{"uid": f"p{i}", "question": f"{12 + i}+{34 + i}=", "answer": "0"} for i in range(n)]

def run(problem, client):
    for agent in AGENTS:
        reply = client.chat.completions.create(model=agent, messages=[{"role": "user", "content": problem.question}])
        SEEN[reply.id.removeprefix("chatcmpl-")] = reply.choices[0].message.content
    return 0.0
"""


@pytest.mark.vllm
def test_recorded_tokens_and_logprobs_are_a_direct_engine_call_s_and_the_program_got_their_text(tmp_path, vllm_sampler):
    from pipeline.models.chat import encode_prompt

    spec, name = program_file(tmp_path, "engine_prog", ENGINE)
    wf = load_workflow(f"program:{spec}:run")
    config = RolloutConfig(temperature=1.0, max_tokens=8, seed=11)
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 3, 0), wf, [IID(group_size=2)], vllm_sampler, config))
    assert steps.height == 12
    tok = vllm_sampler.tokenizer
    seen = loaded(name).SEEN
    for row in steps.iter_rows(named=True):
        assert row["prompt_ids"] == encode_prompt(tok, row["sampling_messages"])
        direct = vllm_sampler.generate([row["prompt_ids"]], 1, 1.0, 8, [row["seed"]])[0][0]
        assert row["completion_ids"] == direct.token_ids, row["step_id"]
        assert row["completion_logprobs"] == pytest.approx(direct.logprobs, abs=1e-4)
        assert seen[row["step_id"]] == tok.decode(row["completion_ids"], skip_special_tokens=True) == row["completion_text"]
    assert len({tuple(ids) for ids in steps["completion_ids"]}) > 1  # sampled, not one fixed answer


def test_the_example_team_runs_a_round_of_maxit_run_and_its_rows_are_what_it_saw(tmp_path, default_model_dir):
    store = tmp_path / "team"
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "maxit.cli", "run", "--workflow", "program:examples/openai_team.py:run",
         "--rounds", "1", "--problems", "4", "--samples", "2", "--eval-problems", "4", "--eval-samples", "1", "--store", str(store)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    seconds = time.monotonic() - start
    assert out.returncode == 0, out.stderr[-2000:]
    # the library's default mix, as the command runs it: the tree and feedback a program
    # cannot play are left out, iid and prompt_aug run
    steps = pl.read_parquet(store / "round=0" / "steps.parquet")
    assert set(steps["agent_id"]) == {"proposer", "checker"} and set(steps["strategy"]) == {"iid", "prompt_aug"}
    assert steps.height == 4 * 2 * 2 * 2 and steps["reward_error"].null_count() == steps.height
    ev = pl.read_parquet(store / "round=0" / "evaluation.parquet")
    assert {"success", "success_greedy"} <= set(ev.filter(pl.col("agent_id") == "team")["metric"])
    assert "success" in out.stdout
    print(f"one round of the example: {seconds:.0f} s")


STREAM = """
AGENTS = ["solver"]
GOT = []

def problems(split, n, seed):
    return [{"uid": "p", "question": "20+22=", "answer": "42"}]

def run(problem, client):
    chunks = list(client.chat.completions.create(model="solver", messages=[{"role": "user", "content": problem.question}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    GOT.append((text, chunks[-1].choices[0].finish_reason))
    return float(text == problem.answer)
"""


def test_a_streamed_call_gets_the_same_completion_and_is_a_row(tmp_path):
    # verifiers' harnesses call with stream=True
    spec, name = program_file(tmp_path, "stream_prog", STREAM)
    wf = load_workflow(f"program:{spec}:run")
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 1, 0), wf, [IID(group_size=1)], Adder(), RolloutConfig()))
    assert loaded(name).GOT == [("42", "stop")]
    assert steps["completion_text"].to_list() == ["42"] and steps["reward"].to_list() == [1.0]


CLOSER = """
AGENTS = ["solo"]

def problems(split, n, seed):
    return [{"uid": f"{split}-{i}", "question": f"{10 + i}+{20 + i}=", "answer": str(30 + 2 * i)} for i in range(n)]

def run(problem, client):
    with client:  # the usual way to write it: closing this client must not close the round's pool
        reply = client.chat.completions.create(model="solo", messages=[{"role": "user", "content": problem.question}])
    return float(reply.choices[0].message.content.strip() == problem.answer)
"""


def test_a_program_that_closes_its_client_ends_no_other_episode(tmp_path):
    spec, _ = program_file(tmp_path, "closer_prog", CLOSER)
    wf = load_workflow(f"program:{spec}:run", concurrency=2)
    steps = pl.from_arrow(run_rollouts(wf.problems("train", 4, 0), wf, [IID(group_size=2)], Adder(), RolloutConfig(seed=1)))
    assert steps.height == 8 and steps["reward_error"].null_count() == 8
    assert steps["local_reward"].to_list() == [1.0] * 8


class RefusesLong(Adder):
    """The scripted engine, refusing any batch that holds a prompt of more than 40 tokens (as vLLM
    refuses a prompt past its context)."""

    def generate(self, prompt_ids, n, temperature, max_tokens, seed):
        if any(len(p) > 40 for p in prompt_ids):
            raise ValueError("prompt longer than the context")
        return super().generate(prompt_ids, n, temperature, max_tokens, seed)


def test_one_request_the_engine_refuses_fails_its_own_episode_only():
    from concurrent.futures import Future

    from pipeline.rollout.batcher import Batcher, BatchedRequest

    sampler = RefusesLong()
    batcher = Batcher({"shared": sampler})
    short, long_ = sampler.tokenizer.encode("12+30="), sampler.tokenizer.encode("1+1=" * 20)
    reqs = [BatchedRequest("shared", ids, 1.0, 4, i, Future()) for i, ids in enumerate([short, long_, short])]
    batcher._sample(reqs)
    assert reqs[0].future.result(timeout=1).text == "42" and reqs[2].future.result(timeout=1).text == "42"
    with pytest.raises(ValueError, match="context"):
        reqs[1].future.result(timeout=1)


def test_a_bad_content_length_gets_a_400_and_the_connection_is_closed():
    import http.client

    sampler = Adder()
    wf_agents = load_workflow("program:examples/openai_team.py:run").agents
    with Endpoint(wf_agents, {a.policy_id: sampler for a in wf_agents}, {a.policy_id: sampler.tokenizer for a in wf_agents}, RolloutConfig()) as endpoint:
        host, port = endpoint.address
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Length", "1e3")
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 400 and b"Content-Length" in response.read()
        conn.close()
