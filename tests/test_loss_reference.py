"""compute_loss against independent, plain-Python implementations of the seeds' losses.

Each reference is written from its source, not from loss.py, on hand-built rows of 2-5 tokens
with padding, split into two micro-batches that add up to the minibatch (the trainer passes the
minibatch's count as each micro-batch's denominator). The loss value and the gradient with
respect to logp are both compared: the gradient against the source's own formula where it
gives one (the plan's g) and against central differences of the reference loss.

(a) the expert-iteration plan (seeds/004): g = (1/N) sum_i (p_train/q_s) A_i grad log p_train,
    p_train/q_s the likelihood ratio of the whole completion;
(b) verl's `compute_policy_loss` with dual clip (clip_ratio_c), as DrMAS trains (seeds/002),
    token-mean aggregation;
(c) AT-GRPO's PPO-clip (seeds/003): -min(ratio A, clip(ratio, 1-eps, 1+eps) A), token mean.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.learn.loss import LossBatch, aggregation_count, compute_loss

# ---------------------------------------------------------------------------------------------
# hand-built rows: (logp, logq, advantage, sample weight, strategy) with 2-5 completion tokens


def _row(logp, logq, adv, weight=1.0, strategy="iid"):
    assert len(logp) == len(logq) and 2 <= len(logp) <= 5
    return {"logp": list(logp), "logq": list(logq), "adv": adv, "w": weight, "strategy": strategy}


def _batch(rows, pad_logp=-7.0, pad_logq=0.0) -> LossBatch:
    """Rows padded to the longest; padding gets arbitrary logp / logq values under mask 0."""
    t = max(len(r["logp"]) for r in rows)
    logp = [r["logp"] + [pad_logp] * (t - len(r["logp"])) for r in rows]
    logq = [r["logq"] + [pad_logq] * (t - len(r["logq"])) for r in rows]
    mask = [[1.0] * len(r["logp"]) + [0.0] * (t - len(r["logp"])) for r in rows]
    return LossBatch(
        logp=torch.tensor(logp, dtype=torch.float64, requires_grad=True),
        logq=torch.tensor(logq, dtype=torch.float64),
        mask=torch.tensor(mask, dtype=torch.float64),
        advantage=torch.tensor([r["adv"] for r in rows], dtype=torch.float64),
        sample_weight=torch.tensor([r["w"] for r in rows], dtype=torch.float64),
        reward=torch.tensor([1.0] * len(rows), dtype=torch.float64),
        strategy=[r["strategy"] for r in rows],
        agent=["solver"] * len(rows),
    )


def _minibatch_loss(micro_batches, cfg):
    """The trainer's way: every micro-batch divides by the whole minibatch's count; the
    minibatch's loss is the sum. Returns (loss, per-row gradients without padding)."""
    batches = [_batch(rows) for rows in micro_batches]
    denominator = sum(aggregation_count(b.mask, cfg.aggregation) for b in batches)
    total = 0.0
    grads = []
    for b, rows in zip(batches, micro_batches):
        out = compute_loss(b, cfg, denominator=denominator)
        out.loss.backward()
        total += out.loss.item()
        for i, r in enumerate(rows):
            n = len(r["logp"])
            grads.append(b.logp.grad[i, :n].tolist())
            assert b.logp.grad[i, n:].abs().sum().item() == 0.0  # padding gets no gradient
    return total, grads


def _finite_difference(ref, rows, h=1e-6):
    """Central differences of the reference loss with respect to every token's logp."""
    grads = []
    for i, r in enumerate(rows):
        g = []
        for t in range(len(r["logp"])):
            up = [dict(x, logp=list(x["logp"])) for x in rows]
            down = [dict(x, logp=list(x["logp"])) for x in rows]
            up[i]["logp"][t] += h
            down[i]["logp"][t] -= h
            g.append((ref(up) - ref(down)) / (2 * h))
        grads.append(g)
    return grads


