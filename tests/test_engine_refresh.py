"""Engines refreshed in place (issue 57, item 4): a live vLLM engine pointed at a new checkpoint of
its architecture loads the new weights (`pipeline.engines.vllm.refresh_weights`) instead of
building a new engine; it then samples what an engine built fresh on that checkpoint samples
(the same greedy tokens; logprobs within 1e-5, where float32 kernels on the same inputs agree)
and what teacher forcing on the transformers model gives, and no engine is built for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.engines import EngineConfig
from pipeline.models import encode_prompt, load_model, load_tokenizer, weights_hash
from pipeline.tasks import ArithmeticTask
from test_engines import teacher_forced

LOGPROB_TOL = 1e-5


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory) -> Path:
    """The tiny model's architecture and tokenizer with other random weights (a new checkpoint)."""
    from pipeline.models.build import ModelConfig, build_untrained_model
    from pipeline.workflows.math.model import build_tokenizer

    config = ModelConfig(seed=99)
    return build_untrained_model(config, build_tokenizer(config), tmp_path_factory.mktemp("tiny-other"))


def prompts_of(model_dir: Path) -> list[list[int]]:
    tok, task = load_tokenizer(model_dir), ArithmeticTask()
    return [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("train", 4, seed=3)]


def worst_against_teacher_forcing(groups, prompts, model, temperature) -> float:
    return max((teacher_forced(model, p, s.token_ids, temperature) - torch.tensor(s.logprobs)).abs().max().item()
               for p, g in zip(prompts, groups) for s in g)


def test_the_default_swap_loads_weights_into_the_running_engine():
    assert EngineConfig().swap == "reload"


@pytest.mark.vllm
def test_a_refreshed_engine_samples_the_new_weights_without_a_build(vllm_sampler, tiny_model_dir, other_weights):
    prompts = prompts_of(other_weights)
    builds, refreshes = vllm_sampler.builds, vllm_sampler.refreshes
    before = vllm_sampler.generate(prompts, n=1, temperature=0.0, max_tokens=12, seed=0)
    try:
        vllm_sampler.load_checkpoint(other_weights)
        assert (vllm_sampler.builds, vllm_sampler.refreshes) == (builds, refreshes + 1)
        assert vllm_sampler.model_version == weights_hash(other_weights)
        greedy = vllm_sampler.generate(prompts, n=1, temperature=0.0, max_tokens=12, seed=0)
        sampled = vllm_sampler.generate(prompts, n=2, temperature=0.7, max_tokens=12, seed=1)
        model = load_model(other_weights)
        # the new weights, all of them: the old LM head (tied to the embeddings) would sample the
        # new hidden states with the old vocabulary projection
        assert [g[0].token_ids for g in greedy] != [g[0].token_ids for g in before]
        assert worst_against_teacher_forcing(sampled, prompts, model, 0.7) < 1e-4
    finally:
        vllm_sampler.load_checkpoint(tiny_model_dir)
    assert vllm_sampler.builds == builds
    back = vllm_sampler.generate(prompts, n=1, temperature=0.0, max_tokens=12, seed=0)
    assert [g[0].token_ids for g in back] == [g[0].token_ids for g in before]


@pytest.mark.vllm
@pytest.mark.slow  # three vLLM engines built (minutes on a shared 2-core CPU)
def test_a_refreshed_engine_equals_one_built_on_the_new_checkpoint_and_builds_fewer(tiny_model_dir, other_weights):
    from pipeline.engines.pool import EnginePool

    prompts = prompts_of(other_weights)
    outputs, pools = {}, {}
    for swap in ("reload", "rebuild"):
        pool = pools[swap] = EnginePool("vllm", {"swap": swap})
        try:
            pool.get("p", tiny_model_dir)
            sampler = pool.get("p", other_weights)  # the policy's next checkpoint
            outputs[swap] = (sampler.generate(prompts, n=1, temperature=0.0, max_tokens=16, seed=0),
                             sampler.generate(prompts, n=2, temperature=0.7, max_tokens=16, seed=1))
        finally:
            pool.close()
    assert (pools["reload"].builds, pools["rebuild"].builds) == (1, 2)
    for refreshed, fresh in zip(outputs["reload"], outputs["rebuild"]):
        for a, b in zip(refreshed, fresh):
            for x, y in zip(a, b):
                assert x.token_ids == y.token_ids
                assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) <= LOGPROB_TOL
