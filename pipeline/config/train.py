"""Configuration of a training run: optional LoRA (`LoraSettings`) and the run itself
(`TrainConfig`), which holds the loss (`pipeline.config.loss`: `LossConfig`, per-strategy
`RatioConfig`).

Every field is documented where it is declared and validated at construction: a bad value raises
`pipeline.errors.ConfigError` naming the field. The defaults are the default run's (`maxit run`
with no flags): the "rs" loss, micro-batches cut to a token budget, gradient checkpointing
decided by the model's size, no logging integration. The others come from the prototype
(docs/FINDINGS.md): lr 5e-4 for the tiny model (1e-3 collapsed), 2 epochs, minibatch 256, no KL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from pipeline.config.fields import check_count, check_declared, setting
from pipeline.config.loss import LossConfig, finite_positive
from pipeline.errors import ConfigError

__all__ = ["LoraSettings", "TrainConfig", "CHECKPOINTING_PARAMETERS", "ACTIVATION_VALUES_PER_TOKEN", "CHECKPOINTING"]

CHECKPOINTING = {"auto": None, "on": True, "off": False}
"""The `gradient_checkpointing` setting -> `TrainConfig.gradient_checkpointing`."""
CHECKPOINTING_PARAMETERS = 50_000_000
"""Models above this many parameters train with gradient checkpointing unless told otherwise."""
ACTIVATION_VALUES_PER_TOKEN = 4
"""float32 values kept per token, hidden unit and layer for the backward pass (`activation_mb`),
an estimate fitted on SmolLM2-135M under gradient checkpointing (about 3.3 measured)."""


@dataclass(frozen=True)
class LoraSettings:
    """Train low-rank adapters (peft) instead of all weights; the checkpoint is the adapter alone
    (peft's folder, naming its base model folder), which the engines sample as a LoRA request on
    the base (vLLM) or merged into it (transformers)."""

    r: int = field(default=16, metadata=setting("lora_rank", "LoRA rank r (with --lora)", group="training"))
    """Adapter rank."""
    alpha: float = field(default=32.0, metadata=setting("lora_alpha", "LoRA scaling alpha (with --lora; the update is scaled by alpha / r)", group="training"))
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Module names the adapters attach to (Llama-style names by default)."""

    def __post_init__(self) -> None:
        check_declared(self)  # target_modules a sequence
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
        check_declared(self)  # the declared choices (lr_scheduler, optimizer_state, dtype)
        finite_positive("TrainConfig.lr", self.lr)
        finite_positive("TrainConfig.temperature", self.temperature)
        for name in ("epochs", "minibatch_size", "micro_batch_size", "logging_steps"):
            check_count(f"TrainConfig.{name}", getattr(self, name))
        if self.minibatch_size % self.micro_batch_size:
            raise ConfigError(
                f"TrainConfig.minibatch_size ({self.minibatch_size}) must be a multiple of "
                f"TrainConfig.micro_batch_size ({self.micro_batch_size})"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm < 0:
            raise ConfigError(f"TrainConfig.max_grad_norm must be >= 0, got {self.max_grad_norm}")
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
        check_count("TrainConfig.micro_batch_tokens", self.micro_batch_tokens, optional=True)
        if not isinstance(self.share_prefix, int) or isinstance(self.share_prefix, bool) or self.share_prefix < 0:
            raise ConfigError(f"TrainConfig.share_prefix must be an integer >= 0 (tokens; 0 = off), got {self.share_prefix!r}")
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
