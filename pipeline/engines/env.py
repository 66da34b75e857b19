"""Process environment vLLM reads at import time (kept out of vllm.py so it can be set, and
tested, without importing vllm)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["configure_vllm_env", "available_cores"]


def available_cores() -> list[int]:
    """The CPU cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _core_ranges(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (the format of VLLM_CPU_OMP_THREADS_BIND)."""
    parts, start, prev = [], None, None
    for c in cores:
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def configure_vllm_env(cache_dir: str | Path | None = None, cpu_cores: str | None = None, kv_cache_gb: int = 1) -> dict[str, str]:
    """Set (with `setdefault`: a value already in the environment wins) what vLLM needs on this
    machine; returns the values in effect. Must run before vllm is imported.

    - VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine runs in this process;
    - VLLM_CPU_OMP_THREADS_BIND: the cores to bind to (default: all cores this process may use);
    - VLLM_CPU_KVCACHE_SPACE: KV cache GiB on CPU;
    - VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR: inside maxit's cache folder (vLLM compiles a
      logprob kernel with the C++ compiler the first time and reuses it after);
    - VLLM_NO_USAGE_STATS / DO_NOT_TRACK, HF_HUB_OFFLINE: nothing leaves the machine.
    """
    from pipeline.store import cache_root

    root = Path(cache_dir) if cache_dir is not None else cache_root()
    wanted = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": cpu_cores or _core_ranges(available_cores()),
        "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gb)),
        "VLLM_CACHE_ROOT": str(root / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    return {k: os.environ.setdefault(k, v) for k, v in wanted.items()}


def return_freed_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the system (glibc's
    `malloc_trim`), so a closed engine's memory leaves the process's resident set (measured:
    docs/results/engines.md); a no-op elsewhere."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        return
    if trim is not None:
        trim(0)