def _assert_grads(got, want, rel=1e-6, abs=1e-9):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=rel, abs=abs)


# ---------------------------------------------------------------------------------------------
# (a) the expert-iteration plan's estimator


def plan_loss(rows) -> float:
    """-(1/N) sum_i (p_train(y_i|x_train) / q_s(y_i|x_sample)) A_i w_i: the plan's stratified
    estimator, the ratio of the whole completion (product of its token ratios), N the samples."""
    n = len(rows)
    return -sum(math.exp(sum(r["logp"]) - sum(r["logq"])) * r["adv"] * r["w"] for r in rows) / n


def plan_gradient(rows):
    """The plan's g, token by token: (1/N) (p/q)_i A_i w_i * d log p_train(y_i) / d logp[i,t],
    and log p_train(y_i) = sum_t logp[i,t], so every token of row i gets (1/N) (p/q)_i A_i w_i.
    Returned negated: the gradient of the loss that is minimised."""
    n = len(rows)
    return [[-math.exp(sum(r["logp"]) - sum(r["logq"])) * r["adv"] * r["w"] / n] * len(r["logp"]) for r in rows]


EXIT_ROWS = [
    [
        _row([-0.5, -1.0, -0.2], [-0.6, -0.9, -0.4], 1.0, 1.5),  # ratio e^0.2
        _row([-2.0, -0.1], [-1.5, -0.3], -0.5, 1.0, "prompt_aug"),  # ratio e^-0.3
    ],
    [
        _row([-0.3, -0.3, -0.3, -0.3, -0.3], [-0.3, -0.25, -0.35, -0.3, -0.2], 0.75, 0.5),  # 5 tokens
        # feedback-like: the second attempt is likely under the feedback, unlikely without it
        _row([-3.0, -2.5, -4.0, -2.0], [-0.05, -0.1, -0.02, -0.2], 1.25, 2.0, "feedback"),  # ratio e^-11.13
        _row([-0.1, -0.2], [-0.1, -0.2], -1.0, 1.0),  # on-policy, ratio 1
    ],
]


def test_exit_is_the_plans_estimator_over_two_micro_batches():
    cfg = LossConfig(kind="exit")
    assert (cfg.ratio.mode, cfg.aggregation) == ("none", "seq-mean-token-sum")  # the plan's exact form
    rows = [r for mb in EXIT_ROWS for r in mb]
    loss, grads = _minibatch_loss(EXIT_ROWS, cfg)
    assert loss == pytest.approx(plan_loss(rows), rel=1e-12)
    _assert_grads(grads, plan_gradient(rows), rel=1e-12, abs=1e-15)
    _assert_grads(grads, _finite_difference(plan_loss, rows))
    # the feedback row counts with its tiny likelihood ratio, every token alike
    fb = grads[3]
    assert fb[0] == pytest.approx(-math.exp(-11.13) * 1.25 * 2.0 / 5, rel=1e-9)
    assert max(fb) == min(fb)
    # the same minibatch in one piece gives the same loss (rows as the denominator)
    assert compute_loss(_batch(rows), cfg).loss.item() == pytest.approx(plan_loss(rows), rel=1e-12)


def test_exit_diagnostics_report_the_plans_sequence_ratios():
    rows = [r for mb in EXIT_ROWS for r in mb]
    d = compute_loss(_batch(rows), LossConfig(kind="exit")).diagnostics.overall
    ratios = [math.exp(sum(r["logp"]) - sum(r["logq"])) for r in rows]
    tokens = [t for r in rows for t in zip(r["logp"], r["logq"])]
    assert d.n_rows == 5 and d.n_tokens == len(tokens)
    assert d.mean_log_ratio == pytest.approx(sum(p - q for p, q in tokens) / len(tokens))
    assert d.ess == pytest.approx(sum(ratios) ** 2 / sum(x * x for x in ratios))
    assert d.clip_fraction == 0.0 and d.masked_fraction == 0.0 and d.truncated_fraction == 0.0


