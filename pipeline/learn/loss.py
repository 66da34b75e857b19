"""maxit's training losses, pure torch, on one batch of completion tokens.

Inputs per row i and completion token t (padding has mask 0):
  logp[i,t]  log p_train(y_t | x_train, y_<t) from the forward pass, temperature applied (has grad)
  logq[i,t]  log q_s(y_t | x_sample, y_<t) stored at sampling time (never recomputed)
  A_i        group-relative advantage;  w_i  sample weight (stratified: w_s * N / n_s)

Kinds (`LossConfig.kind`) and the source each one implements:
  "exit"  the expert-iteration plan's estimator exactly (seeds/004):
          g = (1/N) sum_i r_i A_i w_i grad sum_t log p_train(y_it),
          r_i = p_train(y_i|x_train) / q_s(y_i|x_sample) = exp(sum_t logp[i,t] - logq[i,t]),
          the SEQUENCE likelihood ratio. Written as the loss -(1/N) sum_i r_i A_i w_i with r_i NOT
          detached (its gradient is exactly -g: d r_i = r_i * grad sum_t logp), so the loss value
          is minus the importance-sampling estimate of E_p[A w]. N = the rows of the minibatch
          (`denominator`, "seq-mean-token-sum"). No clip; no sequence-ratio mask by default.
  "ppo"   PPO clip on per-token ratios, token mean (AT-GRPO's loss, seeds/003); with
          `dual_clip` c, verl's dual-clip PPO (`compute_policy_loss`, clip_ratio_c) as DrMAS
          trains (seeds/002).
  "is"    per-token importance sampling, -rho_t A w per token, token mean. NOT the plan's
          estimator: each token is weighted by its own ratio rho_t, not the row by r_i = prod_t
          rho_t, and the mean is over tokens, not rows. A row of 10 tokens at log ratio -0.3 has
          each token weighted exp(-0.3) = 0.74 under "is", the whole row exp(-3) = 0.05 under "exit".
  "rs"    rejection sampling (SFT on the rows whose reward >= threshold).

Choices, in the order the code makes them:
1. Token ratio rho = exp(logp - logq); the log ratio is clamped to [-20, 20] before exp, so one
   absurd token cannot turn the loss into inf/NaN (its gradient is then zero). "exit" sums the
   clamped token log ratios of a row and clamps the sum to [-20, 20] again: r_i = exp(that);
   outside it the row's gradient is zero (a row with p/q > e^20 is a bug, not a sample).
2. PPO clip (eps_low, eps_high): per-token loss -min(rho * A w, clip(rho, 1-eps_low, 1+eps_high) * A w).
   The sample weight multiplies the advantage, so a row's whole contribution scales with it.
   Dual clip (`dual_clip` = c, "ppo" only; verl: pg_losses3 = -A c, applied where A < 0): for
   A w < 0 the per-token loss is min(max(-rho A w, -clip(rho) A w), -c A w), so a wrong sample's
   token whose ratio exceeds c contributes the constant -c A w (no gradient).
   The "is" loss drops the clip: -rho * A w; "exit" is per row (see above).
   With `anchor="proximal"` (decoupled PPO) the clipped ratio is r = p_theta / p_old, p_old the
   policy at the start of the update on the training context, and the loss is
   -min(r A w, clip(r) A w) * c, with c = min(p_old / q, off_policy_cap) per token (detached)
   (the dual clip bounds the bracket, as verl applies it before its rollout weights). "exit"
   takes only the sampling anchor.
3. Sequence ratio s_i = exp(mean_t log rho) (geometric mean; `RatioConfig.level="sum"` uses the
   sum, the exact sequence likelihood ratio); with the proximal anchor, rho is p_old / q. Per
   strategy (a context swap pushes ratios down, docs/FINDINGS.md lesson 3): "mask" zeroes rows with
   s outside [low, high]; "truncate" multiplies the loss of a row with s > high by high / s (it
   only ever shrinks a row); "none" leaves it alone. Default: "mask" at [1/3, 3] on the geometric
   mean, but "none" for "exit" (the plan has no mask); `ratio_by_strategy` sets any of them per
   strategy under every kind. The algorithm presets of the sources (DrMAS, AT-GRPO, GRPO, the
   plan) set "none" for every strategy: none of them has such a mask.
   Masked rows stay in the denominators: masking never up-weights the other rows.
4. Optional KL to a reference model: beta * (exp(r - logp) - (r - logp) - 1) per token (k3);
   under "exit" summed over the row's tokens, like the rest of its row.
5. Aggregation: "token-mean" (sum over tokens / tokens of the batch), "seq-mean-token-mean"
   (GRPO: mean over rows of each row's token mean) or "seq-mean-token-sum" (mean of row sums;
   the only one "exit" takes: sum of its row losses / rows).
   The denominator (tokens or rows) may be given for a whole minibatch of several micro-batches,
   so the minibatch loss is one token mean (or row mean), not a mean of micro-batch means.
The "rs" loss (rejection-sampling expert iteration) replaces 1-3: per-token -logp * w on rows whose
reward >= threshold, aggregated the same way over those rows only (SFT on the good samples).
Under "ppo" / "is" / "exit", rows of a strategy named in `LossConfig.sft_strategies` (the
Verifier's relabelled replay, `pipeline.learn.verifier_replay`) are trained the rs way, -logp * w,
in the same aggregation (under "exit" the row's NLL summed over its tokens, in the row mean):
their completions were not sampled from q under this context, so they have no ratio.
Negative advantages are scaled by `LossConfig.negative_weight` (1 = the plain estimator).
Staleness corrections (`LossConfig.correction`, `pipeline.learn.corrections`): the behaviour weight
p_old / q is kept apart from the update ratio p_theta / p_old and decides a detached weight c (a
row's, or under "token-tis" a token's). "ppo" / "is": the clip and the ratio see p_theta / p_old
(as the proximal anchor) and c replaces its `off_policy_cap` weight; "exit": the row loss is
-(p_theta / p_old)_i c_i A_i w_i; "rs": each passing row's NLL times c. Step 3 still applies (on
p_old / q, as with the proximal anchor); rows of `sft_strategies` get no c.
Diagnostics: `pipeline.learn.loss_diagnostics`; steps 1 and 3: `pipeline.learn.ratios`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from pipeline.config.loss import LossConfig
from pipeline.learn.corrections import LOG_RATIO_CLAMP, Correction, staleness_correction
from pipeline.learn.loss_diagnostics import LossDiagnostics, batch_diagnostics
from pipeline.learn.ratios import RowDecisions, sequence_ratios, token_ratios

__all__ = ["LossBatch", "LossOutput", "compute_loss", "aggregate", "aggregation_count"]


@dataclass(frozen=True)
class LossBatch:
    """The tensors of one (micro-)batch, all (B, T) or (B,), and the row labels."""

    logp: torch.Tensor
    """(B, T) log p_train of each completion token under the training context (with grad)."""
    logq: torch.Tensor
    """(B, T) stored sampling logprobs of the same tokens."""
    mask: torch.Tensor
    """(B, T) 1.0 on completion tokens, 0.0 on padding."""
    advantage: torch.Tensor
    """(B,) advantage of each row."""
    sample_weight: torch.Tensor
    """(B,) sample weight of each row."""
    reward: torch.Tensor
    """(B,) reward of each row, NaN where unknown (used by the "rs" loss)."""
    strategy: Sequence[str]
    """Strategy id of each row (selects its `RatioConfig`, labels diagnostics)."""
    agent: Sequence[str]
    """Agent id of each row (labels diagnostics)."""
    ref_logp: torch.Tensor | None = None
    """(B, T) log p_ref of each token, required when beta > 0."""
    old_logp: torch.Tensor | None = None
    """(B, T) log p_old(y_t | x_train, y_<t): the policy at the start of the update (no grad),
    required where `LossConfig.needs_old_logp` (the proximal anchor, a staleness correction)."""


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor
    """Scalar loss to backpropagate."""
    diagnostics: LossDiagnostics
    """Ratio statistics of the batch."""


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: str, rows: torch.Tensor | None = None, denominator: float | None = None
) -> torch.Tensor:
    """Reduce (B, T) per-token losses to a scalar over the tokens in `mask` and the rows in `rows`
    (a (B,) 0/1 tensor; None = every row). `denominator` replaces the batch's own count (tokens
    for "token-mean", rows otherwise): the count of the whole minibatch this batch is part of."""
    if rows is not None:
        mask = mask * rows[:, None]
    row_sum = (per_token * mask).sum(-1)
    n_rows = mask.new_tensor(float(per_token.shape[0])) if rows is None else rows.sum()
    if how == "token-mean":
        n = mask.sum() if denominator is None else mask.new_tensor(float(denominator))
        return row_sum.sum() / n.clamp(min=1.0)
    n = n_rows if denominator is None else mask.new_tensor(float(denominator))
    if how == "seq-mean-token-mean":
        return (row_sum / mask.sum(-1).clamp(min=1.0)).sum() / n.clamp(min=1.0)
    if how == "seq-mean-token-sum":
        return row_sum.sum() / n.clamp(min=1.0)
    raise ValueError(f"unknown aggregation {how!r}")


def aggregation_count(mask: torch.Tensor, how: str, rows: torch.Tensor | None = None) -> float:
    """What `aggregate` divides by for this batch: its tokens ("token-mean") or rows (the rest).
    Summed over the micro-batches of a minibatch, it is that minibatch's `denominator`."""
    if rows is not None:
        mask = mask * rows[:, None]
        return float(mask.sum()) if how == "token-mean" else float(rows.sum())
    return float(mask.sum()) if how == "token-mean" else float(mask.shape[0])


