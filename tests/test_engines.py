"""Rollout engines: verbatim completion ids, logprobs of the distribution actually sampled
(cross-checked against the transformers model under teacher forcing), seeds, finish reasons,
weight swaps, the argument check both engines share. One vLLM engine serves the whole session
(`vllm_sampler` in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.engines import EngineConfig, check_generate_args, make_sampler
from pipeline.errors import ConfigError
from pipeline.models import encode_prompt, load_model, load_tokenizer, weights_hash
from pipeline.tasks import ArithmeticTask
from pipeline.types import Sampler

TEMPERATURE = 0.7
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    task = ArithmeticTask()
    probs = task.problems("train", 6, seed=0)
    out = [encode_prompt(tok, task.solver_messages(p)) for p in probs[:4]]
    out += [encode_prompt(tok, task.verifier_messages(p, "17")) for p in probs[4:]]  # unequal lengths
    return out


@pytest.fixture(scope="module")
def hf_sampler(tiny_model_dir):
    return make_sampler("hf", tiny_model_dir)


def teacher_forced(model, prompt, completion, temperature):
    """log_softmax(logits / T) of each completion token, the prompt and completion fed at once."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def check_samples(groups, prompts, n, eos_id, max_tokens):
    assert len(groups) == len(prompts) and all(len(g) == n for g in groups)
    reasons = set()
    for g in groups:
        for s in g:
            assert len(s.token_ids) == len(s.logprobs) >= 1
            assert all(isinstance(t, int) for t in s.token_ids) and all(lp <= 0 for lp in s.logprobs)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == eos_id and eos_id not in s.token_ids[:-1]
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == max_tokens and eos_id not in s.token_ids
            reasons.add(s.finish_reason)
    assert reasons == {"stop", "length"}  # 48 random tokens over ~320: some hit EOS, most do not


def check_against_teacher_forcing(groups, prompts, model, temperature, tol=1e-4):
    worst = 0.0
    for prompt, g in zip(prompts, groups):
        for s in g:
            ref = teacher_forced(model, prompt, s.token_ids, temperature)
            worst = max(worst, (ref - torch.tensor(s.logprobs)).abs().max().item())
    assert worst < tol, worst
    # and the check has power: the T=1 logprobs of the same tokens are far from the stored ones
    s = groups[0][0]
    raw = teacher_forced(model, prompts[0], s.token_ids, 1.0)
    assert (raw - torch.tensor(s.logprobs)).abs().max().item() > 100 * tol


def reencoding_differs(tok, samples) -> bool:
    """True if decoding then re-encoding some sample's text would not give back its ids."""
    for s in samples:
        body = s.token_ids[:-1] if s.finish_reason == "stop" else s.token_ids
        if tok(s.text, add_special_tokens=False)["input_ids"] != body:
            return True
    return False


# -- the argument check both engines share ---------------------------------------------------
GOOD = dict(n=2, temperature=1.0, max_tokens=4)
BAD_CALLS = {
    "n": (dict(GOOD, n=0), "n and max_tokens must be >= 1, got n=0, max_tokens=4"),
    "max_tokens": (dict(GOOD, max_tokens=0), "n and max_tokens must be >= 1, got n=2, max_tokens=0"),
    "temperature": (dict(GOOD, temperature=-0.1), "temperature must be >= 0, got -0.1"),
    "empty_prompt": (dict(GOOD, prompt=1), "prompt_ids[1] is empty; every prompt needs at least one token"),
}


def bad_call(prompts, case):
    """(prompt_ids, n, temperature, max_tokens) of the bad call `case`, on real prompts."""
    args = dict(BAD_CALLS[case][0])
    ids = [list(p) for p in prompts[:3]]
    if "prompt" in args:
        ids[args.pop("prompt")] = []
    return ids, args


