"""The untrained budget-matched baselines of a team: its single agent (`Workflow.single_agent`) on
the held-out problems, given the team's number of model calls per problem.

The budget. `team_calls` counts the team's model calls per held-out problem from its own rows:
the evaluation's per-agent `calls` metric (mean calls per episode, summed over the agents) where
the workflow's evaluation writes it (`evaluate_workflow`), else the `steps` rows per `iid`
trajectory of the rollouts (the math workflows' evaluation samples each role once and writes no
`calls`); the most over the rounds held. The single agent's own episodes cost `c` calls (measured
by the `single` baseline), so each of its calls gets `m = max(1, round(k / c))` model calls.

The baselines (one episode per held-out problem and sample, at the evaluation's temperature and
seed, played in lockstep so each step is one batched engine call):
- `team`: the team itself, one call per seat (its untrained held-out success, on the same
  problems and rules as the baselines: what they are measured against at the start);
- `single`: the single agent, one call per turn;
- `best_of_k`: at each of its calls, `m` samples and the majority answer (`Workflow.answer_key`)
  is the one played: the most frequent key, ties broken by the samples' likelihood (the most
  likely sample of the tied keys, by the sum of its sampling logprobs, and that sample is played;
  the first sampled among equals); when no sample has a key, the first sample. Only where answers
  compare (`compares_answers`);
- `self_refine`: at each of its calls, `m` calls in a row, each after the first seeing its
  previous attempt (`Workflow.refine_messages`); the last attempt is the one played.

The trained arms (`arm_rows`, `pipeline.run.arms`): a team's arm trained at its rows in a
sibling store (the single agent, the team's protocol played by one agent, the team on the other
policy layout, a single agent of the team's parameters) is played the same way from its last
round's checkpoints: on the team's held-out problems, samples and seeds, so every arm and the
team meet the same problems with the same draws; the trained single agent also at the team's
calls (`best_of_k`, `self_refine`).

Each agent plays from its own policy's checkpoint (`sampler_of`): a team with separate policies
is played with each seat's own weights.

Each baseline's `success` is the fraction of episodes whose team reward is right (the one
correctness rule, reward >= 0.5), `team_reward` its mean, `calls` the model calls it spent per
episode. Environment code is hostile input: an `observe`, `step` or `team_reward` that raises
ends that episode unscored (counted wrong), and the baselines go on.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import polars as pl

from pipeline.errors import DataError
from pipeline.models.chat import encode_prompt
from pipeline.rollout.contract import side_value, team_value
from pipeline.rollout.rewards import CORRECT_THRESHOLD
from pipeline.strategies import IID
from pipeline.types import GenerateCall, Problem, Sampler, generate_calls

__all__ = ["BASELINES", "Played", "majority", "team_calls", "calls_per_call", "play", "baseline_rows", "arm_rows"]

BASELINES = ("team", "single", "best_of_k", "self_refine")


def majority(keys: Sequence[str | None], likelihoods: Sequence[float] | None = None) -> int:
    """The index of the sample whose answer the vote picks: the most frequent non-None key; a tie
    goes to the most likely sample of the tied keys (`likelihoods`: each sample's sum of sampling
    logprobs; a NaN counts as least likely), the first sampled among equals, or without
    `likelihoods` the first sampled; index 0 when no sample has a key."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return 0
    top = max(counts.values())
    tied = [i for i, k in enumerate(keys) if k is not None and counts[k] == top]
    if likelihoods is None or len({keys[i] for i in tied}) == 1:
        return tied[0]
    if len(likelihoods) != len(keys):
        raise ValueError(f"majority: {len(keys)} keys but {len(likelihoods)} likelihoods")

    def score(i: int) -> float:
        v = float(likelihoods[i])
        return v if v == v else -math.inf

    best = max(score(i) for i in tied)
    return next(i for i in tied if score(i) == best)


def team_calls(evaluation: pl.DataFrame, steps: pl.DataFrame | None = None) -> tuple[float, str]:
    """The team's model calls per held-out problem and where they were counted: the evaluation's
    per-agent `calls` rows summed per round, else the `steps` rows per `iid` trajectory per round;
    the most over the rounds. A `DataError` naming what is missing when neither has them."""
    calls = evaluation.filter(pl.col("metric") == "calls")
    if calls.height:
        per_round = calls.group_by("round").agg(pl.col("value").sum()).sort("round")
        best = per_round.sort("value", descending=True).row(0, named=True)
        rounds = ", ".join(str(r) for r in per_round["round"].to_list())
        return float(best["value"]), f"evaluation: agents' `calls` per episode summed, most over rounds {rounds} (round {best['round']})"
    if steps is not None and steps.height and "strategy" in steps.columns:
        iid = steps.filter(pl.col("strategy") == "iid")
        if iid.height:
            per_round = iid.group_by("round", "traj_uid").len().group_by("round").agg(pl.col("len").mean()).sort("round")
            best = per_round.sort("len", descending=True).row(0, named=True)
            rounds = ", ".join(str(r) for r in per_round["round"].to_list())
            return float(best["len"]), f"steps: rows per iid trajectory, most over rounds {rounds} (round {best['round']})"
    raise DataError("the team's calls per problem cannot be derived: its evaluation has no `calls` rows and it has no iid `steps` rows")