def test_is_is_not_the_plans_estimator_on_ten_tokens():
    """10 tokens at log ratio -0.3: the plan weighs the row by exp(-3) = 0.05, the per-token
    "is" loss each token by exp(-0.3) = 0.74 (and divides by tokens, not rows)."""
    logp, logq = [[-0.3 - 1.0] * 10], [[-1.0] * 10]

    def one_row():
        return LossBatch(
            logp=torch.tensor(logp, dtype=torch.float64, requires_grad=True),
            logq=torch.tensor(logq, dtype=torch.float64),
            mask=torch.ones(1, 10, dtype=torch.float64),
            advantage=torch.tensor([1.0], dtype=torch.float64),
            sample_weight=torch.tensor([1.0], dtype=torch.float64),
            reward=torch.tensor([1.0], dtype=torch.float64),
            strategy=["feedback"],
            agent=["solver"],
        )

    exit_batch, is_batch = one_row(), one_row()
    exit_out = compute_loss(exit_batch, LossConfig(kind="exit"))
    is_out = compute_loss(is_batch, LossConfig(kind="is", ratio=RatioConfig(mode="none")))
    exit_out.loss.backward()
    is_out.loss.backward()
    assert exit_out.loss.item() == pytest.approx(-math.exp(-3.0))  # -r A, r = 0.0498
    assert exit_batch.logp.grad[0].tolist() == pytest.approx([-math.exp(-3.0)] * 10)
    assert is_out.loss.item() == pytest.approx(-math.exp(-0.3))  # token mean of -0.741
    assert is_batch.logp.grad[0].tolist() == pytest.approx([-math.exp(-0.3) / 10] * 10)
    assert exit_out.loss.item() != pytest.approx(is_out.loss.item(), rel=0.5)
    assert exit_out.diagnostics.overall.ess == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# (b) verl's compute_policy_loss with dual clip, token-mean


def verl_dual_clip_loss(rows, clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0) -> float:
    """verl (trainer/ppo/core_algos.py, compute_policy_loss), per token, in plain Python:
    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    pg_losses1 = -A * ratio;  pg_losses2 = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = max(pg_losses1, pg_losses2)
    pg_losses3 = -A * clip_ratio_c;  clip_pg_losses2 = min(pg_losses3, clip_pg_losses1)
    pg_losses = clip_pg_losses2 where A < 0 else clip_pg_losses1
    loss_agg_mode "token-mean": sum over the response tokens / their count."""
    total, count = 0.0, 0
    for r in rows:
        a = r["adv"]
        for lp, lq in zip(r["logp"], r["logq"]):
            ratio = math.exp(min(max(lp - lq, -20.0), 20.0))
            pg1 = -a * ratio
            pg2 = -a * min(max(ratio, 1 - clip_low), 1 + clip_high)
            c1 = max(pg1, pg2)
            if clip_ratio_c is not None and a < 0:
                total += min(-a * clip_ratio_c, c1)
            else:
                total += c1
            count += 1
    return total / count


VERL_ROWS = [
    [
        _row([-1.0, -0.5, -2.0], [-1.0, -0.4, -2.1], 1.0),  # ratios near 1: inside the clip
        # A < 0 and a huge ratio on the second token (p/q = 10 > 3): the dual clip binds
        _row([-0.2, -0.1, -0.3, -0.4], [-0.25, -0.1 - math.log(10.0), -0.3, -0.35], -0.8),
    ],
    [
        _row([-0.1, -0.1], [-0.1 - math.log(2.0), -0.1 - math.log(1.5)], 0.6),  # A > 0, ratios 2, 1.5: clipped high
        _row([-1.0, -1.2, -1.1, -0.9, -1.3], [-1.0 + math.log(2.0), -1.2, -1.1 - math.log(2.0), -0.9, -1.3], -0.4),  # 0.5 clipped low, 2 unclipped
    ],
]