def compute_loss(batch: LossBatch, config: LossConfig, denominator: float | None = None) -> LossOutput:
    """The loss of one batch under `config`, with its diagnostics (see the module docstring).
    `denominator`: the aggregation count of the whole minibatch (see `aggregation_count`)."""
    mask = batch.mask.to(batch.logp.dtype)
    decoupled = config.needs_old_logp  # the proximal anchor (not under "rs") or a staleness correction
    if decoupled and batch.old_logp is None:
        raise ValueError(
            "LossConfig.anchor='proximal' and LossConfig.correction need old_logp (the policy at the start of the update) in the batch"
        )

    # 1. token log ratio, zero on padding, clamped so exp() stays finite
    log_ratio, update_log_ratio, off_log_ratio, off_weight = token_ratios(batch.logp, batch.logq, batch.old_logp, config, mask, decoupled)
    rho = torch.exp(update_log_ratio)
    # the staleness correction's detached weight c, from the behaviour weight p_old / q
    corr = None if config.correction == "none" else staleness_correction(off_log_ratio, mask, config)
    # 3. sequence ratio of each row (detached: it only scales rows, like a weight)
    rows = sequence_ratios(batch.strategy, config, mask, log_ratio, off_log_ratio)
    # 2. the per-token loss of the kind: PPO clip ("ppo"), the plain ratio ("is"), one sequence
    # ratio per row ("exit"), or the NLL of the rows that passed ("rs")
    weighted_adv = _weighted_advantage(batch, config)
    if config.kind == "exit":
        per_token, rows = _exit_loss(batch, config, mask, log_ratio if corr is None else update_log_ratio, weighted_adv, rows, corr)
    elif config.kind in ("ppo", "is"):
        per_token, rows = _token_loss(batch, config, mask, rho, off_weight if corr is None else corr.weight, weighted_adv, rows)
    else:
        per_token, rows = _rs_loss(batch, config, rows, corr)
    rows = _corrected_rows(batch, config, rows, corr)

    # 4. KL to the reference model (k3), unweighted
    kl = torch.zeros_like(mask)
    if config.beta > 0:
        kl = _k3(batch, mask)
        if config.kind == "exit":
            per_token = per_token + config.beta * (kl * mask).sum(-1, keepdim=True)
        else:
            per_token = per_token + config.beta * kl

    # 5. aggregation ("exit": one "token" per row holding the row's loss, summed over rows / rows)
    if config.kind == "exit":
        loss = aggregate(per_token, torch.ones_like(per_token), config.aggregation, denominator=denominator)
    else:
        loss = aggregate(per_token, mask, config.aggregation, rows=rows.selected, denominator=denominator)
    return LossOutput(loss=loss, diagnostics=batch_diagnostics(batch.strategy, batch.agent, log_ratio, mask, rows, kl))


