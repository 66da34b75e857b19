"""Configuration of a training run: the loss (`LossConfig`, per-strategy `RatioConfig`), optional
LoRA (`LoraSettings`) and the run itself (`TrainConfig`).

Every field is documented where it is declared and validated at construction: a bad value raises
`pipeline.errors.ConfigError` naming the field. The defaults are the default run's (`maxit run`
with no flags): the "rs" loss, micro-batches cut to a token budget, gradient checkpointing
decided by the model's size, no logging integration. The others come from the prototype
(docs/FINDINGS.md): PPO clip [0.8, 1.28], sequence-ratio mask [1/3, 3], lr 5e-4 for the tiny
model (1e-3 collapsed), 2 epochs, minibatch 256, no KL. The "exit" loss (the expert-iteration
plan's estimator) defaults to no sequence-ratio mask and the mean over rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal, Mapping

from pipeline.config.fields import Setting, setting, settings
from pipeline.errors import ConfigError

__all__ = [
    "RatioConfig", "LossConfig", "LoraSettings", "TrainConfig", "AGGREGATIONS", "RATIO_MODES", "LOSS_KINDS", "ANCHORS", "CORRECTIONS", "CHECKPOINTING_PARAMETERS",
    "ACTIVATION_VALUES_PER_TOKEN", "CHECKPOINTING",
]

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
RATIO_MODES = ("mask", "truncate", "none")
"""The sequence-ratio handlings (`RatioConfig.mode`)."""
LOSS_KINDS = ("rs", "ppo", "is", "exit")
"""The losses (`LossConfig.kind`); rs, the default run's, first."""
ANCHORS = ("sampling", "proximal")
CORRECTIONS = ("none", "tis", "token-tis", "seq-mask", "geo-mask")
"""The staleness corrections (`LossConfig.correction`, docs/ALGORITHMS.md "Staleness corrections")."""
CHECKPOINTING = {"auto": None, "on": True, "off": False}
"""The `gradient_checkpointing` setting -> `TrainConfig.gradient_checkpointing`."""
CHECKPOINTING_PARAMETERS = 50_000_000
"""Models above this many parameters train with gradient checkpointing unless told otherwise."""
ACTIVATION_VALUES_PER_TOKEN = 4
"""float32 values kept per token, hidden unit and layer for the backward pass (`activation_mb`),
an estimate fitted on SmolLM2-135M under gradient checkpointing (about 3.3 measured)."""


def _finite_positive(name: str, value: float) -> None:
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
        if self.mode not in ("mask", "truncate", "none"):
            raise ConfigError(f"RatioConfig.mode must be 'mask', 'truncate' or 'none', got {self.mode!r}")
        if self.level not in ("mean", "sum"):
            raise ConfigError(f"RatioConfig.level must be 'mean' or 'sum', got {self.level!r}")
        _finite_positive("RatioConfig.low", self.low)
        _finite_positive("RatioConfig.high", self.high)
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
        if self.kind not in LOSS_KINDS:
            raise ConfigError(f"LossConfig.kind must be one of {LOSS_KINDS}, got {self.kind!r}")
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
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"LossConfig.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
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
        if self.anchor not in ANCHORS:
            raise ConfigError(f"LossConfig.anchor must be one of {ANCHORS}, got {self.anchor!r}")
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
        if self.correction not in CORRECTIONS:
            raise ConfigError(f"LossConfig.correction must be one of {CORRECTIONS}, got {self.correction!r}")
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


