"""Each algorithm preset against a plain transcription of its source, through the path a user
takes: `Settings(algorithm=...)` -> `compute_advantages` -> `build_training_view` -> the
trainer's minibatch count and zero-row skipping -> `compute_loss`.

The constants of each source (its reward mix, groups, normalisation and eps, clip, dual clip,
aggregation, which rows count) are written here from the source (docs/ALGORITHMS.md names each
one), never read from a preset, so a preset that drifts from its source fails. Each check is also
run with its preset changed in the test (monkeypatched `ALGORITHM_PRESETS`) and must then fail:
a reference that agreed with a changed preset would be comparing the code with itself.

The sources:
- DrMAS (its advantage note and the verl code it trains with): groups per (uid, agent), every
  call a member, the team's final reward on every row, (r - mean) / (std + 1e-6) with the
  unbiased std (a group of one: mean 0, std 1), verl's `compute_policy_loss` with clip 0.2 and
  dual clip `clip_ratio_c` 3, `loss_agg_mode` token-mean over every response token of the batch.
- GRPO as DrMAS's code runs it (`group_by_agent_id=False`): one group per problem whose members
  are the trajectories' mean scores, each row scored by its trajectory's mean; the same loss.
- AT-GRPO: reward alpha * global + local, groups per (agent, turn) (the N siblings of a tree
  node), (A - mean) / (std + 1e-8), the PPO clip -min(ratio A, clip(ratio, 0.8, 1.2) A) averaged
  over the policy's tokens. AT-GRPO leaves alpha open; 1 is the value docs/ALGORITHMS.md gives.
- The expert-iteration plan: A centred within the group (one problem, one strategy), the
  estimator -(1/N) sum_i (p_train/q_s)_i A_i w_i with the sequence likelihood ratio and N every
  sample, w_s / n_s with w_s equal (normalised so the weights average 1 over the samples),
  feedback's first attempt at weight 0 (not a sample), hint and feedback out of the context.
- maxit (the project's own): the NLL of the rows whose own action was right (local reward >= 1),
  a token mean over those rows.
"""

from __future__ import annotations

import math
import random
import statistics

import polars as pl
import pytest
import torch

from pipeline.learn.advantages import compute_advantages
from pipeline.models.chat import encode_prompt
from pipeline.config.presets import ALGORITHM_PRESETS, unsourced_strategies
from pipeline.run.settings import Settings
from pipeline.strategies import make_strategy
from pipeline.learn.loss import LossBatch, compute_loss
from pipeline.learn.trainer import collate, minibatch_count, select_rows, trainable_rows
from pipeline.learn.views import build_training_view
from tiny import advantage_row, advantages_table, tiny_tokenizer

TOK = tiny_tokenizer()
PROBLEM = {"role": "user", "content": "5+5="}
HINT = {"role": "system", "content": "Hint: ten"}
FEEDBACK_CONTEXT = [PROBLEM, {"role": "assistant", "content": "11"}, {"role": "user", "content": "Wrong, try again."}]


# ---------------------------------------------------------------------------------------------
# the path a user takes


def steps(rows: list[dict]) -> pl.DataFrame:
    return pl.from_arrow(advantages_table(rows)).drop(["group_size", "group_mean", "group_std", "advantage", "sample_weight"])


def row(step_id: str, tokens: int, **values) -> dict:
    """A steps row of `tokens` completion tokens (sampling logprob -0.3 each), its rewards given
    as global/local and its `reward` left to the advantage stage."""
    return advantage_row(step_id, completion_ids=[6] * tokens, completion_logprobs=[-0.3] * tokens, reward=None, **values)