def test_ppo_dual_clip_is_verls_compute_policy_loss():
    cfg = LossConfig(kind="ppo", eps_low=0.2, eps_high=0.2, dual_clip=3.0, ratio=RatioConfig(mode="none"), aggregation="token-mean")
    rows = [r for mb in VERL_ROWS for r in mb]
    loss, grads = _minibatch_loss(VERL_ROWS, cfg)
    assert loss == pytest.approx(verl_dual_clip_loss(rows), rel=1e-12)
    _assert_grads(grads, _finite_difference(verl_dual_clip_loss, rows))
    n_tokens = sum(len(r["logp"]) for r in rows)
    # the dual-clipped token: constant loss -A c, no gradient; without the dual clip, -A rho
    assert grads[1][1] == 0.0
    assert grads[1][0] == pytest.approx(0.8 * math.exp(0.05) / n_tokens)  # its neighbour: -A rho / n
    plain_cfg = LossConfig(kind="ppo", eps_low=0.2, eps_high=0.2, ratio=RatioConfig(mode="none"))
    plain_loss, plain_grads = _minibatch_loss(VERL_ROWS, plain_cfg)
    assert plain_grads[1][1] == pytest.approx(0.8 * 10.0 / n_tokens)
    assert plain_loss == pytest.approx(verl_dual_clip_loss(rows, clip_ratio_c=None), rel=1e-12)
    assert plain_loss - loss == pytest.approx(0.8 * (10.0 - 3.0) / n_tokens)
    # clipped tokens: A > 0 above 1.2 (2 tokens), A < 0 below 0.8 (1), the dual-clipped one (1)
    d = compute_loss(_batch(rows), cfg).diagnostics.overall
    assert d.n_clipped_tokens == 4 and d.n_dual_clipped_tokens == 1
    assert d.dual_clip_fraction == pytest.approx(1 / n_tokens)


# ---------------------------------------------------------------------------------------------
# (c) AT-GRPO's PPO-clip


def at_grpo_loss(rows, eps=0.2) -> float:
    """AT-GRPO (seeds/003): ratio = policy / old_policy per token, clipped_ratio = clip(ratio,
    1-eps, 1+eps), loss = -min(ratio * A, clipped_ratio * A), averaged over the tokens."""
    losses = []
    for r in rows:
        for lp, lq in zip(r["logp"], r["logq"]):
            ratio = math.exp(lp - lq)
            losses.append(-min(ratio * r["adv"], min(max(ratio, 1 - eps), 1 + eps) * r["adv"]))
    return sum(losses) / len(losses)


AT_GRPO_ROWS = [
    [_row([-0.5, -0.7, -0.2], [-0.6, -0.7, -0.1], 0.9), _row([-1.0, -0.3], [-1.0 - math.log(1.5), -0.2], -0.9)],
    [_row([-0.4, -0.8, -0.6, -0.2], [-0.4 + math.log(2.0), -0.9, -0.5, -0.2 - math.log(1.4)], 0.3)],
]


def test_ppo_is_at_grpos_clip():
    cfg = LossConfig(kind="ppo", eps_low=0.2, eps_high=0.2, ratio=RatioConfig(mode="none"))
    rows = [r for mb in AT_GRPO_ROWS for r in mb]
    loss, grads = _minibatch_loss(AT_GRPO_ROWS, cfg)
    assert loss == pytest.approx(at_grpo_loss(rows), rel=1e-12)
    _assert_grads(grads, _finite_difference(at_grpo_loss, rows))
    n = sum(len(r["logp"]) for r in rows)
    assert grads[1][0] == pytest.approx(0.9 * 1.5 / n)  # A < 0, ratio 1.5: not clipped (min picks it)
    assert grads[2][0] == pytest.approx(-0.3 * 0.5 / n)  # A > 0, ratio 0.5: the min is the unclipped term
    assert grads[2][3] == 0.0  # A > 0, ratio 1.4 > 1.2: clipped, no gradient
