"""The training loss: `LossConfig` (the loss's kind, its clip, its staleness correction) and the
sequence-ratio handling of its rows (`RatioConfig`, per strategy where it differs).

Every field is documented where it is declared and validated at construction: a bad value raises
`pipeline.errors.ConfigError` naming the field. The defaults are the default run's ("rs"); the
prototype's values (docs/FINDINGS.md): PPO clip [0.8, 1.28], sequence-ratio mask [1/3, 3]. The
"exit" loss (the expert-iteration plan's estimator) defaults to no sequence-ratio mask and the mean
over rows. `TrainConfig` (`pipeline.config.train`) holds one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Mapping

from pipeline.config.fields import Setting, check_declared, setting, settings
from pipeline.errors import ConfigError

__all__ = ["RatioConfig", "LossConfig", "RATIO_MODES", "LOSS_KINDS", "finite_positive"]

RATIO_MODES = ("mask", "truncate", "none")
"""The sequence-ratio handlings (`RatioConfig.mode`)."""
LOSS_KINDS = ("rs", "ppo", "is", "exit")
"""The losses (`LossConfig.kind`); rs, the default run's, first."""
def finite_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class RatioConfig:
    """What happens to a sequence whose importance ratio is extreme.

    The sequence ratio is s = exp(mean over the completion's tokens of log p_train - log q_sample)
    (a geometric mean, so long and short completions are judged alike) or, with `level="sum"`,
    exp(sum) (the exact sequence likelihood ratio)."""

    mode: Literal["mask", "truncate", "none"] = "mask"
    """"mask": sequences with s outside [low, high] contribute nothing (they stay in the
    denominator of the aggregation, so masking does not up-weight the rest);
    "truncate": a sequence with s > high has every token's loss scaled by the constant high / s,
    so it counts as if its ratio were at the cap (truncated importance sampling); truncation only
    ever shrinks a row (a row with a small ratio already contributes little and is left alone, so
    `low` is not used); "none": no sequence-level handling (token clip only)."""
    low: float = 1.0 / 3.0
    """Lower bound on s for "mask" (docs/FINDINGS.md: 1/3)."""
    high: float = 3.0
    """Upper bound on s for "mask" and the cap of "truncate" (docs/FINDINGS.md: 3)."""
    level: Literal["mean", "sum"] = "mean"
    """How token log ratios make the sequence log ratio: their mean (default) or their sum."""

    def __post_init__(self) -> None:
        check_declared(self)  # mode and level: their Literals
        finite_positive("RatioConfig.low", self.low)
        finite_positive("RatioConfig.high", self.high)
        if not self.low <= 1.0 <= self.high:
            raise ConfigError(f"RatioConfig.low <= 1 <= RatioConfig.high is required, got low={self.low}, high={self.high}")