def log_ratios(rows: list[dict], far: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per row, the token log ratios log p_train - log q: `far` for the rows it names, else small
    draws around 0 (inside and outside the clip), seeded by the step id."""
    out = {}
    for r in rows:
        n = len(r["completion_ids"])
        rng = random.Random(r["step_id"])
        out[r["step_id"]] = list(far.get(r["step_id"], [rng.uniform(-0.45, 0.45) for _ in range(n)]))
        assert len(out[r["step_id"]]) == n
    return out


def preset_path(algorithm: str, rows: list[dict], ratios: dict[str, list[float]]):
    """(advantage per step id, loss, gradient per step id and token, view) of one minibatch of
    `rows` under `Settings(algorithm=algorithm)`, the way a run computes them: the advantages,
    the training view, the minibatch's denominator over every view row, the rows whose loss is
    exactly 0 left out of the forward pass, p_train = q * exp(the row's log ratios)."""
    config = Settings(algorithm=algorithm).run_config()
    adv = compute_advantages(steps(rows), config.advantage)
    options = dict(config.strategy_options)
    strategies = {s: make_strategy(s, group_size=4, **options.get(s, {})) for s in set(adv["strategy"])}
    view, _ = build_training_view(adv.to_arrow(), strategies, TOK, config.view)
    view_rows = view.to_pylist()
    loss_config = config.train.loss
    assert len(view_rows) <= config.train.minibatch_size  # one minibatch
    batch = collate(view_rows)
    denominator = minibatch_count([batch], loss_config)
    keep = trainable_rows(batch["advantages"].tolist(), batch["sample_weight"].tolist(), batch["reward"].tolist(), batch["strategy"], loss_config)
    sub = select_rows(batch, [i for i, k in enumerate(keep) if k])
    mask = sub["completion_mask"].double()
    logq = sub["sampling_logprobs"].double()
    lr = torch.zeros_like(logq)
    for i, sid in enumerate(sub["step_id"]):
        lr[i, : len(ratios[sid])] = torch.tensor(ratios[sid], dtype=torch.float64)
    logp = (logq + lr).detach().requires_grad_(True)
    out = compute_loss(
        LossBatch(logp=logp, logq=logq, mask=mask, advantage=sub["advantages"].double(), sample_weight=sub["sample_weight"].double(),
                  reward=sub["reward"].double(), strategy=sub["strategy"], agent=sub["agent"]),
        loss_config,
        denominator=denominator,
    )
    out.loss.backward()
    grads = {r["step_id"]: [0.0] * len(ratios[r["step_id"]]) for r in rows}
    for i, sid in enumerate(sub["step_id"]):
        grads[sid] = logp.grad[i, : len(ratios[sid])].tolist()
    return dict(zip(adv["step_id"], adv["advantage"])), out.loss.item(), grads, view


def finite_difference(loss_of, ratios: dict[str, list[float]], h: float = 1e-6) -> dict[str, list[float]]:
    """Central differences of a reference loss in each token's log ratio (= in its log p_train)."""
    grads = {}
    for sid, values in ratios.items():
        g = []
        for t in range(len(values)):
            up = {k: list(v) for k, v in ratios.items()}
            down = {k: list(v) for k, v in ratios.items()}
            up[sid][t] += h
            down[sid][t] -= h
            g.append((loss_of(up) - loss_of(down)) / (2 * h))
        grads[sid] = g
    return grads


def assert_matches(got, want, rel=2e-5, abs=1e-7):
    """The code's (advantages, loss, gradients) against the source's."""
    adv, loss, grads = got
    want_adv, want_loss, want_grads = want
    if want_adv is not None:
        assert {k: adv[k] for k in want_adv} == pytest.approx(want_adv, rel=rel, abs=abs)
    assert loss == pytest.approx(want_loss, rel=rel, abs=abs)
    for sid, g in want_grads.items():
        assert grads[sid] == pytest.approx(g, rel=1e-4, abs=1e-6), sid


def fails_when_changed(monkeypatch, check, algorithm: str, changes: list[dict]) -> None:
    """`check` must fail with each of `changes` made to the preset of `algorithm`."""
    for change in changes:
        with monkeypatch.context() as m:
            for key, value in change.items():
                m.setitem(ALGORITHM_PRESETS[algorithm], key, value)
            try:
                check()
            except AssertionError:
                continue
            pytest.fail(f"the {algorithm} check still passes with its preset changed by {change}")


# ---------------------------------------------------------------------------------------------
# the sources, transcribed


def grpo_stats(values: list[float], eps: float) -> tuple[float, float]:
    """verl's group statistics: mean and unbiased std; a group of one: mean 0, std 1."""
    if len(values) == 1:
        return 0.0, 1.0
    return statistics.mean(values), statistics.stdev(values) + eps


def ppo_token_mean(samples: list[tuple[float, list[float]]], clip: float, dual_clip: float | None) -> float:
    """verl's `compute_policy_loss` (AT-GRPO's clip when `dual_clip` is None), token-mean over
    every token of `samples` [(A, token log ratios)]:
    pg1 = -A ratio, pg2 = -A clamp(ratio, 1 - clip, 1 + clip), l = max(pg1, pg2);
    where A < 0: l = min(-A c, l)."""
    total, count = 0.0, 0
    for a, lrs in samples:
        for lr in lrs:
            ratio = math.exp(lr)
            loss = max(-a * ratio, -a * min(max(ratio, 1 - clip), 1 + clip))
            if dual_clip is not None and a < 0:
                loss = min(-a * dual_clip, loss)
            total += loss
            count += 1
    return total / count


def ppo_reference(rows, adv, ratios, clip, dual_clip):
    """(advantages, the loss, its gradient) of `ppo_token_mean` over `rows`."""

    def loss_of(lrs):
        return ppo_token_mean([(adv[r["step_id"]], lrs[r["step_id"]]) for r in rows], clip, dual_clip)

    return adv, loss_of(ratios), finite_difference(loss_of, ratios)


def check(algorithm: str, rows: list[dict], far: dict[str, list[float]], reference):
    """The preset's advantages, loss and gradient on `rows` against `reference(rows, ratios)`;
    returns the reference's and the code's gradients."""
    ratios = log_ratios(rows, far)
    adv, loss, grads, view = preset_path(algorithm, rows, ratios)
    want = reference(rows, ratios)
    assert_matches((adv, loss, grads), want)
    return want, grads, view


# ---------------------------------------------------------------------------------------------
# DrMAS


def drmas_rows() -> list[dict]:
    """DrMAS's worked example (K = 4 copies of problem p, team rewards [1, 0, 1, 1]; copy 1 runs
    two Solver/Verifier loops) and a problem q that every copy solved (its advantages are all 0).
    Local rewards differ from the team's, so a mix with a local term would show."""
    rows = []
    for uid, finals in (("p", [1.0, 0.0, 1.0, 1.0]), ("q", [1.0, 1.0, 1.0, 1.0])):
        for k, g in enumerate(finals):
            for t in range(2 if (uid, k) == ("p", 1) else 1):
                for agent, local in (("solver", float(t == 0)), ("verifier", 1.0 - g)):
                    sid = f"{uid}{k}-{agent}-t{t}"
                    tokens = len({**DRMAS_FAR, **GRPO_FAR}.get(sid, [])) or 2 + (k + t) % 3
                    rows.append(row(sid, tokens, uid=uid, traj_uid=f"{uid}{k}", sample_idx=k, agent_id=agent, turn=t,
                                    step=2 * t + (agent == "verifier"), global_reward=g, local_reward=local))
    return rows


DRMAS_FAR = {"p1-solver-t1": [2.5, 0.0]}
"""A Solver call of the failed copy (A < 0) far off-policy: its first token's ratio e^2.5 is above
the dual clip, the row's geometric-mean ratio e^1.25 outside [1/3, 3]."""


def drmas_reference(rows, ratios):
    eps, clip, dual_clip = 1e-6, 0.2, 3.0
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["uid"], r["agent_id"]), []).append(r["global_reward"])  # every call a member, the team's reward
    adv = {}
    for r in rows:
        mean, std = grpo_stats(groups[(r["uid"], r["agent_id"])], eps)
        adv[r["step_id"]] = (r["global_reward"] - mean) / std

    return ppo_reference(rows, adv, ratios, clip, dual_clip)