def calls_per_call(team: float, single: float) -> int:
    """`m`: model calls per call of the single agent so that its episodes cost the team's `team`
    calls, its own episodes costing `single`: the nearest whole number, at least 1."""
    if not (single > 0 and math.isfinite(team)):
        return 1
    return max(1, int(math.floor(team / single + 0.5)))


@dataclass(frozen=True)
class Played:
    """What one baseline's episodes came to."""

    success: float
    team_reward: float | None
    calls: float
    """Model calls per episode."""
    episodes: int
    errors: int
    """Episodes ended by environment code that raised."""


def play(workflow, problems: Sequence[Problem], sampler: Sampler, tokenizer, *, samples: int, temperature: float, max_tokens: int,
         seed: int, mode: str = "plain", m: int = 1, sampler_of: Callable[[str], tuple[Sampler, object]] | None = None) -> Played:
    """`samples` episodes of `workflow` per problem, in lockstep: at every (turn, agent) the live
    episodes' prompts go to the engine as one call. `mode` "plain" makes one model call per agent
    call, "vote" `m` samples and the majority answer, "refine" `m` calls in a row, the last played.
    Every agent samples from `sampler` with `tokenizer`, or with `sampler_of` from its own
    (`sampler_of(agent_id)` -> (engine, tokenizer): a team of separate policies)."""
    envs = [workflow.reset(p, IID(group_size=1)) for p in problems for _ in range(samples)]
    live, failed = list(range(len(envs))), set()
    calls = [0] * len(envs)
    step = 0
    for _turn in range(workflow.max_turns):
        for agent in workflow.turn_order:
            seen, ended = {}, set()
            for i in live:
                try:
                    seen[i] = list(envs[i].observe(agent))
                except Exception:  # noqa: BLE001 - environment code may raise anything
                    failed.add(i)
            engine, tok = sampler_of(agent) if sampler_of is not None else (sampler, tokenizer)
            texts = _texts(workflow, agent, seen, engine, tok, temperature, max_tokens, seed + 7919 * step, mode, m)
            step += 1
            for i, text in texts.items():
                calls[i] += m if mode != "plain" else 1
                try:
                    if envs[i].step(agent, text).done:
                        ended.add(i)
                except Exception:  # noqa: BLE001
                    failed.add(i)
            live = [i for i in live if i not in ended and i not in failed]
    rewards = []
    for i, env in enumerate(envs):
        if i in failed:
            rewards.append(None)
            continue
        try:  # one number per episode: a per-side mapping's value of the first agent (the contract)
            rewards.append(side_value(team_value(env.team_reward(), "team_reward"), workflow.turn_order[0])[0])
        except Exception:  # noqa: BLE001
            rewards.append(None)
    known = [r for r in rewards if r is not None]
    right = sum(1 for r in known if r >= CORRECT_THRESHOLD)
    n = max(len(envs), 1)
    return Played(right / n, sum(known) / len(known) if known else None, sum(calls) / n, len(envs), len(failed))


def _texts(workflow, agent: str, seen: dict, sampler: Sampler, tokenizer, temperature: float, max_tokens: int, seed: int, mode: str, m: int) -> dict[int, str]:
    """The text each episode of `seen` (index -> messages) plays at this call."""
    order = list(seen)
    if not order:
        return {}
    prompts = [encode_prompt(tokenizer, seen[i]) for i in order]
    seeds = [(seed * 1009 + i) % (2**31 - 1) for i in order]  # an episode's draws do not depend on which others are live
    if mode == "vote":
        out = generate_calls(sampler, [GenerateCall(prompts, m, temperature, max_tokens, seeds)])[0]
        return {i: per[majority([_key(workflow, agent, s.text) for s in per], [sum(s.logprobs) for s in per])].text for i, per in zip(order, out)}
    texts = {i: per[0].text for i, per in zip(order, _one(sampler, prompts, temperature, max_tokens, seeds))}
    for r in range(1, m if mode == "refine" else 1):
        again = {i: workflow.refine_messages(agent, seen[i], texts[i]) for i in order}
        prompts = [encode_prompt(tokenizer, again[i]) for i in order]
        texts = {i: per[0].text for i, per in zip(order, _one(sampler, prompts, temperature, max_tokens, [s + 104729 * r for s in seeds]))}
    return texts


def _key(workflow, agent: str, text: str) -> str | None:
    """The answer's key, None when the workflow's (or its task's) code raises on it: no vote."""
    try:
        key = workflow.answer_key(agent, text)
    except Exception:  # noqa: BLE001 - workflow and task code may raise anything
        return None
    return None if key is None else str(key)