def test_engine_dtype_auto_is_bf16_on_cuda_and_on_a_bf16_cpu_for_real_models(monkeypatch):
    from pipeline.engines import config as ec

    real = ec.BF16_MIN_PARAMETERS
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ec, "cpu_has_bf16", lambda: False)
    assert EngineConfig().resolved_dtype(real) == "float32" and EngineConfig().torch_dtype() is torch.float32
    monkeypatch.setattr(ec, "cpu_has_bf16", lambda: True)  # tests/test_dtype.py: the detection itself
    assert EngineConfig().resolved_dtype(real) == "bfloat16" and EngineConfig().resolved_dtype(real - 1) == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert EngineConfig().resolved_dtype() == "bfloat16" and EngineConfig().torch_dtype() is torch.bfloat16
    assert EngineConfig(dtype="float32").resolved_dtype(real) == "float32"
    with pytest.raises(ConfigError, match="engine.dtype"):
        EngineConfig(dtype="fp8")


def test_the_default_model_samples_in_float32_on_any_cpu(hf_sampler):
    """The default architecture is below `BF16_MIN_PARAMETERS`: its logprobs stay float32's."""
    assert hf_sampler.dtype == "float32" and hf_sampler.model.dtype == torch.float32


def test_check_generate_args_returns_int_lists():
    import numpy as np

    assert check_generate_args([(3, 4), np.array([5], dtype=np.int64)], n=1, temperature=0.0, max_tokens=1) == [[3, 4], [5]]
    out = check_generate_args([np.array([5], dtype=np.int64)], n=1, temperature=0.0, max_tokens=1)
    assert type(out[0][0]) is int
    assert check_generate_args([], n=1, temperature=1.0, max_tokens=1) == []


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_check_generate_args_rejects(case, prompts):
    ids, args = bad_call(prompts, case)
    with pytest.raises(ConfigError) as err:
        check_generate_args(ids, **args)
    assert str(err.value) == BAD_CALLS[case][1]


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_engines_raise_the_same_config_error(engine, case, prompts, request):
    """A bad `generate` call raises the shared check's ConfigError, word for word, whichever
    engine runs it."""
    sampler = request.getfixturevalue(f"{engine}_sampler")
    ids, args = bad_call(prompts, case)
    with pytest.raises(ConfigError) as err:
        sampler.generate(ids, seed=0, **args)
    assert str(err.value) == BAD_CALLS[case][1]


def test_hf_accepts_tuples_and_numpy_ids_like_lists(hf_sampler, prompts):
    import numpy as np

    as_lists = hf_sampler.generate(prompts[:2], n=2, temperature=1.0, max_tokens=6, seed=2)
    mixed = [tuple(prompts[0]), np.array(prompts[1], dtype=np.int64)]
    assert hf_sampler.generate(mixed, n=2, temperature=1.0, max_tokens=6, seed=2) == as_lists


# -- transformers ---------------------------------------------------------------------------
def test_make_sampler_validates(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="engine"):
        make_sampler("tgi", tiny_model_dir)
    with pytest.raises(ConfigError, match="config.json"):
        make_sampler("hf", tmp_path)
    with pytest.raises(ConfigError, match="max_batch"):
        EngineConfig(max_batch=0)


def test_hf_samples_ids_logprobs_and_finish_reasons(hf_sampler, prompts, tiny_model_dir):
    assert isinstance(hf_sampler, Sampler) and hf_sampler.engine == "hf"
    assert hf_sampler.model_version == weights_hash(tiny_model_dir)
    groups = hf_sampler.generate(prompts, n=8, temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=11)
    check_samples(groups, prompts, 8, hf_sampler.tokenizer.eos_token_id, MAX_TOKENS)
    check_against_teacher_forcing(groups, prompts, load_model(tiny_model_dir), TEMPERATURE)