def check_drmas():
    check("drmas", drmas_rows(), DRMAS_FAR, drmas_reference)


def test_drmas_is_its_source(monkeypatch):
    check_drmas()
    fails_when_changed(monkeypatch, check_drmas, "drmas", [
        {"alpha": 0.0, "local_weight": 1.0},  # each call's own correctness instead of the team's reward
        {"group_by": ("agent_id", "turn")},  # AT-GRPO's groups
        {"sequence_ratio": "mask"},  # a mask DrMAS lacks
        {"zero_advantage_rows": "drop"},  # the all-solved problem's tokens out of the token mean
        {"dual_clip": None},
        {"clip_high": 0.28},
    ])


def one_row(algorithm: str, ratios: list[float], advantage: float, strategy: str = "iid"):
    """(loss, gradient per token, diagnostics) of one row under the loss of
    `Settings(algorithm=algorithm)`, its tokens at log ratios `ratios`."""
    config = Settings(algorithm=algorithm).run_config().train.loss
    n = len(ratios)
    logq = torch.full((1, n), -1.0, dtype=torch.float64)
    logp = (logq + torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)
    out = compute_loss(LossBatch(logp=logp, logq=logq, mask=torch.ones(1, n, dtype=torch.float64), advantage=torch.tensor([advantage], dtype=torch.float64),
                                 sample_weight=torch.ones(1, dtype=torch.float64), reward=torch.ones(1, dtype=torch.float64), strategy=[strategy], agent=["solver"]), config)
    out.loss.backward()
    return out.loss.item(), logp.grad[0].tolist(), out.diagnostics.overall


