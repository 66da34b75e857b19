"""Steps 1 and 3 of the loss (`pipeline.learn.loss`, whose docstring gives the whole order): each
token's log ratio against the stored sampling logprobs (and, decoupled, against p_old), and each
row's sequence ratio with what its strategy's `RatioConfig` does with it (mask, truncate, nothing).
`RowDecisions` carries what these steps, and the loss kinds after them, decide per row and per
token; `pipeline.learn.loss_diagnostics` counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from pipeline.config.loss import LossConfig
from pipeline.learn.corrections import LOG_RATIO_CLAMP

__all__ = ["RowDecisions", "token_ratios", "sequence_ratios"]

_MODES = {"none": 0, "mask": 1, "truncate": 2}


@dataclass(frozen=True)
class RowDecisions:
    """What the steps decide per row and per token of a batch, beside its loss (the diagnostics
    count them)."""

    row_factor: torch.Tensor
    """(B,) step 3's factor of each row's loss: 0 masked, high / s truncated, else 1 (detached)."""
    masked: torch.Tensor
    """(B,) bool: rows a sequence-ratio mask zeroed."""
    truncated: torch.Tensor
    """(B,) bool: rows whose sequence ratio was truncated."""
    seq_ratio: torch.Tensor
    """(B,) the sequence likelihood ratio r_i = exp(sum_t log rho) (detached; the ESS's)."""
    rs_rows: torch.Tensor
    """(B,) 1.0 on rows trained by their NLL (the "rs" rows that passed, `sft_strategies` rows)."""
    selected: torch.Tensor | None = None
    """(B,) 0/1 rows `aggregate` counts ("rs": the rows that passed); None: every row."""
    clipped_tok: torch.Tensor | None = None
    """(B, T) bool: tokens whose gradient the clip (or the dual clip) stopped; None: none."""
    dual_tok: torch.Tensor | None = None
    """(B, T) bool: tokens where the dual clip binds; None: none."""
    truncated_tok: torch.Tensor | None = None
    """(B, T) bool: tokens whose behaviour weight the staleness correction truncated; None: none."""


def _ratio_tensors(strategies: Sequence[str], config: LossConfig, like: torch.Tensor):
    """Per-row (mode code, low, high, sum-level flag) from each row's strategy."""
    rcs = [config.ratio_for(s) for s in strategies]
    mode = torch.tensor([_MODES[r.mode] for r in rcs], device=like.device)
    low = torch.tensor([r.low for r in rcs], dtype=like.dtype, device=like.device)
    high = torch.tensor([r.high for r in rcs], dtype=like.dtype, device=like.device)
    use_sum = torch.tensor([r.level == "sum" for r in rcs], device=like.device)
    return mode, low, high, use_sum


def token_ratios(
    logp: torch.Tensor, logq: torch.Tensor, old_logp: torch.Tensor | None, config: LossConfig, mask: torch.Tensor, decoupled: bool
):
    """Step 1: (log rho against the sampling logprobs, the log of the update ratio the clip sees,
    the log ratio step 3 judges rows by, the off-policy weight): decoupled (the proximal anchor, a
    staleness correction), the clip sees p_theta / p_old, rows are judged by p_old / q, and,
    without a correction, each token is weighted min(p_old / q, `off_policy_cap`) (with one, the
    correction decides the weight)."""
    logq = logq.to(logp.dtype)
    log_ratio = ((logp - logq) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    off_weight = None
    if decoupled:
        old = old_logp.to(logp.dtype)
        update_log_ratio = ((logp - old) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        with torch.no_grad():
            off_log_ratio = ((old - logq) * mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
            if config.correction == "none":
                off_weight = torch.exp(off_log_ratio).clamp(max=config.off_policy_cap)
    else:
        update_log_ratio, off_log_ratio = log_ratio, log_ratio.detach()
    return log_ratio, update_log_ratio, off_log_ratio, off_weight


def sequence_ratios(
    strategies: Sequence[str], config: LossConfig, mask: torch.Tensor, log_ratio: torch.Tensor, off_log_ratio: torch.Tensor
) -> RowDecisions:
    """Step 3: each row's sequence ratio s (geometric mean, or the sum under `level="sum"`) and
    what its strategy's `RatioConfig` does with it (mask, truncate, nothing)."""
    mode, low, high, use_sum = _ratio_tensors(strategies, config, off_log_ratio)
    with torch.no_grad():
        seq_sum = off_log_ratio.sum(-1)
        seq_log = torch.where(use_sum, seq_sum, seq_sum / mask.sum(-1).clamp(min=1.0)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        s = torch.exp(seq_log)
        masked = (mode == _MODES["mask"]) & ((s < low) | (s > high))
        truncated = (mode == _MODES["truncate"]) & (s > high)
        row_factor = torch.ones_like(s)
        row_factor = torch.where(masked, torch.zeros_like(s), row_factor)
        row_factor = torch.where(truncated, high / s, row_factor)
        # the effective sample size is about the whole sequence's likelihood ratio, whatever
        # level the mask/truncate decision uses
        seq_ratio = torch.exp(log_ratio.detach().sum(-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return RowDecisions(row_factor=row_factor, masked=masked, truncated=truncated, seq_ratio=seq_ratio, rs_rows=torch.zeros_like(s))