def test_hf_same_seed_same_samples(hf_sampler, prompts):
    a = hf_sampler.generate(prompts, n=3, temperature=1.0, max_tokens=12, seed=5)
    assert a == hf_sampler.generate(prompts, n=3, temperature=1.0, max_tokens=12, seed=5)
    assert a != hf_sampler.generate(prompts, n=3, temperature=1.0, max_tokens=12, seed=6)
    assert a[0][0] != a[0][1]  # the n samples of a prompt are independent draws


def test_hf_ids_are_the_generated_ids_verbatim(hf_sampler, prompts):
    """The completion ids are what `generate` produced (cut after EOS), not a re-tokenization
    of the text: compared with a direct call, and on samples whose text re-encodes differently."""
    groups = hf_sampler.generate(prompts[:1], n=4, temperature=1.0, max_tokens=16, seed=3)
    torch.manual_seed(3)
    ids = torch.tensor([prompts[0]] * 4)
    raw = hf_sampler.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                    top_k=0, top_p=1.0, max_new_tokens=16, pad_token_id=0, eos_token_id=[1])
    for s, row in zip(groups[0], raw[:, len(prompts[0]):].tolist()):
        assert s.token_ids == row[: len(s.token_ids)]
    assert reencoding_differs(hf_sampler.tokenizer, groups[0])


def test_hf_greedy(hf_sampler, prompts, tiny_model_dir):
    g = hf_sampler.generate(prompts[:2], n=2, temperature=0.0, max_tokens=6, seed=0)
    assert g[0][0] == g[0][1]
    model = load_model(tiny_model_dir)
    ref = teacher_forced(model, prompts[0], g[0][0].token_ids, 0.0)
    assert torch.allclose(ref, torch.tensor(g[0][0].logprobs), atol=1e-4)


# -- vLLM -----------------------------------------------------------------------------------
@pytest.mark.vllm
def test_vllm_samples_ids_logprobs_and_finish_reasons(vllm_sampler, prompts, tiny_model_dir):
    """vLLM's sampled-token logprobs equal the transformers model's log_softmax(logits / T)
    under teacher forcing (fp32): the engine returns processed (temperature-scaled) logprobs."""
    assert isinstance(vllm_sampler, Sampler) and vllm_sampler.engine == "vllm"
    assert vllm_sampler.model_version == weights_hash(tiny_model_dir)
    groups = vllm_sampler.generate(prompts, n=8, temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=11)
    check_samples(groups, prompts, 8, vllm_sampler.tokenizer.eos_token_id, MAX_TOKENS)
    check_against_teacher_forcing(groups, prompts, load_model(tiny_model_dir), TEMPERATURE)
    assert len({tuple(s.token_ids) for s in groups[0]}) == 8  # independent draws per sample


@pytest.mark.vllm
def test_vllm_runs_several_calls_as_one_batch_with_each_calls_own_samples(vllm_sampler, prompts):
    """`generate_calls` (one vLLM batch) gives every call exactly the samples it draws alone:
    each sample is its own request with its own seed. The tiny model runs in float32, where a
    request's tokens do not depend on the batch it shares."""
    from pipeline.types import GenerateCall, generate_calls

    calls = [
        GenerateCall(prompts[:3], 2, 1.0, 12, 5),
        GenerateCall(prompts[1:], 1, 0.0, 12, 5),  # greedy next to sampled
        GenerateCall(prompts[:2], 3, 0.7, 8, [11, 12]),  # per-prompt seeds
    ]
    alone = [vllm_sampler.generate(*c) for c in calls]
    assert vllm_sampler.generate_calls(calls) == alone
    assert generate_calls(vllm_sampler, calls) == alone
    with pytest.raises(ConfigError, match="n and max_tokens"):  # checked before anything runs
        vllm_sampler.generate_calls([calls[0], GenerateCall(prompts, 0, 1.0, 12, 5)])


