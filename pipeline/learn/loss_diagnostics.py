"""The diagnostics of the loss (`LossDiagnostics`, of `pipeline.learn.loss.compute_loss`) are
additive sums, so micro-batches merge exactly: mean log ratio, clip fraction (tokens where the clip, or the dual clip, stops the gradient; 0 under "is" / "exit"),
dual-clip fraction (tokens where the dual clip binds), masked / truncated fraction (rows: step 3's
and the staleness correction's), truncated-token fraction (the correction "token-tis"),
effective sample size (sum r)^2 / sum r^2 of the sequence likelihood ratios r_i = exp(sum_t log rho)
(whatever level step 3 decides on; under "exit" the r_i of its loss), overall, per strategy, per
agent, per (agent, strategy).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Mapping, Sequence

import torch

from pipeline.learn.ratios import RowDecisions

__all__ = ["RatioStats", "LossDiagnostics", "batch_diagnostics"]


@dataclass(frozen=True)
class RatioStats:
    """Additive ratio statistics of a set of rows; the properties give the rates."""

    n_rows: int = 0
    """Rows counted."""
    n_tokens: int = 0
    """Completion tokens counted."""
    sum_log_ratio: float = 0.0
    """Sum over tokens of log p_train - log q_sample."""
    n_clipped_tokens: int = 0
    """Tokens whose gradient the PPO clip stopped (rho < 1-eps_low with A < 0, or rho > 1+eps_high
    with A > 0, or, with the dual clip, rho > dual_clip with A < 0)."""
    n_dual_clipped_tokens: int = 0
    """Tokens where the dual clip bound the loss (A < 0 and rho > dual_clip); also counted in
    `n_clipped_tokens`."""
    n_masked_rows: int = 0
    """Rows zeroed by a sequence-ratio mask or by a staleness correction's mask ("seq-mask",
    "geo-mask")."""
    n_truncated_rows: int = 0
    """Rows whose sequence ratio was truncated to the cap (`RatioConfig` "truncate", or the
    staleness correction "tis")."""
    n_truncated_tokens: int = 0
    """Tokens whose behaviour weight p_old/q the staleness correction "token-tis" truncated."""
    n_rs_rows: int = 0
    """Rows the "rs" loss trained on (reward >= threshold)."""
    sum_seq_ratio: float = 0.0
    """Sum of sequence ratios s_i (for the effective sample size)."""
    sum_seq_ratio_sq: float = 0.0
    """Sum of s_i squared."""
    sum_kl: float = 0.0
    """Sum over tokens of the k3 KL estimate (0 when beta = 0)."""

    def merge(self, other: "RatioStats") -> "RatioStats":
        return RatioStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def mean_log_ratio(self) -> float:
        return self.sum_log_ratio / self.n_tokens if self.n_tokens else 0.0

    @property
    def clip_fraction(self) -> float:
        return self.n_clipped_tokens / self.n_tokens if self.n_tokens else 0.0

    @property
    def dual_clip_fraction(self) -> float:
        return self.n_dual_clipped_tokens / self.n_tokens if self.n_tokens else 0.0

    @property
    def masked_fraction(self) -> float:
        return self.n_masked_rows / self.n_rows if self.n_rows else 0.0

    @property
    def truncated_fraction(self) -> float:
        return self.n_truncated_rows / self.n_rows if self.n_rows else 0.0

    @property
    def truncated_token_fraction(self) -> float:
        return self.n_truncated_tokens / self.n_tokens if self.n_tokens else 0.0

    @property
    def ess(self) -> float:
        """Effective sample size (sum s)^2 / sum s^2 (equals n_rows when every ratio is equal)."""
        return self.sum_seq_ratio**2 / self.sum_seq_ratio_sq if self.sum_seq_ratio_sq > 0 else 0.0

    @property
    def ess_fraction(self) -> float:
        return self.ess / self.n_rows if self.n_rows else 0.0

    @property
    def mean_kl(self) -> float:
        return self.sum_kl / self.n_tokens if self.n_tokens else 0.0

    def rates(self) -> dict[str, float]:
        return {
            "mean_log_ratio": self.mean_log_ratio,
            "clip_fraction": self.clip_fraction,
            "dual_clip_fraction": self.dual_clip_fraction,
            "masked_fraction": self.masked_fraction,
            "truncated_fraction": self.truncated_fraction,
            "truncated_token_fraction": self.truncated_token_fraction,
            "ess_fraction": self.ess_fraction,
            "kl": self.mean_kl,
            "rows": float(self.n_rows),
            "tokens": float(self.n_tokens),
        }


def _merge_maps(a: Mapping[str, RatioStats], b: Mapping[str, RatioStats]) -> dict[str, RatioStats]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k].merge(v) if k in out else v
    return out


@dataclass(frozen=True)
class LossDiagnostics:
    """Ratio statistics of a batch (or of many, merged): overall, per strategy, per agent."""

    overall: RatioStats = field(default_factory=RatioStats)
    by_strategy: Mapping[str, RatioStats] = field(default_factory=dict)
    by_agent: Mapping[str, RatioStats] = field(default_factory=dict)
    by_agent_strategy: Mapping[str, RatioStats] = field(default_factory=dict)
    """Keyed "<agent_id>/<strategy>"."""

    def merge(self, other: "LossDiagnostics") -> "LossDiagnostics":
        return LossDiagnostics(
            overall=self.overall.merge(other.overall),
            by_strategy=_merge_maps(self.by_strategy, other.by_strategy),
            by_agent=_merge_maps(self.by_agent, other.by_agent),
            by_agent_strategy=_merge_maps(self.by_agent_strategy, other.by_agent_strategy),
        )

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat metric names for a logger: `ratio/<rate>`, `strategy/<id>/<rate>`, `agent/<id>/<rate>`."""
        out = {f"{prefix}ratio/{k}": v for k, v in self.overall.rates().items()}
        for sid, st in sorted(self.by_strategy.items()):
            out.update({f"{prefix}strategy/{sid}/{k}": v for k, v in st.rates().items()})
        for aid, st in sorted(self.by_agent.items()):
            out.update({f"{prefix}agent/{aid}/{k}": v for k, v in st.rates().items()})
        return out


