"""Building a small model in code: a Llama with random weights over a tokenizer trained in code, saved as a Hugging Face model directory (safetensors, fp32,
`generation_config.json` with eos/pad) that transformers, TRL and vLLM all load; and the cache of
such builds (`cached_build`: one folder per hash of the build's settings, built once, atomically).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.errors import ConfigError

from .tokenizer import TokenizerConfig

__all__ = [
    "ModelConfig",
    "build_untrained_model",
    "untrained_model",
    "weights_hash",
    "count_parameters",
    "BUILD_INFO",
    "build_info",
    "default_cache_dir",
    "settings_key",
    "cached_build",
    "MAX_MODEL_SCALE",
    "check_model_scale",
    "scaled_model_config",
]

BUILD_INFO = "maxit_build.json"
"""File in a model dir built in code: the build settings, the warm start's record, held-out accuracies."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the default model (a Llama; 4 x 128 with tied embeddings is ~1.1M parameters)."""

    num_layers: int = 4
    """Transformer blocks."""
    hidden_size: int = 128
    """Model width."""
    num_heads: int = 4
    """Attention heads; hidden_size / num_heads must be a head size vLLM's CPU backend supports (32, 64, ...)."""
    intermediate_size: int = 512
    """MLP width."""
    max_position_embeddings: int = 256
    """Longest sequence (prompt + completion)."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output projection."""
    initializer_range: float = 0.02
    """Standard deviation of the random initial weights (transformers' default)."""
    seed: int = 0
    """Seed of the random initialization and of the tokenizer's training corpus."""
    tokenizer: TokenizerConfig = TokenizerConfig()
    """The tokenizer trained alongside."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})"
            )
        if not self.initializer_range > 0:
            raise ConfigError(f"model.initializer_range must be > 0, got {self.initializer_range}")
        if self.hidden_size // self.num_heads < 16:
            raise ConfigError(f"model.hidden_size / model.num_heads must be >= 16, got {self.hidden_size // self.num_heads}")

    def key(self) -> dict:
        """The settings a build's cache key hashes: every field, `initializer_range` only where it
        is not the default (so the builds made before it existed keep their keys)."""
        out = asdict(self)
        if out["initializer_range"] == ModelConfig.initializer_range:
            del out["initializer_range"]
        return out


MAX_MODEL_SCALE = 8
"""The deepest embedded model a workflow's `model_scale` asks for: 8 times the default's layers."""


def check_model_scale(workflow: str, scale) -> None:
    """A workflow option `model_scale` is a whole number in [1, MAX_MODEL_SCALE], else a
    ConfigError naming the workflow."""
    if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= MAX_MODEL_SCALE:
        raise ConfigError(f"workflow {workflow!r}: model_scale must be an integer in [1, {MAX_MODEL_SCALE}] "
                          f"(a model of {ModelConfig.num_layers}..{ModelConfig.num_layers * MAX_MODEL_SCALE} layers), got {scale!r}")


def scaled_model_config(seed: int, scale: int) -> ModelConfig | None:
    """The embedded model `scale` times as deep (about `scale` times the parameters: the wide arm
    of a team of `scale` policies); None at scale 1, the workflow's default build."""
    return ModelConfig(seed=seed, num_layers=ModelConfig.num_layers * scale) if scale != 1 else None


def build_untrained_model(config: ModelConfig, tokenizer, out_dir: str | Path) -> Path:
    """Save `tokenizer` and a randomly initialized Llama of `config` to `out_dir` (fp32 safetensors)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def weights_hash(model_dir: str | Path, length: int = 12) -> str:
    """A short hash of a checkpoint's weight files (`*.safetensors`, else `*.bin`): its model_version."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise ConfigError(f"no weight files (*.safetensors or *.bin) in model_dir {model_dir}")
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:length]


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def untrained_model(config: ModelConfig, tokenizer, out_dir: str | Path):
    """(tokenizer, model) of `build_untrained_model(config, tokenizer, out_dir)`, loaded back from
    `out_dir` as every later user of the folder loads it."""
    from .loading import load_model, load_tokenizer

    build_untrained_model(config, tokenizer, out_dir)
    return load_tokenizer(out_dir), load_model(out_dir)


def build_info(model_dir: str | Path) -> dict:
    """The record a build in code wrote beside its model (`BUILD_INFO`)."""
    return json.loads((Path(model_dir) / BUILD_INFO).read_text())


def default_cache_dir() -> Path:
    """Where built models are cached: the project's cache folder (`pipeline.store.cache_root`)."""
    from pipeline.store import cache_root

    return cache_root()


def settings_key(settings: Mapping[str, Any]) -> str:
    """The cache key of a build: a short hash of its settings as sorted JSON. It hashes settings,
    not code: a change to the build code that changes what it produces must change a setting
    (each build's version number), or old cached models are reused."""
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=6).hexdigest()


def cached_build(
    cache_dir: str | Path | None,
    name: str,
    settings: Mapping[str, Any],
    build: Callable[[Path], dict],
    *,
    what: str,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """The model folder `<cache_dir>/models/<name>-<settings_key(settings)>` (`cache_dir` None:
    `default_cache_dir()`): reused when a build wrote its `BUILD_INFO` there (unless `force`),
    else built by `build(folder)`, which writes the model into the folder and returns its build
    record; the record, with the build's `seconds`, is written as `BUILD_INFO` last, and the
    folder is renamed into place (`pipeline.store.atomic_dir`: a failed build leaves nothing)."""
    from pipeline.store import atomic_dir, atomic_write_text

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / "models" / f"{name}-{settings_key(settings)}"
    if (out / BUILD_INFO).is_file() and not force:
        return out
    t0 = time.perf_counter()
    log(f"building {what} in {out}")
    with atomic_dir(out) as tmp:
        info = build(tmp)
        info["seconds"] = time.perf_counter() - t0
        atomic_write_text(tmp / BUILD_INFO, json.dumps(info, indent=2))
    return out