def test_generate_calls_runs_a_sampler_without_it_one_call_at_a_time(hf_sampler, prompts):
    from pipeline.types import GenerateCall, generate_calls

    calls = [GenerateCall(prompts[:2], 2, 1.0, 6, 3), GenerateCall(prompts[2:], 1, 0.0, 6, 3)]
    assert not hasattr(hf_sampler, "generate_calls")
    assert generate_calls(hf_sampler, calls) == [hf_sampler.generate(*c) for c in calls]

    class Short:  # a batching engine that loses a call is an error, not a silent gap
        def generate_calls(self, calls):
            return [[]]

    with pytest.raises(RuntimeError, match="returned 1 results for 2 calls"):
        generate_calls(Short(), calls)


@pytest.mark.vllm
def test_vllm_seeds_and_verbatim_ids(vllm_sampler, prompts):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    a = vllm_sampler.generate(prompts, n=2, temperature=1.0, max_tokens=12, seed=5)
    assert a == vllm_sampler.generate(prompts, n=2, temperature=1.0, max_tokens=12, seed=5)
    assert a != vllm_sampler.generate(prompts, n=2, temperature=1.0, max_tokens=12, seed=6)
    # the ids are the engine's raw output: the same request straight to vLLM gives the same ids
    seed = 5 * 1_000_003 + 0 * 2 + 1  # sample 1 of prompt 0
    raw = vllm_sampler.llm.generate(
        [TokensPrompt(prompt_token_ids=prompts[0])],
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_tokens=12, seed=seed, logprobs=0, stop_token_ids=[1]),
        use_tqdm=False,
    )[0].outputs[0]
    assert a[0][1].token_ids == list(raw.token_ids)
    assert a[0][1].logprobs == [step[t].logprob for t, step in zip(raw.token_ids, raw.logprobs)]
    assert reencoding_differs(vllm_sampler.tokenizer, [s for g in a for s in g])


@pytest.mark.vllm
def test_vllm_and_hf_agree_on_the_trained_model_and_swap_weights(vllm_sampler, tiny_model_dir, default_model_dir):
    """Swap the session engine to the warm-started model (peaked distributions), check its
    logprobs there, sample the arithmetic answers both engines agree are likely, swap back."""
    tok = load_tokenizer(default_model_dir)
    task = ArithmeticTask()
    probs = task.problems("heldout", 8, seed=0)
    prompts = [encode_prompt(tok, task.solver_messages(p)) for p in probs]
    try:
        vllm_sampler.load_checkpoint(default_model_dir)
        assert vllm_sampler.model_version == weights_hash(default_model_dir)
        assert vllm_sampler.swap_seconds < 30
        groups = vllm_sampler.generate(prompts, n=4, temperature=1.0, max_tokens=8, seed=0)
        model = load_model(default_model_dir)
        worst = max(
            (teacher_forced(model, pr, s.token_ids, 1.0) - torch.tensor(s.logprobs)).abs().max().item()
            for pr, g in zip(prompts, groups) for s in g
        )
        assert worst < 1e-4, worst
        assert all(s.finish_reason == "stop" and s.text.isdigit() for g in groups for s in g)
        hf = make_sampler("hf", default_model_dir).generate(prompts, n=4, temperature=1.0, max_tokens=8, seed=0)
        acc = lambda gs: sum(task.reward(p, s.text) for p, g in zip(probs, gs) for s in g) / 32  # noqa: E731
        assert acc(groups) > 0 and acc(hf) > 0
    finally:
        vllm_sampler.load_checkpoint(tiny_model_dir)
    assert vllm_sampler.model_version == weights_hash(tiny_model_dir)
    g = vllm_sampler.generate(prompts[:2], n=2, temperature=TEMPERATURE, max_tokens=8, seed=1)
    check_against_teacher_forcing(g, prompts[:2], load_model(tiny_model_dir), TEMPERATURE)