def _one(sampler: Sampler, prompts, temperature: float, max_tokens: int, seeds) -> list:
    return generate_calls(sampler, [GenerateCall(prompts, 1, temperature, max_tokens, seeds)])[0]


def baseline_rows(team, single, problems: Sequence[Problem], sampler_of: Callable[[str], tuple[Sampler, object]], *, k: float, source: str,
                  samples: int, temperature: float, max_tokens: Callable[[object], int], seed: int, round_: int = -1, team_only: bool = False) -> list[dict]:
    """The rows of the `baselines` table of `round_` (-1: the starting checkpoints) for `team` and
    its single agent `single` (None: the workflow has none; its rows then carry a note), or with
    `team_only` for the team alone. `sampler_of(agent_id)` gives the engine and tokenizer of that
    agent's checkpoint; `k` and `source` the team's calls per problem and where they were counted
    (`team_calls`)."""
    rows: list[dict] = []

    def add(baseline: str, agent: str, played: Played | None, m: int, note: str | None) -> None:
        values = {"success": None, "team_reward": None, "calls": None} if played is None else {
            "success": played.success, "team_reward": played.team_reward, "calls": played.calls}
        for metric, value in values.items():
            rows.append({"round": round_, "baseline": baseline, "agent_id": agent, "metric": metric, "value": value,
                         "n": played.episodes if played else 0, "calls_per_call": m, "team_calls": k, "calls_source": source, "note": note})

    def run(workflow, mode: str, m: int) -> Played:
        return play(workflow, problems, None, None, samples=samples, temperature=temperature, max_tokens=max_tokens(workflow), seed=seed, mode=mode, m=m,
                    sampler_of=sampler_of)

    add("team", "*", run(team, "plain", 1), 1, None)
    if team_only:
        return rows
    if single is None:
        for b in BASELINES[1:]:
            add(b, "-", None, 1, f"workflow {team.name or type(team).__name__!r} has no single agent (Workflow.single_agent is None)")
        return rows
    agent = single.turn_order[0]
    alone = run(single, "plain", 1)
    add("single", agent, alone, 1, None)
    m = calls_per_call(k, alone.calls)
    if single.compares_answers:
        add("best_of_k", agent, run(single, "vote", m), m, None)
    else:
        add("best_of_k", agent, None, m, f"answers of workflow {single.name!r} do not compare (Workflow.compares_answers is False): no majority vote")
    probe = single.refine_messages(agent, [], "")
    if probe is None:
        add("self_refine", agent, None, m, f"workflow {single.name!r} has no self-refine loop (Workflow.refine_messages is None)")
    else:
        add("self_refine", agent, run(single, "refine", m), m, None)
    return rows


def arm_rows(workflow, arm: str, problems: Sequence[Problem], sampler_of: Callable[[str], tuple[Sampler, object]], *, k: float, source: str,
             samples: int, temperature: float, max_tokens: Callable[[object], int], seed: int, round_: int, at_calls: bool = False) -> list[dict]:
    """The `baselines` rows of a trained arm (`arm`, e.g. "protocol") at round `round_`: `workflow`
    played once per call (the row `arm`), and with `at_calls` (a single agent) also at the team's
    `k` calls per problem: `arm`_best_of_k (where answers compare) and `arm`_self_refine (where it
    has a loop), each else a row with a note. The same problems, samples, temperature and seed
    as the team's rows, so the draws are the same."""
    rows: list[dict] = []
    agent = workflow.turn_order[0]

    def add(baseline: str, played: Played | None, m: int, note: str | None) -> None:
        values = {"success": None, "team_reward": None, "calls": None} if played is None else {
            "success": played.success, "team_reward": played.team_reward, "calls": played.calls}
        for metric, value in values.items():
            rows.append({"round": round_, "baseline": baseline, "agent_id": agent if at_calls else "*", "metric": metric, "value": value,
                         "n": played.episodes if played else 0, "calls_per_call": m, "team_calls": k, "calls_source": source, "note": note})

    def run(mode: str, m: int) -> Played:
        return play(workflow, problems, None, None, samples=samples, temperature=temperature, max_tokens=max_tokens(workflow), seed=seed, mode=mode, m=m,
                    sampler_of=sampler_of)

    alone = run("plain", 1)
    add(arm, alone, 1, None)
    if not at_calls:
        return rows
    m = calls_per_call(k, alone.calls)
    if workflow.compares_answers:
        add(f"{arm}_best_of_k", run("vote", m), m, None)
    else:
        add(f"{arm}_best_of_k", None, m, f"answers of workflow {workflow.name!r} do not compare (Workflow.compares_answers is False): no majority vote")
    if workflow.refine_messages(agent, [], "") is None:
        add(f"{arm}_self_refine", None, m, f"workflow {workflow.name!r} has no self-refine loop (Workflow.refine_messages is None)")
    else:
        add(f"{arm}_self_refine", run("refine", m), m, None)
    return rows