def test_drmas_far_off_policy_row_gets_verls_dual_clip_loss(monkeypatch):
    """The issue's repro: A < 0, log ratios [2.5, 0.0]. verl: token 0 min(-A*3, max(-A e^2.5,
    -A*1.2)) = -3A, token 1 -A, token mean -2A: +0.5 at A = -0.25 (a positive loss: minimising it
    pushes the sample down); the dual-clipped token has no gradient, the other -A/2."""
    loss, grad, diagnostics = one_row("drmas", [2.5, 0.0], -0.25)
    assert loss == pytest.approx(0.5) == ppo_token_mean([(-0.25, [2.5, 0.0])], clip=0.2, dual_clip=3.0)
    assert grad == pytest.approx([0.0, 0.125]) and diagnostics.n_masked_rows == 0
    monkeypatch.setitem(ALGORITHM_PRESETS["drmas"], "sequence_ratio", "mask")
    assert one_row("drmas", [2.5, 0.0], -0.25)[:2] == (0.0, [0.0, 0.0])  # a mask would zero the row


# ---------------------------------------------------------------------------------------------
# GRPO as DrMAS's code runs it


def grpo_reference(rows, ratios):
    eps, clip, dual_clip = 1e-6, 0.2, 3.0
    trajectories: dict[tuple, list[float]] = {}
    for r in rows:  # verl's traj_accumulator: index = uid, traj_index = traj_uid
        trajectories.setdefault((r["uid"], r["traj_uid"]), []).append(r["global_reward"])
    members: dict[str, list[float]] = {}
    for (uid, _), scores in trajectories.items():
        members.setdefault(uid, []).append(statistics.mean(scores))
    adv = {}
    for r in rows:
        mean, std = grpo_stats(members[r["uid"]], eps)
        adv[r["step_id"]] = (statistics.mean(trajectories[(r["uid"], r["traj_uid"])]) - mean) / std  # scored by its trajectory's mean

    return ppo_reference(rows, adv, ratios, clip, dual_clip)


GRPO_FAR = {"p1-solver-t0": [2.0, 0.5]}
"""A < 0; token 0's ratio e^2 above the dual clip, token 1's e^0.5 inside it; the row's
geometric-mean ratio e^1.25 outside [1/3, 3]."""


def check_grpo():
    check("grpo", drmas_rows(), GRPO_FAR, grpo_reference)


def test_grpo_is_its_source(monkeypatch):
    check_grpo()
    fails_when_changed(monkeypatch, check_grpo, "grpo", [
        {"trajectory_mean": False},  # every call a member: the looped copy would weigh twice
        {"alpha": 0.0, "local_weight": 1.0},
        {"sequence_ratio": "mask"},
        {"zero_advantage_rows": "drop"},
        {"dual_clip": None},
    ])