def batch_diagnostics(strategies: Sequence[str], agents: Sequence[str], log_ratio, mask, rows: RowDecisions, kl) -> LossDiagnostics:
    """The diagnostics of one batch: each row's counts from `rows`, merged overall, per strategy,
    per agent and per (agent, strategy)."""
    none = torch.zeros_like(mask, dtype=torch.bool)
    clipped_tok = none if rows.clipped_tok is None else rows.clipped_tok
    dual_tok = none if rows.dual_tok is None else rows.dual_tok
    truncated_tok = none if rows.truncated_tok is None else rows.truncated_tok
    masked, truncated, rs_rows, seq_ratio = rows.masked, rows.truncated, rows.rs_rows, rows.seq_ratio
    with torch.no_grad():
        cols = torch.stack(
            [
                mask.sum(-1),
                (log_ratio * mask).sum(-1),
                (clipped_tok.to(mask.dtype)).sum(-1),
                (dual_tok.to(mask.dtype)).sum(-1),
                masked.to(mask.dtype),
                truncated.to(mask.dtype),
                rs_rows.to(mask.dtype),
                seq_ratio,
                seq_ratio * seq_ratio,
                (kl.detach() * mask).sum(-1),
                (truncated_tok.to(mask.dtype)).sum(-1),
            ],
            dim=1,
        ).double().cpu().tolist()
    per_row = [
        RatioStats(
            n_rows=1,
            n_tokens=int(c[0]),
            sum_log_ratio=c[1],
            n_clipped_tokens=int(c[2]),
            n_dual_clipped_tokens=int(c[3]),
            n_masked_rows=int(c[4]),
            n_truncated_rows=int(c[5]),
            n_rs_rows=int(c[6]),
            sum_seq_ratio=c[7],
            sum_seq_ratio_sq=c[8],
            sum_kl=c[9],
            n_truncated_tokens=int(c[10]),
        )
        for c in cols
    ]
    overall = RatioStats()
    by_strategy: dict[str, RatioStats] = {}
    by_agent: dict[str, RatioStats] = {}
    by_cell: dict[str, RatioStats] = {}
    for st, sid, aid in zip(per_row, strategies, agents):
        overall = overall.merge(st)
        by_strategy[sid] = by_strategy[sid].merge(st) if sid in by_strategy else st
        by_agent[aid] = by_agent[aid].merge(st) if aid in by_agent else st
        cell = f"{aid}/{sid}"
        by_cell[cell] = by_cell[cell].merge(st) if cell in by_cell else st
    return LossDiagnostics(overall=overall, by_strategy=by_strategy, by_agent=by_agent, by_agent_strategy=by_cell)
