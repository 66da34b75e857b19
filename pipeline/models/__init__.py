"""Models: loading any local Hugging Face model directory with a chat template (never from a
hub), LoRA checkpoints over a local base, and building small models in code (`build.py`,
`tokenizer.py`, `sft.py`; the embedded models of the built-in workflows are built and
warm-started beside their workflows, e.g. `pipeline.workflows.math.model`).

- `load_tokenizer(model_dir)`, `load_model(model_dir, dtype=torch.float32)`: any local model dir,
  or a LoRA checkpoint (a peft adapter folder on a local base model: `adapter_base`) (`loading.py`).
- `default_cache_dir()`: where built models are cached (`pipeline.store.cache_root`).
- `cached_build(...)`: a model built in code once, under its settings' hash, then reused.
"""

from __future__ import annotations

from .build import BUILD_INFO, ModelConfig, build_info, build_untrained_model, cached_build, count_parameters, default_cache_dir, weights_hash
from .chat import encode_prompt, prompt_hash
from .loading import ADAPTER_CONFIG, adapter_base, load_model, load_tokenizer
from .tokenizer import TokenizerConfig

__all__ = [
    "ModelConfig",
    "TokenizerConfig",
    "default_cache_dir",
    "load_tokenizer",
    "load_model",
    "adapter_base",
    "ADAPTER_CONFIG",
    "weights_hash",
    "count_parameters",
    "build_untrained_model",
    "cached_build",
    "encode_prompt",
    "prompt_hash",
    "BUILD_INFO",
    "build_info",
]