def test_grpo_far_off_policy_row_gets_the_sources_gradient(monkeypatch):
    loss, grad, _ = one_row("grpo", [2.0, 0.5], -0.5)
    assert loss == pytest.approx(ppo_token_mean([(-0.5, [2.0, 0.5])], clip=0.2, dual_clip=3.0))
    assert grad == pytest.approx([0.0, 0.5 * math.exp(0.5) / 2])  # -A ratio / n on the token inside the dual clip
    monkeypatch.setitem(ALGORITHM_PRESETS["grpo"], "sequence_ratio", "mask")
    assert one_row("grpo", [2.0, 0.5], -0.5)[1] == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# AT-GRPO


def tree_rows() -> list[dict]:
    """Two AT-GRPO trees (N = 3 siblings per node, a Solver then a Verifier per turn). Tree p's
    rewards are hand-set with the global part varying apart from the local one (AT-GRPO's
    global reward is any team score), so the mix matters under std normalisation; tree q's
    siblings all agree at one node (advantages 0)."""
    spec = {  # (uid, agent, turn) -> [(global, local)] of the siblings
        ("p", "solver", 0): [(1.0, 1.0), (0.5, 0.0), (0.0, 1.0)],
        ("p", "verifier", 0): [(1.0, 1.0), (0.0, 0.0), (0.5, 1.0)],
        ("p", "solver", 1): [(0.0, 0.0), (1.0, 1.0), (0.5, 0.0)],
        ("q", "solver", 0): [(1.0, 1.0), (1.0, 1.0), (1.0, 1.0)],
        ("q", "verifier", 0): [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)],
    }
    rows = []
    for (uid, agent, t), siblings in spec.items():
        for i, (g, l) in enumerate(siblings):
            sid = f"{uid}-{agent}-t{t}-c{i}"
            rows.append(row(sid, len(ATGRPO_FAR.get(sid, [])) or 2 + (i + t) % 3, strategy="tree", uid=uid, traj_uid=f"{uid}-b{i}", sample_idx=i,
                            agent_id=agent, turn=t, step=2 * t + (agent == "verifier"), global_reward=g, local_reward=l, selected=i == 0))
    return rows


ATGRPO_FAR = {"p-solver-t0-c0": [-1.2] * 4, "p-verifier-t0-c1": [1.5, 0.2, -0.1]}
"""The issue's repro: a row with A > 0 and every token at log ratio -1.2 (the row's ratio far
below 1/3): the clip leaves ratio*A (the smaller term), so each token's gradient is -e^-1.2 A / n.
And a row with A < 0 whose first token's ratio e^1.5 is above 3 (a dual clip would bind)."""


def atgrpo_reference(rows, ratios):
    alpha, eps, clip = 1.0, 1e-8, 0.2
    reward = {r["step_id"]: alpha * r["global_reward"] + r["local_reward"] for r in rows}
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault((r["uid"], r["agent_id"], r["turn"]), []).append(reward[r["step_id"]])
    adv = {}
    for r in rows:
        values = groups[(r["uid"], r["agent_id"], r["turn"])]
        centred = [v - statistics.mean(values) for v in values]  # the pseudocode's A = r - mean
        a = reward[r["step_id"]] - statistics.mean(values)
        # the implementation notes: (A - A.mean()) / (A.std() + 1e-8) within the group
        adv[r["step_id"]] = (a - statistics.mean(centred)) / (statistics.stdev(centred) + eps)

    return ppo_reference(rows, adv, ratios, clip, None)


def check_atgrpo():
    rows = tree_rows()
    want, grads, _ = check("atgrpo", rows, ATGRPO_FAR, atgrpo_reference)
    n_tokens = sum(len(r["completion_ids"]) for r in rows)
    a = want[0]["p-solver-t0-c0"]
    assert a > 0 and grads["p-solver-t0-c0"] == pytest.approx([-math.exp(-1.2) * a / n_tokens] * 4, rel=1e-5)


def test_atgrpo_is_its_source(monkeypatch):
    check_atgrpo()
    fails_when_changed(monkeypatch, check_atgrpo, "atgrpo", [
        {"alpha": 0.0, "local_weight": 5.0},  # the change the old test could not see
        {"normalize": "center"},
        {"group_by": ("agent_id",)},
        {"sequence_ratio": "mask"},
        {"zero_advantage_rows": "drop"},
        {"clip_high": 0.28},
        {"dual_clip": 3.0},  # AT-GRPO's clip has no dual clip
    ])