@dataclass(frozen=True)
class LossConfig:
    """The training loss (see `pipeline/learn/loss.py` for the formulas)."""

    kind: Literal["ppo", "is", "exit", "rs"] = field(default="rs", metadata=setting(
        "loss",
        "rs: rejection-sampling expert iteration; ppo: importance-weighted PG with PPO clip; is: per-token importance sampling, no clip "
        "(not the plan's estimator); exit: the expert-iteration plan's estimator (sequence likelihood ratio per row, mean over rows, "
        "no mask)",
        group="training", choices=LOSS_KINDS))
    """"ppo": importance-weighted policy gradient with PPO clip and sequence-ratio handling
    (AT-GRPO's loss; with `dual_clip`, verl's dual-clip PPO as DrMAS trains);
    "exit": the expert-iteration plan's estimator exactly, g = (1/N) sum_i (p_train/q_s) A_i w_i
    grad log p_train(y_i|x_train): per row the SEQUENCE likelihood ratio
    r_i = exp(sum_t logp - logq) times the advantage, the loss -(1/N) sum_i r_i A_i w_i (its
    gradient is the plan's, the row's whole grad log p summed over its tokens), N the rows of
    the minibatch; no clip, and by default no sequence-ratio mask (`ratio` None);
    "is": per-token importance sampling, -exp(logp - logq) * A w per token in a token mean (no
    clip; sequence-ratio handling applies). It is NOT the plan's estimator: each token is weighted
    by its own ratio instead of the row by the product of them (10 tokens at log ratio -0.3: 0.74
    each under "is", e^-3 = 0.05 for the whole row under "exit"), and it divides by tokens;
    "rs": rejection-sampling expert iteration, the NLL of completions whose reward >=
    `rs_threshold` under the training context (docs/FINDINGS.md, lesson 4: best and cheapest in the
    prototype). For "rs" build the view with `drop_zero_advantage=False`, or the correct answers
    of all-correct groups are lost. The default ("rs") is the default run's."""
    anchor: Literal["sampling", "proximal"] = field(default="sampling", metadata=setting(
        "anchor",
        "what the PPO clip compares with: the sampling logprobs q, or the policy at the start of the round's update (proximal: decoupled PPO)",
        group="training"))
    """What the PPO clip compares the policy with. "sampling": q, the stored sampling logprobs
    (ratio p_theta(y|x_train) / q(y|x_sample)). "proximal" (decoupled PPO): the policy at the start
    of the round's update on the training context, p_old(y|x_train), computed once before the
    first step; the clip then bounds how far the update moves, and the off-policy correction
    p_old / q is a separate, detached per-token weight truncated at `off_policy_cap`. Sequence
    ratio handling (`ratio`) judges p_old / q with this anchor. "exit" has no clip, so it only
    takes "sampling"."""
    off_policy_cap: float = 3.0
    """With anchor="proximal" and no `correction`: the per-token off-policy weight p_old/q is
    truncated at this."""
    correction: Literal["none", "tis", "token-tis", "seq-mask", "geo-mask"] = field(default="none", metadata=setting(
        "off_policy_correction",
        "staleness correction from the behaviour weight p_old/q (p_old: the policy at the start of the round's update): the row's "
        "product truncated at --correction-cap (tis), each token's (token-tis), or rows masked outside [--correction-low, --correction-cap] "
        "by the product (seq-mask) or its geometric mean (geo-mask); the update ratio becomes p_theta/p_old (docs/ALGORITHMS.md#staleness-corrections)",
        group="training"))
    """The staleness correction (decoupled form, `pipeline.learn.corrections`): the behaviour
    weight w_t = p_old(y_t|x_train) / q(y_t|x_sample) of each token (p_old: the policy at the start
    of the round's update, computed once before the first step; q: the stored sampling logprobs,
    from whichever checkpoint sampled the row) is kept apart from the update ratio p_theta / p_old,
    and decides a detached weight c on each row's (or token's) loss:
    "tis": c_i = min(W_i, C), W_i = prod_t w_t (sequence-level truncated importance sampling);
    "token-tis": c_t = min(w_t, C); "seq-mask": c_i = 1 if low <= W_i <= C else 0; "geo-mask":
    c_i = 1 if low <= G_i <= C else 0, G_i = exp(mean_t log w_t). C = `correction_cap`, low =
    `correction_low`. Under "ppo" / "is" the clip and the ratio see p_theta / p_old (as with
    anchor="proximal", whatever `anchor` says) and c replaces the proximal anchor's
    `off_policy_cap` weight; under "exit" the row loss is -(p_theta / p_old)_i c_i A_i w_i (its
    sequence ratio not detached; "token-tis" has no row weight, so "exit" refuses it); under
    "rs" each passing row's NLL is multiplied by c (importance-weighted rejection sampling).
    Masked rows stay in the denominators. "none" (the default): no correction and no p_old
    forward pass unless the anchor asks for one."""
    correction_cap: float = field(default=2.0, metadata=setting(
        "correction_cap", "C of --off-policy-correction: the truncation point, the masks' upper bound (verl's 2)", group="training"))
    """C of `correction`: the truncation point of "tis" / "token-tis", the upper bound of the
    masks (verl's `rollout_is_threshold` default, 2.0). Must be >= 1."""
    correction_low: float | None = field(default=None, metadata=setting(
        "correction_low", "lower bound of the masks of --off-policy-correction (unset: 1/--correction-cap)", group="training"))
    """Lower bound of "seq-mask" / "geo-mask" (None = 1 / `correction_cap`, as verl's
    `rollout_rs_threshold_lower`). Must be in (0, 1]."""
    eps_low: float = field(default=0.2, metadata=setting(
        "clip_low", "ppo: token ratios below 1 - clip_low stop the gradient of negative-advantage tokens (TRL's epsilon)", group="training"))
    """PPO clip: token ratios below 1 - eps_low stop contributing gradient (docs/FINDINGS.md: 0.8)."""
    eps_high: float = field(default=0.28, metadata=setting(
        "clip_high", "ppo: token ratios above 1 + clip_high stop the gradient of positive-advantage tokens (TRL's epsilon_high)", group="training"))
    """PPO clip: token ratios above 1 + eps_high stop contributing gradient (docs/FINDINGS.md: 1.28, DAPO's clip-higher)."""
    dual_clip: float | None = field(default=None, metadata=setting(
        "dual_clip", "ppo: verl's dual clip (DrMAS): a negative-advantage token's loss is at most -dual_clip*A (verl's clip_ratio_c); 0 = off", group="training"))
    """"ppo" only: dual-clip PPO (verl's `clip_ratio_c`, 3.0 there, which DrMAS trains with): on
    a token with A < 0 the clipped loss max(-rho A, -clip(rho) A) is further bounded by
    -dual_clip * A, so a huge ratio on a wrong sample cannot push it down without limit (its
    gradient stops where rho > dual_clip). None = off (the plain PPO clip); must be > 1."""
    ratio: RatioConfig | None = field(default=None, metadata=setting(
        "sequence_ratio",
        "every row's sequence ratio (the geometric mean of its token ratios p_train/q): rows outside [1/3, 3] masked (zeroed, still "
        "counted in the mean), rows above 3 truncated to it, or left alone (the token clip only); --hinted-rows and --feedback-rows "
        "set their strategies' rows apart",
        group="training", hint=str, choices=RATIO_MODES))
    """Sequence-ratio handling of every strategy not named in `ratio_by_strategy`. None = the
    kind's default: `RatioConfig()` (mask at [1/3, 3] on the geometric mean) for "ppo" / "is" /
    "rs", `RatioConfig(mode="none", level="sum")` for "exit" (the plan has no mask); after
    construction it is always a `RatioConfig`. Give `RatioConfig(mode="none")` explicitly (here or
    per strategy) for no handling under any kind."""
    ratio_by_strategy: Mapping[str, RatioConfig] = field(default_factory=dict, metadata=settings(
        Setting("hinted_rows",
                "the prompt-augmentation rows (sampled with a hint, trained without): their sequence ratio masked to [1/3, 3], truncated at 3, "
                "left alone, or the rows dropped from training",
                group="training", hint=str, choices=(*RATIO_MODES, "drop"), key="prompt_aug", also=("view.drop_strategies",)),
        Setting("feedback_rows",
                "the feedback strategy's second-attempt rows (trained without the feedback): their sequence ratio masked to [1/3, 3], truncated at 3, "
                "or left alone",
                group="training", hint=str, choices=RATIO_MODES, key="feedback"),
    ))
    """Per-strategy overrides, e.g. {"prompt_aug": RatioConfig(mode="truncate")}: a context swap
    moves ratios mostly downwards (docs/FINDINGS.md, lesson 3), so masking may drop exactly the hinted
    successes."""
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] | None = None
    """How per-token losses become one number: mean over all completion tokens of the batch;
    mean over rows of each row's token mean (GRPO); mean over rows of each row's token sum.
    None = the kind's default: "token-mean", or "seq-mean-token-sum" for "exit", the only one it
    takes (its loss is per row, its gradient a token sum per row, averaged over the N rows)."""
    beta: float = field(default=0.0, metadata=setting(
        "kl_beta",
        "weight of a KL penalty (k3, on the trained tokens) to the checkpoint the round starts from: a trust region around the previous "
        "round's policy; 0 = off", group="training"))
    """Weight of the KL penalty to the reference model, the checkpoint the run starts from (in a
    round: the checkpoint the round starts from), k3 estimator exp(r - p) - (r - p) - 1 per token
    of the trained rows; 0 disables it and no reference model is loaded."""
    rs_threshold: float = 1.0
    """"rs" trains on rows whose reward >= this (rewards are 1.0 right, 0.0 wrong)."""
    negative_weight: float = field(default=1.0, metadata=setting(
        "negative_weight", "ppo/is/exit: negative advantages are multiplied by this (1 = the plain policy gradient, 0 = the positive half only)", group="training"))
    """"ppo" / "is" / "exit": negative advantages are multiplied by this (1 = the plain estimator; < 1
    leans the update towards raising the right samples over pushing the wrong ones down)."""
    sft_strategies: tuple[str, ...] = ("replay",)
    """"ppo" / "is" / "exit": rows of these strategies are trained by their NLL, as "rs" trains its rows:
    rows whose completion was not sampled under this context (the Verifier's relabelled replay),
    so that no importance ratio exists for them."""

    def __post_init__(self) -> None:
        check_declared(self)  # the declared choices (kind, anchor, correction, aggregation unless None) and sft_strategies a sequence
        if not (math.isfinite(self.eps_low) and 0 <= self.eps_low < 1):
            raise ConfigError(f"LossConfig.eps_low must be in [0, 1), got {self.eps_low!r}")
        if not (math.isfinite(self.eps_high) and self.eps_high >= 0):
            raise ConfigError(f"LossConfig.eps_high must be finite and >= 0, got {self.eps_high!r}")
        if self.ratio is None:
            object.__setattr__(self, "ratio", RatioConfig(mode="none", level="sum") if self.kind == "exit" else RatioConfig())
        if not isinstance(self.ratio, RatioConfig):
            raise ConfigError(f"LossConfig.ratio must be a RatioConfig, got {type(self.ratio).__name__}")
        for sid, rc in dict(self.ratio_by_strategy).items():
            if not isinstance(rc, RatioConfig):
                raise ConfigError(f"LossConfig.ratio_by_strategy[{sid!r}] must be a RatioConfig, got {type(rc).__name__}")
        object.__setattr__(self, "ratio_by_strategy", MappingProxyType(dict(self.ratio_by_strategy)))
        if self.aggregation is None:
            object.__setattr__(self, "aggregation", "seq-mean-token-sum" if self.kind == "exit" else "token-mean")
        if self.kind == "exit" and self.aggregation != "seq-mean-token-sum":
            raise ConfigError(
                f"LossConfig.aggregation must be 'seq-mean-token-sum' (or None) with kind='exit': the plan's estimator "
                f"averages each row's r_i A_i w_i over the rows, got {self.aggregation!r}"
            )
        if self.dual_clip is not None:
            if not (isinstance(self.dual_clip, (int, float)) and math.isfinite(self.dual_clip) and self.dual_clip > 1):
                raise ConfigError(f"LossConfig.dual_clip must be None or a finite number > 1 (verl's clip_ratio_c), got {self.dual_clip!r}")
            if self.kind != "ppo":
                raise ConfigError(f"LossConfig.dual_clip is a bound of the PPO clip: it needs LossConfig.kind ppo, got {self.kind}")
        if not (math.isfinite(self.beta) and self.beta >= 0):
            raise ConfigError(f"LossConfig.beta must be finite and >= 0, got {self.beta!r}")
        if self.kind == "exit" and self.anchor != "sampling":
            raise ConfigError(f"LossConfig.anchor must be 'sampling' with kind='exit' (the plan's estimator has no clip to anchor), got {self.anchor!r}")
        if not (isinstance(self.off_policy_cap, (int, float)) and math.isfinite(self.off_policy_cap) and self.off_policy_cap >= 1):
            raise ConfigError(f"LossConfig.off_policy_cap must be a finite number >= 1, got {self.off_policy_cap!r}")
        self._check_correction()
        if not (isinstance(self.negative_weight, (int, float)) and math.isfinite(self.negative_weight) and 0 <= self.negative_weight <= 1):
            raise ConfigError(f"LossConfig.negative_weight must be in [0, 1], got {self.negative_weight!r}")
        object.__setattr__(self, "sft_strategies", tuple(self.sft_strategies))
        if not math.isfinite(self.rs_threshold):
            raise ConfigError(f"LossConfig.rs_threshold must be finite, got {self.rs_threshold!r}")

    def _check_correction(self) -> None:
        cap, low = self.correction_cap, self.correction_low
        if isinstance(cap, bool) or not (isinstance(cap, (int, float)) and math.isfinite(cap) and cap >= 1):
            raise ConfigError(f"LossConfig.correction_cap must be a finite number >= 1, got {cap!r}")
        if low is not None and (isinstance(low, bool) or not (isinstance(low, (int, float)) and math.isfinite(low) and 0 < low <= 1)):
            raise ConfigError(f"LossConfig.correction_low must be None (1 / correction_cap) or a number in (0, 1], got {low!r}")
        if self.kind == "exit" and self.correction == "token-tis":
            raise ConfigError(
                "LossConfig.correction 'token-tis' weights tokens, and kind 'exit' weights rows by their sequence ratio: "
                "use 'tis' (sequence-level) with kind 'exit'"
            )

    def ratio_for(self, strategy: str) -> RatioConfig:
        """The sequence-ratio handling of `strategy`."""
        return self.ratio_by_strategy.get(strategy, self.ratio)

    @property
    def correction_bounds(self) -> tuple[float, float]:
        """(low, C) of `correction`: `correction_low` (None: 1 / `correction_cap`) and `correction_cap`."""
        cap = float(self.correction_cap)
        return (1.0 / cap if self.correction_low is None else float(self.correction_low)), cap

    @property
    def needs_old_logp(self) -> bool:
        """Whether the trainer computes p_old (`with_old_logprobs`) before the first step: for the
        proximal anchor (not under "rs", which has no ratio) and for every correction but "none"."""
        return self.correction != "none" or (self.anchor == "proximal" and self.kind != "rs")