def random_adapter(base_dir, out_dir, seed: int, rank: int = 8):
    """A LoRA adapter on `base_dir` with random (non-zero) weights, saved as a LoRA checkpoint."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        load_model(base_dir),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], init_lora_weights=False),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(0.5)
    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    model.save_pretrained(out_dir)
    load_tokenizer(base_dir).save_pretrained(out_dir)
    return out_dir


@pytest.mark.vllm
@pytest.mark.parametrize("lora_sampling", ["requests", "merged"])
def test_vllm_serves_lora_checkpoints_on_one_engine(tiny_model_dir, tmp_path, lora_sampling):
    """LoRA checkpoints are sampled on their base's engine, as LoRA requests or with the adapter
    merged into the engine's weights before the call (the CPU default): the logprobs are the
    merged model's under teacher forcing, a new adapter is no rebuild, and two policies whose
    checkpoints are adapters on one base share one engine (`EnginePool`)."""
    from pipeline.engines.pool import EnginePool

    tok = load_tokenizer(tiny_model_dir)
    task = ArithmeticTask()
    prompts = [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("train", 3, seed=1)]
    a = random_adapter(tiny_model_dir, tmp_path / "a", seed=1)
    b = random_adapter(tiny_model_dir, tmp_path / "b", seed=2)
    pool = EnginePool("vllm", {"lora_sampling": lora_sampling})
    try:
        # a run training rank-8 adapters: the base model of round 0 is served by a LoRA engine
        solver = pool.get("solver", tiny_model_dir, lora_rank=8)
        verifier = pool.get("verifier", tiny_model_dir, lora_rank=8)
        assert solver.lora and verifier.shared is solver  # one engine for both policies
        llm = solver.llm
        base_out = verifier.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=16, seed=3)
        check_against_teacher_forcing(base_out, prompts, load_model(tiny_model_dir), TEMPERATURE)

        assert pool.get("solver", a) is solver and pool.get("verifier", b) is verifier
        assert solver.llm is llm and solver.model_version == weights_hash(a)  # no rebuild for a new adapter
        out_a = solver.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=16, seed=3)
        out_b = verifier.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=16, seed=3)
        check_against_teacher_forcing(out_a, prompts, load_model(a), TEMPERATURE)
        check_against_teacher_forcing(out_b, prompts, load_model(b), TEMPERATURE)
        assert out_a != out_b != base_out  # the adapters change the samples
        # the base is still served without an adapter after the adapters were used
        assert pool.get("verifier", tiny_model_dir) is verifier
        assert verifier.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=16, seed=3) == base_out
        # before training: the LoRA engine stays (a new adapter is a new request), unless asked
        assert pool.release() == [] and solver.llm is llm
        if lora_sampling == "merged":  # back and forth between the adapters and the base: each swap
            assert solver.merged is not None and solver.merged.swaps == 3  # a, b, the base
            assert solver.generate(prompts, n=2, temperature=TEMPERATURE, max_tokens=16, seed=3) == out_a
            assert solver.merged.swaps == 4
        assert sorted(pool.release(keep_lora=False)) == ["solver", "verifier"] and solver.llm is None
        assert pool.get("solver", a, lora_rank=8) is not solver  # built anew on the next request
    finally:
        pool.close()


class _FakeEngine:
    """A sampler as `EnginePool` sees it: built from options, pointed at a model, closable."""

    def __init__(self, model_dir, **options):
        self.model_dir, self.options, self.llm = model_dir, options, object()
        self.lora = bool(options.get("enable_lora"))

    def load_checkpoint(self, model_dir):
        self.model_dir = model_dir

    def can_serve(self, model_dir):
        return self.lora and self.llm is not None

    def view(self, model_dir):
        view = _FakeEngine(model_dir)
        view.shared = self
        return view

    def close(self):
        self.llm = None


def test_pool_builds_lora_engines_on_request_and_releases_only_what_training_would_rebuild(monkeypatch, tmp_path):
    import pipeline.engines as engines
    from pipeline.engines.pool import EnginePool

    monkeypatch.setattr(engines, "make_sampler", lambda engine, model_dir, **options: _FakeEngine(model_dir, **options))
    full = EnginePool("vllm", {"tensor_parallel_size": 1})
    a, b = full.get("solver", tmp_path), full.get("verifier", tmp_path)
    assert a is not b and a.options == {"tensor_parallel_size": 1}  # full weights: an engine per policy
    assert sorted(full.release()) == ["solver", "verifier"] and a.llm is None and b.llm is None
    assert full.get("solver", tmp_path) is not a  # a fresh engine after training

    lora = EnginePool("vllm", {"max_lora_rank": 16})
    s = lora.get("solver", tmp_path, lora_rank=32)
    v = lora.get("verifier", tmp_path, lora_rank=32)
    assert s.options == {"max_lora_rank": 32, "enable_lora": True} and v.shared is s
    assert lora.release() == [] and s.llm is not None
    assert sorted(lora.release(keep_lora=False)) == ["solver", "verifier"] and s.llm is None


def test_pool_counts_the_seconds_of_engine_starts_and_swaps(monkeypatch, tmp_path):
    import time as _time

    import pipeline.engines as engines
    from pipeline.engines.pool import EnginePool

    class Slow(_FakeEngine):
        def __init__(self, model_dir, **options):
            _time.sleep(0.05)
            super().__init__(model_dir, **options)

        def load_checkpoint(self, model_dir):
            _time.sleep(0.02)
            super().load_checkpoint(model_dir)

    monkeypatch.setattr(engines, "make_sampler", lambda engine, model_dir, **options: Slow(model_dir, **options))
    pool = EnginePool("vllm")
    pool.get("solver", tmp_path / "a")
    assert pool.start_seconds >= 0.05 and pool.swap_seconds == 0
    pool.get("solver", tmp_path / "a")  # the same checkpoint: nothing to do
    assert pool.swap_seconds == 0
    pool.get("solver", tmp_path / "b")
    assert 0.02 <= pool.swap_seconds < pool.start_seconds


def test_vllm_cpu_benchmark_names_a_bad_variant_or_a_missing_folder(tmp_path):
    """benchmarks/vllm_cpu.py refuses what it cannot run before starting any engine: exit 2 and
    the flag's value in one line, no traceback."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_cpu.py"
    task = tmp_path / "t.jsonl"
    task.write_text('{"question": "1+1?", "answer": "2"}\n')
    bad = subprocess.run([sys.executable, str(script), "--model-dir", str(tmp_path), "--task-file", str(task), "--variants", "bf16 eager glibc"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--variants 'bf16 eager glibc'" in bad.stderr and "Traceback" not in bad.stderr
    word = subprocess.run([sys.executable, str(script), "--model-dir", str(tmp_path), "--task-file", str(task), "--variants", "bfloat16 eager glibc nocache"],
                          capture_output=True, text=True, timeout=120)
    assert word.returncode == 2 and "--variants 'bfloat16 eager glibc nocache' is not" in word.stderr and "[noprefix]" in word.stderr
    missing = subprocess.run([sys.executable, str(script), "--model-dir", str(tmp_path / "nope"), "--task-file", str(task)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and f"--model-dir {tmp_path / 'nope'} does not exist" in missing.stderr


def test_batched_calls_benchmark_names_a_missing_folder_or_a_bad_count(tmp_path):
    """benchmarks/batched_calls.py refuses what it cannot run before starting an engine."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "batched_calls.py"
    task = tmp_path / "t.jsonl"
    task.write_text('{"question": "1+1?", "answer": "2"}\n')
    missing = subprocess.run([sys.executable, str(script), "--model-dir", str(tmp_path / "nope"), "--task-file", str(task)],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and f"--model-dir '{tmp_path / 'nope'}' does not exist" in missing.stderr and "Traceback" not in missing.stderr
    bad = subprocess.run([sys.executable, str(script), "--model-dir", str(tmp_path), "--task-file", str(task), "--repeats", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--repeats must be >= 1, got 0" in bad.stderr and "Traceback" not in bad.stderr