@dataclass(frozen=True)
class LoraSettings:
    """Train low-rank adapters (peft) instead of all weights; the checkpoint is the adapter alone
    (peft's folder, naming its base model folder), which the engines sample as a LoRA request on
    the base (vLLM) or merged into it (transformers)."""

    r: int = field(default=16, metadata=setting("lora_rank", "LoRA rank r (with --lora)", group="training"))
    """Adapter rank."""
    alpha: float = field(default=32.0, metadata=setting("lora_alpha", "LoRA scaling alpha (with --lora; the update is scaled by alpha / r)", group="training"))
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names the adapters attach to (Llama-style names by default)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ConfigError(f"LoraSettings.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ConfigError(f"LoraSettings.alpha must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("LoraSettings.target_modules must name at least one module")


@dataclass(frozen=True)
class TrainConfig:
    """One training run of one policy on its rows of a training view."""

    lr: float = field(default=5e-4, metadata=setting("lr", "AdamW learning rate", group="training"))
    """AdamW learning rate (docs/FINDINGS.md: 2e-4..5e-4 work for the tiny model, 1e-3 collapses)."""
    epochs: int = field(default=2, metadata=setting("epochs", "passes over each round's training rows", group="training"))
    """Passes over the rows; each row is seen exactly once per epoch."""
    minibatch_size: int = field(default=256, metadata=setting("minibatch_size", "rows per optimizer step", group="training"))
    """Rows per optimizer step."""
    micro_batch_size: int = field(default=64, metadata=setting("micro_batch_size", "rows per forward/backward pass", group="training"))
    """Rows per forward/backward; gradients are accumulated over minibatch_size / micro_batch_size of them."""
    temperature: float = 1.0
    """Sampling temperature of the rows: logits are divided by it before the log-softmax, so
    p_train and the stored q_sample are distributions at the same temperature."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The loss."""
    seed: int = 0
    """Seed of the row order and of anything random in training."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over the run."""
    warmup_steps: int = 0
    """Linear warm-up optimizer steps."""
    lr_round_decay: float = field(default=1.0, metadata=setting(
        "lr_round_decay", "learning rate across rounds: round r trains at lr * lr_round_decay^r; 1 = the same rate every round", group="training"))
    """Learning-rate schedule across the rounds of expert iteration: round r trains at
    lr * lr_round_decay**r (`for_round`), so late rounds, whose rows the policy already gets right,
    take smaller steps. 1 = the same rate every round."""
    report_to: str = "none"
    """Where the Trainer sends metrics ("none", "tensorboard", or any `transformers` integration
    name); TensorBoard logs are written inside the checkpoint folder, under `logs/`. "none" by
    default, as `maxit run` trains."""
    logging_steps: int = 1
    """Log metrics every this many optimizer steps."""
    lora: LoraSettings | None = field(default=None, metadata=setting(
        "lora",
        "train LoRA adapters (peft) instead of all weights: a checkpoint is an adapter on the starting model; with separate policies each agent is "
        "its own adapter on one shared base, served by one vLLM engine with LoRA requests",
        group="training", hint=bool, default=False))
    """Train LoRA adapters instead of all weights (None = full fine-tuning)."""
    dtype: Literal["auto", "float32", "bfloat16"] = field(default="auto", metadata=setting(
        "dtype",
        "precision of the engines and of training (bf16 autocast over float32 weights): auto = bfloat16 on a GPU, and on a CPU with "
        "native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo) for models of 20M parameters or more; float32 elsewhere and for the "
        "tiny default model (faster there, and sampled logprobs match training's)",
        group="team and task"))
    """Precision of the forward and backward passes. "bfloat16": bf16 autocast (weights, gradients
    and optimizer state stay float32; the logprobs and the loss are float32). "auto"
    (`pipeline.engines.config.resolve_dtype`): bfloat16 on a CUDA GPU, and on a CPU with native
    bf16 (AVX512-BF16 or AMX) for models of at least `BF16_MIN_PARAMETERS` parameters; float32
    elsewhere and for the tiny default model. The checkpoint's meta records the resolved value."""
    bf16: bool | None = None
    """Overrides `dtype` when set: True = "bfloat16", False = "float32" (None: follow `dtype`)."""
    num_threads: int | None = None
    """CPU threads for torch (None = the cores this process may use); oversubscribing a small
    machine makes every thread crawl."""
    max_length: int | None = None
    """Longest prompt + completion trained; longer rows are dropped and counted (None = the
    model's `max_position_embeddings`)."""
    logits_chunk_mb: float = 256.0
    """Memory budget of a micro-batch's vocabulary logits (float32 MB). Above it the completion
    positions are projected to the vocabulary a few rows at a time under activation
    checkpointing, so (rows x completion length x vocabulary) logits never exist at once; below it
    (the default tiny model always) one projection, as plain. 0 = always in one piece."""
    gradient_checkpointing: bool | None = field(default=None, metadata=setting(
        "gradient_checkpointing",
        "recompute activations in the backward pass (less memory, ~30% more time); auto = on for models above 50M parameters",
        group="training", hint=str, default="auto", choices=tuple(CHECKPOINTING)))
    """Recompute each layer's activations in the backward pass instead of keeping them (the
    Trainer's `gradient_checkpointing`): less memory for long rows, ~30% more compute. None (the
    default) = auto: on for models above `CHECKPOINTING_PARAMETERS` parameters (real models), off
    for the tiny default."""
    micro_batch_tokens: int | None = field(default=8192, metadata=setting(
        "micro_batch_tokens",
        "token budget of a micro-batch (rows x longest row): long rows get fewer rows per forward pass, same optimizer step; None = always micro_batch_size rows",
        group="training"))
    """Token budget of one micro-batch: rows x the longest row's prompt + completion tokens. The
    micro-batch is then the largest divisor of `minibatch_size` that fits the budget (at most
    `micro_batch_size` rows, at least one), so long chain-of-thought rows get small micro-batches
    and short rows keep `micro_batch_size`; the optimizer step (`minibatch_size` rows) is the
    same either way. None = always `micro_batch_size` rows."""
    activation_mb: float = 512.0
    """Memory budget of one micro-batch's activations, estimated as rows x the longest row's
    tokens x `ACTIVATION_VALUES_PER_TOKEN` float32 values per hidden unit and layer (hidden_size x
    num_hidden_layers x 4 x 4 bytes per token: SmolLM2-135M 276 KB a token, the tiny default
    model 8 KB). The micro-batch is also cut to fit it, like `micro_batch_tokens`: on SmolLM2-135M
    with GSM8K rows of ~700 tokens, 8 rows in one micro-batch peaked at 4.8 GB of training
    (`benchmarks`-style probe, docs/results/benchmarks.md), 2 rows at 3.6 GB. The tiny default model never reaches
    it. 0 = no budget."""
    sort_by_length: bool = True
    """Order the rows of each minibatch by length (and the rows `skip_zero_rows` leaves out last)
    before they are cut into micro-batches, so a micro-batch pads its rows to similar lengths.
    The minibatch (its rows, its loss's denominator, its gradient) is the one the shuffle drew;
    only which of its rows share a forward pass changes."""
    share_prefix: int = 32
    """When the rows of a micro-batch all begin their training prompts with the same tokens (a task's
    system prompt and worked examples), and at least this many, the prefix runs once as one row and
    the rows run only their own tokens on top of its keys and values: the same logprobs and
    gradients, the prefix's compute paid once per micro-batch instead of once per row
    (`pipeline.learn.trainer.completion_logps`). The activation budget (`activation_mb`) then
    counts a prefix common to all the policy's rows once, and `sort_by_length` puts the rows of a
    minibatch that begin with the same `share_prefix` tokens side by side (one agent's rows apart
    from another's under a shared policy). 0 = every row runs whole."""
    group_minibatches: bool = field(default=False, metadata=setting(
        "group_minibatches",
        "keep the samples of one prompt (a GRPO group) in one minibatch, the groups shuffled each epoch; off: every row shuffled on its own",
        group="training"))
    """Keep the rows of one group in one minibatch: rows with the same turn and training prompt
    (the samples of one problem, the siblings of one tree node) side by side in each epoch's
    order, the groups shuffled (`pipeline.learn.trainer.GroupShuffleSampler`), so a group's
    positive and negative advantages meet in one optimizer step. False: every row shuffled on its
    own, as TRL's GRPOTrainer shuffles a generation batch (several processes always are)."""
    optimizer_state: Literal["fresh", "carry"] = field(default="fresh", metadata=setting(
        "optimizer_state",
        "fresh: a new AdamW every round; carry: its moments and step count continue from the parent checkpoint's "
        "(optimizer.pt in each checkpoint), one optimizer over the run as in TRL and verl",
        group="training"))
    """"fresh": a new AdamW every round (its moments and step count start at zero). "carry": the
    moments and step count continue from the parent checkpoint's (`OPTIMIZER_STATE`, written into
    each checkpoint under "carry"), as TRL's and verl's trainers keep one optimizer across
    generation batches; the learning rate, betas and weight decay are this run's. A parent
    without that file (the starting model) starts fresh; one whose state does not fit the
    trainable parameters (another LoRA rank, full weights against an adapter) is an error that
    names the file. The file holds two float32 values per trainable parameter (~40 MB for a
    rank-16 adapter on a 135M model, 1 GB for all its weights)."""
    skip_zero_rows: bool = True
    """Leave out of the forward and backward passes the rows whose loss is exactly 0 whatever the
    policy: under "ppo" / "is" / "exit" those whose weighted advantage A w (A after
    `negative_weight`) is 0, unless the KL term (beta > 0) or the NLL of `sft_strategies` needs
    them; under "rs" those below the reward threshold (and those of weight 0 without a KL term).
    The minibatch's denominator still counts them, so the update is the same; the run counts
    them (`TrainResult.rows_skipped`)."""

    def __post_init__(self) -> None:
        _finite_positive("TrainConfig.lr", self.lr)
        _finite_positive("TrainConfig.temperature", self.temperature)
        for name in ("epochs", "minibatch_size", "micro_batch_size", "logging_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"TrainConfig.{name} must be an integer >= 1, got {v!r}")
        if self.minibatch_size % self.micro_batch_size:
            raise ConfigError(
                f"TrainConfig.minibatch_size ({self.minibatch_size}) must be a multiple of "
                f"TrainConfig.micro_batch_size ({self.micro_batch_size})"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm < 0:
            raise ConfigError(f"TrainConfig.max_grad_norm must be >= 0, got {self.max_grad_norm}")
        if self.lr_scheduler not in ("constant", "linear", "cosine"):
            raise ConfigError(f"TrainConfig.lr_scheduler must be 'constant', 'linear' or 'cosine', got {self.lr_scheduler!r}")
        if not (isinstance(self.lr_round_decay, (int, float)) and 0 < self.lr_round_decay <= 1):
            raise ConfigError(f"TrainConfig.lr_round_decay must be in (0, 1], got {self.lr_round_decay!r}")
        if self.warmup_steps < 0:
            raise ConfigError(f"TrainConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not isinstance(self.loss, LossConfig):
            raise ConfigError(f"TrainConfig.loss must be a LossConfig, got {type(self.loss).__name__}")
        if self.lora is not None and not isinstance(self.lora, LoraSettings):
            raise ConfigError(f"TrainConfig.lora must be a LoraSettings or None, got {type(self.lora).__name__}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"TrainConfig.num_threads must be >= 1 or None, got {self.num_threads}")
        if not (isinstance(self.logits_chunk_mb, (int, float)) and self.logits_chunk_mb >= 0):
            raise ConfigError(f"TrainConfig.logits_chunk_mb must be a number >= 0, got {self.logits_chunk_mb!r}")
        if not (isinstance(self.activation_mb, (int, float)) and math.isfinite(self.activation_mb) and self.activation_mb >= 0):
            raise ConfigError(f"TrainConfig.activation_mb must be a number >= 0, got {self.activation_mb!r}")
        if self.micro_batch_tokens is not None and (not isinstance(self.micro_batch_tokens, int) or self.micro_batch_tokens < 1):
            raise ConfigError(f"TrainConfig.micro_batch_tokens must be an integer >= 1 or None, got {self.micro_batch_tokens!r}")
        if not isinstance(self.share_prefix, int) or isinstance(self.share_prefix, bool) or self.share_prefix < 0:
            raise ConfigError(f"TrainConfig.share_prefix must be an integer >= 0 (tokens; 0 = off), got {self.share_prefix!r}")
        if self.optimizer_state not in ("fresh", "carry"):
            raise ConfigError(f"TrainConfig.optimizer_state must be 'fresh' or 'carry', got {self.optimizer_state!r}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"TrainConfig.dtype must be 'auto', 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.bf16 is not None and not isinstance(self.bf16, bool):
            raise ConfigError(f"TrainConfig.bf16 must be True, False or None, got {self.bf16!r}")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(f"TrainConfig.max_length must be >= 2 or None, got {self.max_length}")

    def for_round(self, round_: int) -> "TrainConfig":
        """The config round `round_` trains with: its learning rate decayed `round_` times."""
        if self.lr_round_decay == 1 or round_ <= 0:
            return self
        return replace(self, lr=self.lr * self.lr_round_decay**round_)

    @property
    def grad_accum_steps(self) -> int:
        return self.minibatch_size // self.micro_batch_size