def test_atgrpo_far_off_policy_row_gets_the_sources_gradient(monkeypatch):
    """The issue's repro alone: A > 0, five tokens at log ratio -1.2: -e^-1.2 A / 5 per token."""
    loss, grad, _ = one_row("atgrpo", [-1.2] * 5, 0.8, "tree")
    assert grad == pytest.approx([-math.exp(-1.2) * 0.8 / 5] * 5)
    assert loss == pytest.approx(ppo_token_mean([(0.8, [-1.2] * 5)], clip=0.2, dual_clip=None))
    monkeypatch.setitem(ALGORITHM_PRESETS["atgrpo"], "sequence_ratio", "mask")
    assert one_row("atgrpo", [-1.2] * 5, 0.8, "tree")[1] == [0.0] * 5


# ---------------------------------------------------------------------------------------------
# the expert-iteration plan


def exit_rows() -> list[dict]:
    """One Solver on problem p: 4 iid samples, 2 hinted ones, 2 two-turn feedback samples; and 4
    iid samples of problem q, all right (advantages 0: still samples of the plan's N)."""
    rows = [row(f"p-i{k}", 2 + k % 3, local_reward=r, global_reward=r) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    rows += [row(f"q-i{k}", 3, uid="q", local_reward=1.0, global_reward=1.0) for k in range(4)]
    rows += [row(f"p-h{k}", 3, strategy="prompt_aug", local_reward=r, global_reward=r, sampling_messages=[HINT, PROBLEM],
                 prompt_ids=encode_prompt(TOK, [HINT, PROBLEM])) for k, r in enumerate([1.0, 0.0])]
    for k, r in enumerate([1.0, 0.0]):
        rows.append(row(f"p-f{k}-t0", 2, strategy="feedback", traj_uid=f"f{k}", local_reward=0.0, global_reward=0.0))
        rows.append(row(f"p-f{k}-t1", 4, strategy="feedback", traj_uid=f"f{k}", turn=1, step=2, local_reward=r, global_reward=r,
                        sampling_messages=FEEDBACK_CONTEXT, prompt_ids=encode_prompt(TOK, FEEDBACK_CONTEXT)))
    return rows


EXIT_FAR = {"p-f0-t1": [-3.0, -2.5, -2.9, -2.7]}
"""The feedback second attempt unlikely without the feedback: p/q = e^-11.1 for the row."""


def exit_reference(rows, ratios):
    w = {"iid": 1.0, "prompt_aug": 1.0, "feedback": 1.0}
    samples = [r for r in rows if not (r["strategy"] == "feedback" and r["turn"] == 0)]  # attempt 1: weight 0, not a sample
    groups: dict[tuple, list[float]] = {}
    for r in samples:
        groups.setdefault((r["uid"], r["strategy"], r["turn"]), []).append(r["local_reward"])
    adv = {r["step_id"]: r["local_reward"] - statistics.mean(groups[(r["uid"], r["strategy"], r["turn"])]) for r in samples}
    n = len(samples)
    n_s = {s: sum(r["strategy"] == s for r in samples) for s in w}
    weight = {r["step_id"]: w[r["strategy"]] / n_s[r["strategy"]] * n / sum(w.values()) for r in samples}

    def loss_of(lrs):
        return -sum(math.exp(sum(lrs[r["step_id"]])) * adv[r["step_id"]] * weight[r["step_id"]] for r in samples) / n

    return adv, loss_of(ratios), finite_difference(loss_of, {r["step_id"]: ratios[r["step_id"]] for r in samples})


def check_exit():
    _, _, view = check("exit", exit_rows(), EXIT_FAR, exit_reference)
    assert "p-f0-t0" not in view.column("step_id").to_pylist()
    prompts = dict(zip(view.column("step_id").to_pylist(), view.column("train_prompt_ids").to_pylist()))
    assert prompts["p-h0"] == prompts["p-f0-t1"] == encode_prompt(TOK, [PROBLEM])  # hint and feedback out of the context
    weights = view.column("sample_weight").to_pylist()
    assert sum(weights) / len(weights) == pytest.approx(1.0)  # w_s / n_s normalised over the samples


def test_exit_is_the_plan(monkeypatch):
    check_exit()
    fails_when_changed(monkeypatch, check_exit, "exit", [
        {"zero_advantage_rows": "drop"},  # N would be the rows kept, not every sample
        {"normalize": "std"},
        {"strategy_weights": ("iid=2", "prompt_aug=1", "feedback=1")},
        {"strategy_weights": ()},
        {"sequence_ratio": "mask"},
        {"feedback_first_attempt": "iid"},
        {"loss": "is"},
    ])


# ---------------------------------------------------------------------------------------------
# maxit: the project's own rejection sampling


def maxit_reference(rows, ratios):
    passed = [r for r in rows if r["local_reward"] >= 1.0]  # its own action right, all-right groups included
    tokens = sum(len(r["completion_ids"]) for r in passed)

    def loss_of(lrs):
        return -sum(sum(lq + lr for lq, lr in zip(r["completion_logprobs"], lrs[r["step_id"]])) for r in passed) / tokens

    return None, loss_of(ratios), finite_difference(loss_of, ratios)


def check_maxit():
    rows = [row(f"p-i{k}", 2 + k % 3, local_reward=r, global_reward=1.0) for k, r in enumerate([1.0, 0.0, 1.0, 0.0])]
    rows += [row(f"q-i{k}", 3, uid="q", local_reward=1.0, global_reward=1.0) for k in range(3)]
    check("maxit", rows, {}, maxit_reference)


def test_maxit_is_its_own_rejection_sampling(monkeypatch):
    check_maxit()
    fails_when_changed(monkeypatch, check_maxit, "maxit", [{"loss": "ppo"}, {"loss": "exit"}])


def test_only_the_maxit_default_keeps_the_sequence_ratio_mask():
    """The sources' presets apply no mask; maxit's policy-gradient losses keep it on the hinted and
    feedback rows (docs/ALGORITHMS.md says why), and `--sequence-ratio mask` turns it on."""
    for algorithm in ("drmas", "atgrpo", "grpo", "exit"):
        loss = Settings(algorithm=algorithm).run_config().train.loss
        assert {loss.ratio_for(s).mode for s in ("iid", "prompt_aug", "feedback", "tree")} == {"none"}, algorithm
        masked = Settings(algorithm=algorithm, sequence_ratio="mask").run_config().train.loss
        assert {masked.ratio_for(s).mode for s in ("iid", "prompt_aug", "feedback", "tree")} == {"mask"}, algorithm
    ppo = Settings(loss="ppo").run_config().train.loss
    assert {ppo.ratio_for(s).mode for s in ("iid", "prompt_aug", "feedback", "tree")} == {"mask"}
    assert Settings(loss="ppo", sequence_ratio="none").run_config().train.loss.ratio_for("iid").mode == "none"
    assert Settings(loss="ppo", sequence_ratio="none").run_config().train.loss.ratio_for("prompt_aug").mode == "mask"  # maxit's hinted rows


# ---------------------------------------------------------------------------------------------
# strategies outside a preset's source


def notes(**settings) -> list[str]:
    """What `maxit run` says of these settings' strategies outside the algorithm's source."""
    s = Settings(**settings)
    return unsourced_strategies(s.algorithm, s.strategies, s.reward_mix()[0])


def test_a_strategy_outside_the_source_is_named():
    """Warned about, not refused: a setting given explicitly wins over the preset, and the rows
    are well defined; the note says what departs (for tree rows under a team reward, the reward)."""
    said = notes(algorithm="drmas", strategies=("iid", "tree"))
    assert len(said) == 1 and "'tree'" in said[0] and "DrMAS" in said[0] and "final reward" in said[0]
    assert notes(algorithm="drmas") == []
    assert notes(algorithm="atgrpo", strategies=("tree", "iid"))[0].startswith("--algorithm atgrpo: strategy 'iid'")
    assert notes(algorithm="exit", strategies=("iid", "prompt_aug")) == []
    assert notes(strategies=("tree", "iid")) == []  # maxit's strategies are its own