def _weighted_advantage(batch: LossBatch, config: LossConfig) -> torch.Tensor:
    """(B, 1) A w: the advantage (negative ones scaled by `negative_weight`) times the sample weight."""
    adv = batch.advantage.to(batch.logp.dtype)
    if config.negative_weight != 1.0:
        adv = torch.where(adv < 0, adv * config.negative_weight, adv)
    return (adv * batch.sample_weight.to(batch.logp.dtype))[:, None]


def _sft_rows(batch: LossBatch, config: LossConfig, like: torch.Tensor) -> torch.Tensor | None:
    """(B,) bool: the rows of `sft_strategies` (trained by their NLL), None when there are none."""
    if not config.sft_strategies:
        return None
    sft = torch.tensor([st in config.sft_strategies for st in batch.strategy], device=like.device)
    return sft if bool(sft.any()) else None


def _exit_loss(
    batch: LossBatch, config: LossConfig, mask, log_ratio, weighted_adv, rows: RowDecisions, corr: Correction | None = None
) -> tuple[torch.Tensor, RowDecisions]:
    """The plan's estimator: one sequence likelihood ratio per row, r_i = exp(sum_t log rho), not
    detached, so d(-r A w) = -r A w * grad sum_t logp; the sum is clamped again. (B, 1): one
    "token" per row holding the row's loss. With a staleness correction `log_ratio` is the update
    ratio's (p_theta / p_old) and the row loss is -r_i c_i A_i w_i."""
    r = torch.exp(log_ratio.sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if corr is None:
        rows = replace(rows, seq_ratio=r.detach())
        per_token = (-r * weighted_adv[:, 0] * rows.row_factor)[:, None]
    else:  # the ESS stays that of p_theta / q (`pipeline.learn.ratios.sequence_ratios`)
        per_token = (-r * weighted_adv[:, 0] * rows.row_factor * corr.row_weight)[:, None]
    sft = _sft_rows(batch, config, rows.row_factor)
    if sft is not None:  # the row's NLL summed over its tokens, in the row mean
        nll = -(batch.logp * mask).sum(-1) * batch.sample_weight.to(batch.logp.dtype)
        per_token = torch.where(sft[:, None], nll[:, None], per_token)
        rows = replace(rows, rs_rows=sft.to(rows.row_factor.dtype), masked=rows.masked & ~sft, truncated=rows.truncated & ~sft)
    return per_token, rows


def _token_loss(batch: LossBatch, config: LossConfig, mask, rho, off_weight, weighted_adv, rows: RowDecisions) -> tuple[torch.Tensor, RowDecisions]:
    """Step 2 for "ppo" (the clip, and the dual clip) and "is" (no clip): the (B, T) per-token
    loss, times the off-policy weight (proximal anchor) and each row's factor (step 3)."""
    clipped_tok = dual_tok = torch.zeros_like(mask, dtype=torch.bool)
    if config.kind == "ppo":
        unclipped = rho * weighted_adv
        clipped = rho.clamp(1.0 - config.eps_low, 1.0 + config.eps_high) * weighted_adv
        per_token = -torch.min(unclipped, clipped)
        with torch.no_grad():
            clipped_tok = (((rho < 1.0 - config.eps_low) & (weighted_adv < 0)) | ((rho > 1.0 + config.eps_high) & (weighted_adv > 0))) & (mask > 0)
        if config.dual_clip is not None:
            # verl's dual clip: where A < 0, min(-A c, max(-rho A, -clip(rho) A))
            bound = -config.dual_clip * weighted_adv
            per_token = torch.where(weighted_adv < 0, torch.min(per_token, bound), per_token)
            with torch.no_grad():
                dual_tok = (weighted_adv < 0) & (rho > config.dual_clip) & (mask > 0)
                clipped_tok = clipped_tok | dual_tok
    else:
        per_token = -rho * weighted_adv
    if off_weight is not None:
        per_token = per_token * off_weight
    per_token = per_token * rows.row_factor[:, None]
    sft = _sft_rows(batch, config, rows.row_factor)
    if sft is not None:  # rows without a sampling ratio in this context (relabelled replay): NLL, as "rs"
        nll = -batch.logp * batch.sample_weight.to(batch.logp.dtype)[:, None]
        per_token = torch.where(sft[:, None], nll, per_token)
        clipped_tok, dual_tok = clipped_tok & ~sft[:, None], dual_tok & ~sft[:, None]
        rows = replace(rows, rs_rows=sft.to(rows.row_factor.dtype), masked=rows.masked & ~sft, truncated=rows.truncated & ~sft)
    return per_token, replace(rows, clipped_tok=clipped_tok, dual_tok=dual_tok)


def _rs_loss(batch: LossBatch, config: LossConfig, rows: RowDecisions, corr: Correction | None = None) -> tuple[torch.Tensor, RowDecisions]:
    """Rejection sampling: the NLL of the rows that passed, weighted by their sample weight (no
    ratio, so no mask or truncation); with a staleness correction, times its weight c (detached;
    not on the rows of `sft_strategies`, which have no behaviour ratio)."""
    reward = batch.reward.to(batch.logp.dtype)
    rs_rows = (~torch.isnan(reward) & (reward >= config.rs_threshold)).to(batch.logp.dtype)
    per_token = -batch.logp * batch.sample_weight.to(batch.logp.dtype)[:, None]
    if corr is not None:
        sft = _sft_rows(batch, config, rs_rows)
        per_token = per_token * (corr.weight if sft is None else torch.where(sft[:, None], torch.ones_like(corr.weight), corr.weight))
    return per_token, replace(
        rows, rs_rows=rs_rows, selected=rs_rows, masked=torch.zeros_like(rows.masked), truncated=torch.zeros_like(rows.truncated)
    )


def _corrected_rows(batch: LossBatch, config: LossConfig, rows: RowDecisions, corr: Correction | None) -> RowDecisions:
    """`rows` with what the staleness correction did, counted on the rows it weights: not those
    trained by their NLL without a ratio (`sft_strategies`), and under "rs" only the rows that
    passed (the others are not trained)."""
    if corr is None:
        return rows
    nll = rows.rs_rows > 0
    if config.kind == "rs":
        sft = _sft_rows(batch, config, rows.rs_rows)
        keep = nll if sft is None else nll & ~sft
    else:
        keep = ~nll
    return replace(
        rows, masked=rows.masked | (corr.masked & keep), truncated=rows.truncated | (corr.truncated & keep), truncated_tok=corr.truncated_tok & keep[:, None]
    )


def _k3(batch: LossBatch, mask: torch.Tensor) -> torch.Tensor:
    """Step 4: (B, T) the k3 estimate of KL(p_train || p_ref) per token."""
    if batch.ref_logp is None:
        raise ValueError("LossConfig.beta > 0 needs ref_logp in the batch")
    d = (batch.ref_logp.to(batch.logp.dtype) - batch.logp) * mask
    return torch.exp(d) - d - 1.0
