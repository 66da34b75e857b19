"""Models: the default tiny model built in code (no download), its warm start, and loading any
local Hugging Face model directory with a chat template.

- `default_model(cache_dir=None) -> Path`: build + warm-start the default model once, then reuse
  it from the cache (keyed by a hash of every build setting).
- `build_default_model(cache_dir=None, seed=0, ...) -> Path`: the same with every knob, for the CLI.
- `load_tokenizer(model_dir)`, `load_model(model_dir, dtype=torch.float32)`: any local model dir,
  or a LoRA checkpoint (a peft adapter folder on a local base model: `adapter_base`).
- `python -m pipeline.models`: build (or reuse) the default model and print its held-out accuracy.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from pipeline.errors import ConfigError

from .build import ModelConfig, build_tokenizer, build_untrained_model, count_parameters, weights_hash
from .chat import encode_prompt, prompt_hash
from .tokenizer import TokenizerConfig
from .warmstart import WarmStartConfig, WarmStartResult, solver_accuracy, warm_start

__all__ = [
    "ModelConfig",
    "TokenizerConfig",
    "WarmStartConfig",
    "WarmStartResult",
    "default_cache_dir",
    "default_model",
    "build_default_model",
    "evaluate_solver",
    "load_tokenizer",
    "load_model",
    "adapter_base",
    "ADAPTER_CONFIG",
    "weights_hash",
    "count_parameters",
    "encode_prompt",
    "prompt_hash",
    "BUILD_INFO",
]

BUILD_VERSION = 1
"""Bump when the build code changes what it produces, so old cached models are not reused."""
BUILD_INFO = "maxit_build.json"
"""File in a built model dir: the build settings, the warm start's record, held-out accuracies."""


def default_cache_dir() -> Path:
    """$MAXIT_CACHE_DIR, else ./.cache/maxit (relative to the working directory)."""
    return Path(os.environ.get("MAXIT_CACHE_DIR") or Path.cwd() / ".cache" / "maxit").resolve()


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of a local model dir (never downloads); it must have a chat template."""
    from transformers import AutoTokenizer

    model_dir = _local_dir(model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    if not tok.chat_template:
        raise ConfigError(f"model_dir {model_dir} has no chat template; maxit renders every prompt with one")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_dir: str | Path, dtype=None):
    """The causal LM of a local model dir (never downloads), in `dtype` (default float32), eval
    mode. A LoRA checkpoint is loaded as its base model with the adapter merged in."""
    import torch
    from transformers import AutoModelForCausalLM

    model_dir = _local_dir(model_dir)
    base = adapter_base(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        str(base or model_dir), dtype=dtype or torch.float32, local_files_only=True
    )
    if base is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(model_dir)).merge_and_unload()
    return model.eval()


ADAPTER_CONFIG = "adapter_config.json"
"""The file that makes a folder a LoRA checkpoint (peft's adapter config)."""


def adapter_base(model_dir: str | Path) -> Path | None:
    """The base model folder of a LoRA checkpoint (a folder with peft's `adapter_config.json`,
    whose `base_model_name_or_path` names a local model folder), or None for a full model."""
    path = Path(model_dir)
    config_file = path / ADAPTER_CONFIG
    if not config_file.is_file():
        return None
    try:
        base = json.loads(config_file.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"LoRA checkpoint {path}: {ADAPTER_CONFIG} is not readable JSON ({err})") from None
    if not base:
        raise ConfigError(f"LoRA checkpoint {path}: {ADAPTER_CONFIG} names no base_model_name_or_path")
    base = Path(base)
    if not base.is_absolute():
        base = (path / base).resolve()
    if not (base / "config.json").is_file():
        raise ConfigError(f"LoRA checkpoint {path}: its base model folder {base} ({ADAPTER_CONFIG}'s base_model_name_or_path) has no config.json")
    return base


def _local_dir(model_dir: str | Path) -> Path:
    p = Path(model_dir)
    if not (p / "config.json").is_file() and not (p / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"model_dir {str(model_dir)!r} is not a local model directory (no config.json)")
    return p


def _build_key(model_config: ModelConfig, warm_config: WarmStartConfig) -> str:
    from pipeline.tasks.prompts import ARITHMETIC_PROMPTS

    # the texts the warm start renders are part of what the model is trained on: a change to them
    # is a new model (other template fields, e.g. how a verdict is read, are not)
    trained = ("user", "system", "verifier_user", "verifier_system", "wrong_feedback", "right_feedback")
    prompts = {name: getattr(ARITHMETIC_PROMPTS, name) for name in trained}
    settings = {"version": BUILD_VERSION, "model": asdict(model_config), "warm_start": asdict(warm_config), "prompts": prompts}
    settings["warm_start"].pop("threads", None)  # does not change the result
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=6).hexdigest()


