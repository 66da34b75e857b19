"""loss.py against plain-Python references: ratios, PPO clip, per-strategy sequence caps,
aggregations, stratified weights (the expert-iteration plan's second test), the rs loss, the plain
importance-sampling loss, the plan's estimator ("exit": its defaults, per-strategy ratio handling,
replay rows, KL, clamp), verl's dual clip, the proximal (decoupled PPO) anchor, minibatch
denominators, KL, diagnostics, config checks. tests/test_loss_reference.py compares the seeds'
losses, written out independently, with compute_loss."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.config.loss import LossConfig, RatioConfig
from pipeline.config.train import TrainConfig
from pipeline.learn.loss import LossBatch, aggregate, aggregation_count, compute_loss


def make_batch(logp, logq, adv, weight=None, strategy=None, agent=None, reward=None, lengths=None, ref=None, old=None):
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    logq = torch.tensor(logq, dtype=torch.float64)
    b, t = logp.shape
    mask = torch.ones(b, t, dtype=torch.float64)
    if lengths is not None:
        for i, n in enumerate(lengths):
            mask[i, n:] = 0.0
    return LossBatch(
        logp=logp,
        logq=logq,
        mask=mask,
        advantage=torch.tensor(adv, dtype=torch.float64),
        sample_weight=torch.tensor(weight if weight is not None else [1.0] * b, dtype=torch.float64),
        reward=torch.tensor(reward if reward is not None else [1.0] * b, dtype=torch.float64),
        strategy=strategy or ["iid"] * b,
        agent=agent or ["solver"] * b,
        ref_logp=None if ref is None else torch.tensor(ref, dtype=torch.float64),
        old_logp=None if old is None else torch.tensor(old, dtype=torch.float64),
    )


def reference_ppo(batch: LossBatch, cfg: LossConfig) -> float:
    """The loss written out row by row in plain Python."""
    logp, logq, mask = batch.logp.tolist(), batch.logq.tolist(), batch.mask.tolist()
    per_row_sums, per_row_counts = [], []
    for i in range(len(logp)):
        toks = [t for t in range(len(logp[i])) if mask[i][t] > 0]
        lr = [max(-20, min(20, logp[i][t] - logq[i][t])) for t in toks]
        rc = cfg.ratio_for(batch.strategy[i])
        seq = sum(lr) if rc.level == "sum" else sum(lr) / max(len(toks), 1)
        s = math.exp(seq)
        factor = 1.0
        if rc.mode == "mask" and not rc.low <= s <= rc.high:
            factor = 0.0
        if rc.mode == "truncate" and s > rc.high:
            factor = rc.high / s
        a = float(batch.advantage[i] * batch.sample_weight[i])
        losses = []
        for x in lr:
            rho = math.exp(x)
            losses.append(-min(rho * a, min(max(rho, 1 - cfg.eps_low), 1 + cfg.eps_high) * a) * factor)
        per_row_sums.append(sum(losses))
        per_row_counts.append(len(toks))
    n = len(logp)
    if cfg.aggregation == "token-mean":
        return sum(per_row_sums) / max(sum(per_row_counts), 1)
    if cfg.aggregation == "seq-mean-token-mean":
        return sum(s / max(c, 1) for s, c in zip(per_row_sums, per_row_counts)) / n
    return sum(per_row_sums) / n


def test_on_policy_ratio_is_one_and_loss_is_minus_weighted_advantage():
    b = make_batch([[-1.0, -2.0], [-0.5, -0.7]], [[-1.0, -2.0], [-0.5, -0.7]], [1.0, -0.5], weight=[2.0, 1.0])
    out = compute_loss(b, LossConfig(kind="ppo"))
    assert out.loss.item() == pytest.approx(-(2 * 1.0 * 2 + 1 * -0.5 * 2) / 4)
    d = out.diagnostics.overall
    assert d.mean_log_ratio == 0.0 and d.clip_fraction == 0.0 and d.masked_fraction == 0.0
    assert d.ess == pytest.approx(2.0) and d.n_tokens == 4


def test_ppo_clip_counts_and_gradients():
    # row 0: A > 0, ratio 1.5 > 1.28 -> clipped, no gradient; row 1: A < 0, ratio 0.5 < 0.8 -> clipped
    # row 2: A > 0, ratio 0.5 -> unclipped branch (min picks rho * A), gradient flows
    logq = [[0.0], [0.0], [0.0]]
    logp = [[math.log(1.5)], [math.log(0.5)], [math.log(0.5)]]
    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))
    b = make_batch(logp, [[-1e-9 + x for x in r] for r in logq], [1.0, -1.0, 1.0])
    out = compute_loss(b, cfg)
    out.loss.backward()
    g = b.logp.grad[:, 0].tolist()
    assert g[0] == 0.0 and g[1] == 0.0 and g[2] != 0.0
    assert out.diagnostics.overall.n_clipped_tokens == 2
    assert out.loss.item() == pytest.approx(reference_ppo(b, cfg))


def test_sequence_mask_and_truncate_per_strategy():
    low_ratio = math.log(0.25)  # sequence ratio 1/4, below the 1/3 cap
    logp = [[low_ratio, low_ratio]] * 3
    logq = [[0.0, 0.0]] * 3
    strategies = ["iid", "prompt_aug", "feedback"]
    cfg = LossConfig(kind="ppo", 
        eps_low=0.9,  # keep the token clip out of the way
        ratio=RatioConfig(mode="mask"),
        ratio_by_strategy={"prompt_aug": RatioConfig(mode="truncate"), "feedback": RatioConfig(mode="none")},
    )
    b = make_batch(logp, logq, [1.0, 1.0, 1.0], strategy=strategies)
    out = compute_loss(b, cfg)
    out.loss.backward()
    g = b.logp.grad.sum(-1).tolist()
    assert g[0] == 0.0  # masked
    assert g[1] / g[2] == pytest.approx(1.0)  # truncation never scales a small ratio up: untouched
    diag = out.diagnostics
    assert diag.by_strategy["iid"].masked_fraction == 1.0
    assert diag.by_strategy["prompt_aug"].truncated_fraction == 0.0
    assert diag.by_strategy["feedback"].masked_fraction == 0.0
    assert diag.overall.masked_fraction == pytest.approx(1 / 3)
    assert out.loss.item() == pytest.approx(reference_ppo(b, cfg))


def test_sequence_level_sum_vs_mean():
    # token log ratios -0.5 each over 4 tokens: mean -0.5 (s=0.61, inside), sum -2 (s=0.135, outside)
    b = make_batch([[-0.5] * 4], [[0.0] * 4], [1.0])
    inside = compute_loss(b, LossConfig(kind="ppo", eps_low=0.9, ratio=RatioConfig(level="mean")))
    outside = compute_loss(b, LossConfig(kind="ppo", eps_low=0.9, ratio=RatioConfig(level="sum")))
    assert inside.diagnostics.overall.n_masked_rows == 0
    assert outside.diagnostics.overall.n_masked_rows == 1
    assert outside.loss.item() == 0.0


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    b=st.integers(1, 4),
    t=st.integers(1, 5),
    aggregation=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]),
    mode=st.sampled_from(["mask", "truncate", "none"]),
    level=st.sampled_from(["mean", "sum"]),
)
def test_matches_plain_reference(data, b, t, aggregation, mode, level):
    f = st.floats(-3.0, 0.0, allow_nan=False)
    logp = [[data.draw(f) for _ in range(t)] for _ in range(b)]
    logq = [[data.draw(f) for _ in range(t)] for _ in range(b)]
    adv = [data.draw(st.floats(-2.0, 2.0)) for _ in range(b)]
    w = [data.draw(st.floats(0.1, 3.0)) for _ in range(b)]
    lengths = [data.draw(st.integers(1, t)) for _ in range(b)]
    cfg = LossConfig(kind="ppo", aggregation=aggregation, ratio=RatioConfig(mode=mode, level=level))
    batch = make_batch(logp, logq, adv, weight=w, lengths=lengths)
    out = compute_loss(batch, cfg)
    assert out.loss.item() == pytest.approx(reference_ppo(batch, cfg), rel=1e-9, abs=1e-12)


def test_stratified_weights_scale_each_rows_gradient():
    # two strategies with explicit mixture weights: sample_weight = w_s * N / n_s
    w_s = {"iid": 0.75, "prompt_aug": 0.25}
    strategy = ["iid", "iid", "prompt_aug", "prompt_aug", "prompt_aug", "prompt_aug"]
    n_s = {s: strategy.count(s) for s in w_s}
    n = len(strategy)
    weight = [w_s[s] * n / n_s[s] for s in strategy]
    assert weight[:2] == [2.25, 2.25] and weight[2] == pytest.approx(0.375)
    logp = [[-0.3, -0.6]] * n
    adv = [1.0, -1.0, 0.5, -0.5, 1.5, 0.25]
    cfg = LossConfig(kind="ppo")
    weighted = make_batch(logp, logp, adv, weight=weight, strategy=strategy)
    plain = make_batch(logp, logp, adv, strategy=strategy)
    lw, lp = compute_loss(weighted, cfg).loss, compute_loss(plain, cfg).loss
    lw.backward()
    lp.backward()
    for i in range(n):
        assert weighted.logp.grad[i].tolist() == pytest.approx((weight[i] * plain.logp.grad[i]).tolist())
    # the loss is the stratified mixture: sum_s w_s * (mean loss of stratum s)
    per_row = [-a * 1.0 for a in adv]  # on-policy token loss of a row is -A (ratio 1), 2 tokens each
    mixture = sum(w_s[s] * sum(l for l, si in zip(per_row, strategy) if si == s) / n_s[s] for s in w_s)
    assert lw.item() == pytest.approx(mixture)


def test_rs_loss_ignores_rows_below_threshold():
    logp = [[-0.5, -1.0], [-2.0, -3.0], [-0.1, -0.2], [-4.0, -4.0]]
    b = make_batch(logp, logp, [0.0] * 4, weight=[1.0, 1.0, 2.0, 1.0], reward=[1.0, 0.0, 1.0, float("nan")])
    cfg = LossConfig(kind="rs", rs_threshold=1.0)
    out = compute_loss(b, cfg)
    out.loss.backward()
    assert b.logp.grad[1].abs().sum().item() == 0.0
    assert b.logp.grad[3].abs().sum().item() == 0.0
    assert out.loss.item() == pytest.approx((1.0 * 1.5 + 2.0 * 0.3) / 4)  # token-mean over passing rows' tokens
    assert out.diagnostics.overall.n_rs_rows == 2
    none_pass = make_batch(logp, logp, [0.0] * 4, reward=[0.0] * 4)
    zero = compute_loss(none_pass, cfg).loss
    zero.backward()
    assert zero.item() == 0.0 and none_pass.logp.grad.abs().sum().item() == 0.0


def test_kl_k3_to_reference():
    logp = [[-1.0, -1.0]]
    ref = [[-1.5, -0.5]]
    b = make_batch(logp, logp, [0.0], ref=ref)
    out = compute_loss(b, LossConfig(kind="ppo", beta=0.1))
    k3 = [math.exp(r - p) - (r - p) - 1 for r, p in zip(ref[0], logp[0])]
    assert out.loss.item() == pytest.approx(0.1 * sum(k3) / 2)
    assert out.diagnostics.overall.mean_kl == pytest.approx(sum(k3) / 2)
    with pytest.raises(ValueError, match="ref_logp"):
        compute_loss(make_batch(logp, logp, [0.0]), LossConfig(kind="ppo", beta=0.1))


def test_extreme_ratios_stay_finite_and_diagnostics_merge():
    b = make_batch([[0.0, 0.0], [-1.0, -1.0]], [[-80.0, -80.0], [-1.0, -1.0]], [-1.0, 1.0], strategy=["a", "b"], agent=["solver", "verifier"])
    out = compute_loss(b, LossConfig(kind="ppo", ratio=RatioConfig(mode="none")))
    assert math.isfinite(out.loss.item())
    d = out.diagnostics
    both = d.merge(d)
    assert both.overall.n_rows == 4 and both.by_agent["verifier"].n_rows == 2
    s = [math.exp(20.0), 1.0]
    assert d.overall.ess == pytest.approx(sum(s) ** 2 / sum(x * x for x in s))
    metrics = d.as_metrics()
    assert "strategy/a/clip_fraction" in metrics and "agent/verifier/ess_fraction" in metrics


def test_aggregate_modes():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(per_token, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(per_token, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(per_token, mask, "token-mean", rows=torch.tensor([0.0, 1.0])).item() == pytest.approx(4.0)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: LossConfig(kind="dpo"), "LossConfig.kind"),
        (lambda: LossConfig(kind="ppo", eps_low=1.5), "LossConfig.eps_low"),
        (lambda: LossConfig(kind="ppo", aggregation="sum"), "LossConfig.aggregation"),
        (lambda: LossConfig(kind="ppo", beta=-1.0), "LossConfig.beta"),
        (lambda: LossConfig(kind="ppo", ratio_by_strategy={"iid": 3.0}), "ratio_by_strategy['iid']"),
        (lambda: RatioConfig(low=2.0), "RatioConfig.low"),
        (lambda: RatioConfig(mode="clip"), "RatioConfig.mode"),
        (lambda: TrainConfig(lr=0.0), "TrainConfig.lr"),
        (lambda: TrainConfig(minibatch_size=10, micro_batch_size=4), "TrainConfig.minibatch_size"),
        (lambda: TrainConfig(epochs=0), "TrainConfig.epochs"),
        (lambda: LossConfig(kind="exit", aggregation="token-mean"), "LossConfig.aggregation"),
        (lambda: LossConfig(kind="exit", anchor="proximal"), "LossConfig.anchor"),
        (lambda: LossConfig(kind="ppo", dual_clip=1.0), "LossConfig.dual_clip"),
        (lambda: LossConfig(kind="ppo", dual_clip=float("inf")), "LossConfig.dual_clip"),
        (lambda: LossConfig(kind="is", dual_clip=3.0), "LossConfig.dual_clip"),
    ],
)
def test_config_errors_name_the_field(build, field):
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        build()


def test_defaults_follow_findings():
    cfg = TrainConfig()
    assert cfg.lr == 5e-4
    assert (1 - cfg.loss.eps_low, 1 + cfg.loss.eps_high) == pytest.approx((0.8, 1.28))
    assert (cfg.loss.ratio.mode, cfg.loss.ratio.low, cfg.loss.ratio.high) == ("mask", pytest.approx(1 / 3), 3.0)
    assert cfg.loss.beta == 0.0


def test_ess_uses_the_sequence_likelihood_ratio_at_either_level():
    # row 0: two tokens with log ratio 0.5 each -> sequence ratio e^1 (geometric mean e^0.5)
    b = make_batch([[-0.5, -0.5], [-1.0, -1.0]], [[-1.0, -1.0], [-1.0, -1.0]], [1.0, -1.0])
    r = [math.e, 1.0]
    want = sum(r) ** 2 / sum(x * x for x in r)
    for level in ("mean", "sum"):
        d = compute_loss(b, LossConfig(kind="ppo", ratio=RatioConfig(mode="none", level=level))).diagnostics
        assert d.overall.ess == pytest.approx(want)


def test_truncation_only_ever_shrinks_a_row():
    # token log ratios [0, -6]: mean level s = e^-3, far below the cap; the old two-sided rule
    # multiplied the row by (1/3)/s = 6.7, so a token whose own ratio is 1 got 6.7 times its gradient
    truncate = LossConfig(kind="ppo", eps_low=0.99, eps_high=100.0, ratio=RatioConfig(mode="truncate"))
    none = LossConfig(kind="ppo", eps_low=0.99, eps_high=100.0, ratio=RatioConfig(mode="none"))
    low = make_batch([[0.0, -6.0]], [[0.0, 0.0]], [1.0])
    plain = make_batch([[0.0, -6.0]], [[0.0, 0.0]], [1.0])
    compute_loss(low, truncate).loss.backward()
    compute_loss(plain, none).loss.backward()
    assert low.logp.grad[0].tolist() == pytest.approx(plain.logp.grad[0].tolist())
    # a large ratio (s = 4 > 3) is scaled down to the cap: factor 3/4
    high = make_batch([[math.log(4.0)] * 2], [[0.0, 0.0]], [1.0])
    high_plain = make_batch([[math.log(4.0)] * 2], [[0.0, 0.0]], [1.0])
    out = compute_loss(high, truncate)
    out.loss.backward()
    compute_loss(high_plain, none).loss.backward()
    assert (high.logp.grad / high_plain.logp.grad).tolist()[0] == pytest.approx([0.75, 0.75])
    assert out.diagnostics.overall.n_truncated_rows == 1


def test_plain_importance_sampling_loss_has_no_clip():
    # ratio 1.5 with A > 0: PPO stops the gradient at 1.28, the IS estimator does not
    logp, logq = [[math.log(1.5), math.log(0.5)]], [[0.0, 0.0]]
    cfg = LossConfig(kind="is", ratio=RatioConfig(mode="none"))
    b = make_batch(logp, logq, [2.0], weight=[0.5])
    out = compute_loss(b, cfg)
    assert out.loss.item() == pytest.approx(-(1.5 + 0.5) * 2.0 * 0.5 / 2)
    out.loss.backward()
    # d/dlogp of -exp(logp - logq) * A w is -rho * A w per token
    assert b.logp.grad[0].tolist() == pytest.approx([-1.5 * 1.0 / 2, -0.5 * 1.0 / 2])
    assert out.diagnostics.overall.n_clipped_tokens == 0
    # sequence-ratio handling still applies to it
    masked = compute_loss(make_batch([[math.log(5.0)] * 2], [[0.0, 0.0]], [1.0]), LossConfig(kind="is"))
    assert masked.loss.item() == 0.0 and masked.diagnostics.overall.n_masked_rows == 1


def test_proximal_anchor_clips_against_the_policy_at_the_start_of_the_update():
    # a context-swapped row: q is far from p_old (p_old/q = 0.5), the policy has not moved yet
    # (p_theta = p_old). Against q the token is clipped (ratio 0.5 < 0.8, A < 0): no gradient.
    # Against p_old the ratio is 1: the gradient flows, scaled by the off-policy weight 0.5.
    logp = [[math.log(0.25)]]
    logq = [[math.log(0.5)]]
    cfg_q = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))
    cfg_old = LossConfig(kind="ppo", anchor="proximal", ratio=RatioConfig(mode="none"))
    b_q = make_batch(logp, logq, [-1.0])
    compute_loss(b_q, cfg_q).loss.backward()
    assert b_q.logp.grad.item() == 0.0
    b_old = make_batch(logp, logq, [-1.0], old=logp)
    out = compute_loss(b_old, cfg_old)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.0 * 0.5)  # -min(r A, clip(r) A) * c = 1 * 0.5
    assert b_old.logp.grad.item() == pytest.approx(0.5)
    assert out.diagnostics.overall.n_clipped_tokens == 0
    # the off-policy weight is truncated at off_policy_cap
    big = make_batch([[0.0]], [[math.log(0.01)]], [1.0], old=[[0.0]])
    assert compute_loss(big, LossConfig(kind="ppo", anchor="proximal", off_policy_cap=3.0, ratio=RatioConfig(mode="none"))).loss.item() == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="old_logp"):
        compute_loss(make_batch(logp, logq, [1.0]), cfg_old)


def test_minibatch_denominator_makes_micro_batches_add_up_to_one_token_mean():
    # two micro-batches of 1 and 3 tokens: the mean of their means weighs the lone token 3x too much
    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))
    a = make_batch([[-1.0, -1.0, -1.0]], [[-1.0, -1.0, -1.0]], [1.0], lengths=[1])
    b = make_batch([[-1.0, -1.0, -1.0]], [[-1.0, -1.0, -1.0]], [-1.0], lengths=[3])
    whole = make_batch([[-1.0] * 3, [-1.0] * 3], [[-1.0] * 3, [-1.0] * 3], [1.0, -1.0], lengths=[1, 3])
    total = aggregation_count(a.mask, "token-mean") + aggregation_count(b.mask, "token-mean")
    summed = compute_loss(a, cfg, denominator=total).loss + compute_loss(b, cfg, denominator=total).loss
    assert summed.item() == pytest.approx(compute_loss(whole, cfg).loss.item())
    assert summed.item() == pytest.approx((-1 + 3) / 4)
    mean_of_means = (compute_loss(a, cfg).loss + compute_loss(b, cfg).loss) / 2
    assert mean_of_means.item() == pytest.approx((-1 + 1) / 2)
    # rows for the per-sequence aggregations
    seq = LossConfig(kind="ppo", aggregation="seq-mean-token-mean", ratio=RatioConfig(mode="none"))
    rows = aggregation_count(a.mask, "seq-mean-token-mean") + aggregation_count(b.mask, "seq-mean-token-mean")
    assert rows == 2.0
    got = compute_loss(a, seq, denominator=rows).loss + compute_loss(b, seq, denominator=rows).loss
    assert got.item() == pytest.approx(compute_loss(whole, seq).loss.item())


def test_diagnostics_per_agent_and_strategy_cell():
    b = make_batch([[0.0], [-1.0], [0.0]], [[0.0], [0.0], [0.0]], [1.0, 1.0, 1.0], strategy=["iid", "tree", "iid"], agent=["solver", "solver", "verifier"])
    d = compute_loss(b, LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))).diagnostics
    assert set(d.by_agent_strategy) == {"solver/iid", "solver/tree", "verifier/iid"}
    assert d.by_agent_strategy["solver/tree"].mean_log_ratio == pytest.approx(-1.0)
    assert d.merge(d).by_agent_strategy["verifier/iid"].n_rows == 2


@pytest.mark.parametrize("kind", ["ppo", "is"])
def test_replay_rows_train_by_their_nll_under_the_ratio_losses(kind):
    """Rows of an sft strategy (the Verifier's relabelled replay) have no sampling ratio in their
    context: under ppo / is they are trained as the rs loss trains its rows, -logp * w, inside the
    same token mean; no clip or mask touches them, whatever their stored logq."""
    cfg = LossConfig(kind=kind)
    batch = make_batch(
        [[-0.5, -0.25], [-1.0, -2.0]], [[-0.5, -0.25], [-9.0, -9.0]], [0.5, 1.0], weight=[1.0, 2.0], strategy=["iid", "replay"]
    )
    out = compute_loss(batch, cfg)
    pg_row = -0.5 * (1.0 + 1.0)  # on-policy: rho = 1 on both tokens, A w = 0.5
    nll_row = 2.0 * (1.0 + 2.0)  # -logp * w
    assert out.loss.item() == pytest.approx((pg_row + nll_row) / 4)
    out.loss.backward()
    assert batch.logp.grad[1].tolist() == pytest.approx([-2.0 / 4, -2.0 / 4])
    assert out.diagnostics.by_strategy["replay"].n_rs_rows == 1 and out.diagnostics.by_strategy["replay"].n_masked_rows == 0
    plain = compute_loss(make_batch([[-1.0, -2.0]], [[-9.0, -9.0]], [1.0], strategy=["replay"]), LossConfig(kind=kind, sft_strategies=()))
    assert plain.diagnostics.overall.n_masked_rows == (1 if kind in ("ppo", "is") else 0)  # as a PG row, its ratio e^7.75 is masked


def test_negative_weight_scales_only_negative_advantages():
    batch = make_batch([[-0.5], [-0.5]], [[-0.5], [-0.5]], [1.5, -0.5])
    full = compute_loss(batch, LossConfig(kind="ppo")).loss.item()
    half = compute_loss(batch, LossConfig(kind="ppo", negative_weight=0.5)).loss.item()
    assert full == pytest.approx(-(1.5 - 0.5) / 2) and half == pytest.approx(-(1.5 - 0.25) / 2)
    with pytest.raises(ConfigError, match="negative_weight"):
        LossConfig(kind="ppo", negative_weight=1.5)


def test_defaults_per_kind():
    # ppo / is / rs: the prototype's mask and token mean; exit: the plan's form, no mask, row mean
    for kind in ("ppo", "is", "rs"):
        cfg = LossConfig(kind=kind)
        assert cfg.ratio == RatioConfig() and cfg.aggregation == "token-mean" and cfg.dual_clip is None
    ex = LossConfig(kind="exit")
    assert ex.ratio == RatioConfig(mode="none", level="sum") and ex.aggregation == "seq-mean-token-sum"
    assert LossConfig(kind="exit", aggregation="seq-mean-token-sum") == ex
    assert LossConfig(kind="ppo") == LossConfig(kind="ppo", ratio=RatioConfig(), aggregation="token-mean")
    assert LossConfig(kind="ppo", dual_clip=3.0).dual_clip == 3.0


def test_exit_ratio_handling_is_set_per_strategy_with_an_explicit_none():
    # three rows with the same sequence ratio 4 (> 3): masked, truncated to 3, left alone
    logp = [[math.log(2.0), math.log(2.0)]] * 3
    cfg = LossConfig(
        kind="exit",
        ratio=RatioConfig(mode="mask", level="sum"),
        ratio_by_strategy={"prompt_aug": RatioConfig(mode="truncate", level="sum"), "feedback": RatioConfig(mode="none")},
    )
    b = make_batch(logp, [[0.0, 0.0]] * 3, [1.0, 1.0, 1.0], strategy=["iid", "prompt_aug", "feedback"])
    out = compute_loss(b, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-(0.0 + 3.0 + 4.0) / 3)  # masked rows stay in N
    assert b.logp.grad.flatten().tolist() == pytest.approx([0.0, 0.0, -1.0, -1.0, -4.0 / 3, -4.0 / 3])
    d = out.diagnostics.by_strategy
    assert d["iid"].n_masked_rows == 1 and d["prompt_aug"].n_truncated_rows == 1 and d["feedback"].n_masked_rows == 0
    # the default has no mask at all, however far the ratio
    far = make_batch([[0.0, 0.0]], [[-2.0, -2.0]], [1.0])
    assert compute_loss(far, LossConfig(kind="exit")).loss.item() == pytest.approx(-math.exp(4.0))


def test_exit_weights_negative_advantages_replay_rows_and_kl_per_row():
    # on-policy rows (r = 1): the loss is -mean_i A_i w_i; replay rows: -sum_t logp * w
    b = make_batch(
        [[-0.5, -0.5, -1.0], [-1.0, -2.0, -9.0], [-0.2, -0.2, -0.2]],
        [[-0.5, -0.5, -1.0], [-5.0, -5.0, -5.0], [-0.2, -0.2, -0.2]],
        [1.0, 1.0, -2.0],
        weight=[2.0, 3.0, 1.0],
        strategy=["iid", "replay", "iid"],
        lengths=[3, 2, 3],
    )
    out = compute_loss(b, LossConfig(kind="exit", negative_weight=0.5))
    assert out.loss.item() == pytest.approx((-2.0 + 3.0 * 3.0 + 1.0) / 3)
    out.loss.backward()
    assert b.logp.grad.flatten().tolist() == pytest.approx([-2 / 3] * 3 + [-1.0, -1.0, 0.0] + [1 / 3] * 3)
    assert out.diagnostics.by_strategy["replay"].n_rs_rows == 1
    # KL: k3 summed over the row's tokens, averaged over rows
    ref = [[-1.5, -0.5]]
    k = make_batch([[-1.0, -1.0]], [[-1.0, -1.0]], [0.0], ref=ref)
    k3 = sum(math.exp(r + 1.0) - (r + 1.0) - 1 for r in ref[0])
    assert compute_loss(k, LossConfig(kind="exit", beta=0.1)).loss.item() == pytest.approx(0.1 * k3)


def test_exit_clamps_the_row_log_ratio():
    # 4 tokens at log ratio +6: sum 24 > 20, r = e^20 (finite), no gradient; -6 each: r = e^-20
    for lr in (6.0, -6.0):
        b = make_batch([[lr] * 4], [[0.0] * 4], [1.0])
        out = compute_loss(b, LossConfig(kind="exit"))
        out.loss.backward()
        assert out.loss.item() == pytest.approx(-math.exp(math.copysign(20.0, lr)))
        assert b.logp.grad.abs().sum().item() == 0.0
        assert out.diagnostics.overall.ess == pytest.approx(1.0)


def test_dual_clip_bounds_negative_advantage_tokens_only():
    # A < 0, rho = 5 > 3: loss -A * 3 (no gradient); A > 0, rho = 5: the usual high clip
    logp, logq = [[math.log(5.0)], [math.log(5.0)], [math.log(2.0)]], [[0.0], [0.0], [0.0]]
    cfg = LossConfig(kind="ppo", dual_clip=3.0, ratio=RatioConfig(mode="none"))
    b = make_batch(logp, logq, [-1.0, 1.0, -1.0], weight=[2.0, 1.0, 1.0])
    out = compute_loss(b, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx((2.0 * 3.0 - 1.28 + 2.0) / 3)
    assert b.logp.grad[:, 0].tolist() == pytest.approx([0.0, 0.0, 2.0 / 3])
    d = out.diagnostics.overall
    assert d.n_clipped_tokens == 2 and d.n_dual_clipped_tokens == 1
    assert "ratio/dual_clip_fraction" in out.diagnostics.as_metrics()
    without = compute_loss(make_batch(logp, logq, [-1.0, 1.0, -1.0], weight=[2.0, 1.0, 1.0]), LossConfig(kind="ppo", ratio=RatioConfig(mode="none")))
    assert without.loss.item() == pytest.approx((2.0 * 5.0 - 1.28 + 2.0) / 3)
