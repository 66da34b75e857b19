"""Staleness corrections (`LossConfig.correction`), pure torch: the detached weight c that each
row's (or token's) loss is multiplied by when its sample came from an older behaviour policy.

In the decoupled form (verl's rollout correction, AReaL's decoupled PPO) the behaviour weight of a
token, w_t = p_old(y_t | x_train, y_<t) / q(y_t | x_sample, y_<t), is kept apart from the update
ratio p_theta / p_old: p_old is the policy at the start of the round's update on the training
context (computed once, before the first step), q the logprobs stored when the row was sampled,
by whichever checkpoint sampled it. Of a row: W = prod_t w_t, G = exp(mean_t log w_t).

  "tis"        c_i = min(W_i, C)                 sequence-level truncated importance sampling
  "token-tis"  c_t = min(w_t, C)                 token-level truncated importance sampling
  "seq-mask"   c_i = 1 if low <= W_i <= C else 0
  "geo-mask"   c_i = 1 if low <= G_i <= C else 0

C = `LossConfig.correction_cap`, low = `LossConfig.correction_bounds`[0] (1 / C unless set). Log
weights are clamped as the loss clamps its log ratios: each token's to [-20, 20], a row's sum (W)
or mean (G) again to [-20, 20]. Padding tokens have w = 1 (log w = 0) and do not enter G's mean.
How each loss kind applies c: `pipeline/learn/loss.py` and docs/ALGORITHMS.md ("Staleness
corrections").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.config.loss import LossConfig

__all__ = ["Correction", "staleness_correction", "LOG_RATIO_CLAMP"]

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class Correction:
    """What a staleness correction does to a batch (all detached)."""

    weight: torch.Tensor
    """(B, T) c on each token: the row's c_i on each of its tokens, or the token's own c_t."""
    row_weight: torch.Tensor | None
    """(B,) c_i of a row-level correction ("tis", the masks); None for "token-tis"."""
    masked: torch.Tensor
    """(B,) bool: rows a mask zeroed."""
    truncated: torch.Tensor
    """(B,) bool: rows whose W exceeded C under "tis"."""
    truncated_tok: torch.Tensor
    """(B, T) bool: completion tokens whose w_t exceeded C under "token-tis"."""


def staleness_correction(off_log_ratio: torch.Tensor, mask: torch.Tensor, config: LossConfig) -> Correction:
    """The correction `config.correction` (not "none") of a batch whose token log weights
    log w_t = log p_old - log q are `off_log_ratio` (B, T; zero on padding, clamped per token)."""
    low, cap = config.correction_bounds
    with torch.no_grad():
        log_w = (off_log_ratio * mask).detach()
        no_rows = torch.zeros(log_w.shape[0], dtype=torch.bool, device=log_w.device)
        no_tokens = torch.zeros_like(log_w, dtype=torch.bool)
        if config.correction == "token-tis":
            w = torch.exp(log_w)
            truncated_tok = (w > cap) & (mask > 0)
            return Correction(weight=w.clamp(max=cap), row_weight=None, masked=no_rows, truncated=no_rows, truncated_tok=truncated_tok)
        seq_sum = log_w.sum(-1)
        if config.correction == "geo-mask":
            seq_log = seq_sum / mask.sum(-1).clamp(min=1.0)
        else:
            seq_log = seq_sum
        row = torch.exp(seq_log.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        if config.correction == "tis":
            truncated = row > cap
            c = row.clamp(max=cap)
            masked = no_rows
        elif config.correction in ("seq-mask", "geo-mask"):
            masked = (row < low) | (row > cap)
            c = torch.where(masked, torch.zeros_like(row), torch.ones_like(row))
            truncated = no_rows
        else:
            raise ValueError(f"unknown LossConfig.correction {config.correction!r}")
        return Correction(weight=c[:, None].expand_as(log_w), row_weight=c, masked=masked, truncated=truncated, truncated_tok=no_tokens)