def evaluate_solver(model_dir: str | Path, n: int = 500, samples: int = 4, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy of a model's Solver on the default task: T=1 without and with the hint
    (`samples` each of `n` problems; standard error ~1 point at the defaults) and greedy."""
    from pipeline.tasks.arithmetic import ArithmeticTask

    task = ArithmeticTask()
    tok, model = load_tokenizer(model_dir), load_model(model_dir)
    problems = task.problems("heldout", n, seed=seed)
    return {
        "heldout_acc_t1": solver_accuracy(model, tok, problems, task, 1.0, samples, hint=False, seed=seed),
        "heldout_acc_t1_hint": solver_accuracy(model, tok, problems, task, 1.0, samples, hint=True, seed=seed + 1),
        "heldout_acc_greedy": solver_accuracy(model, tok, problems, task, 0.0, 1, hint=False, seed=seed),
    }


def build_default_model(
    cache_dir: str | Path | None = None,
    seed: int = 0,
    model_config: ModelConfig | None = None,
    warm_config: WarmStartConfig | None = None,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> Path:
    """Build the default tokenizer and model, warm-start it, measure its held-out accuracy, and
    save it under `<cache_dir>/models/default-<hash of the settings>` (atomically; an existing
    build with the same settings is reused unless `force`). Returns the model dir."""
    import torch

    from pipeline.store import atomic_dir, atomic_write_text

    model_config = model_config or ModelConfig(seed=seed)
    warm_config = warm_config or WarmStartConfig(seed=seed)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = cache / "models" / f"default-{_build_key(model_config, warm_config)}"
    if (out / BUILD_INFO).is_file() and not force:
        return out
    t0 = time.perf_counter()
    log(f"building the default model (seed {seed}) in {out}")
    with atomic_dir(out) as tmp:
        tok = build_tokenizer(model_config)
        build_untrained_model(model_config, tok, tmp)
        tok, model = load_tokenizer(tmp), load_model(tmp)
        log(f"tokenizer: {len(tok)} tokens; model: Llama {model_config.num_layers}x{model_config.hidden_size}, "
            f"{count_parameters(model) / 1e6:.2f}M parameters")
        with torch.random.fork_rng(devices=[]):
            result = warm_start(model, tok, warm_config, log=log)
        model.save_pretrained(str(tmp), safe_serialization=True)
        log(f"warm start: {result.steps} steps in {result.seconds:.0f}s; measuring held-out accuracy")
        acc = evaluate_solver(tmp)
        info = {
            "build_version": BUILD_VERSION,
            "model_config": asdict(model_config),
            "warm_start_config": asdict(warm_config),
            "warm_start": asdict(result),
            "parameters": count_parameters(model),
            "vocab_size": len(tok),
            "seconds": time.perf_counter() - t0,
            **acc,
        }
        atomic_write_text(tmp / BUILD_INFO, json.dumps(info, indent=2))
    log(f"default model ready in {time.perf_counter() - t0:.0f}s: held-out accuracy at T=1 "
        f"{acc['heldout_acc_t1']:.1%} without hint, {acc['heldout_acc_t1_hint']:.1%} with hint "
        f"({acc['heldout_acc_greedy']:.1%} greedy)")
    return out


def default_model(cache_dir: str | Path | None = None, seed: int = 0) -> Path:
    """The warm-started default model dir: built on the first call, reused afterwards."""
    return build_default_model(cache_dir, seed=seed)


def build_info(model_dir: str | Path) -> dict:
    """The record `build_default_model` wrote beside a default model."""
    return json.loads((Path(model_dir) / BUILD_INFO).read_text())
