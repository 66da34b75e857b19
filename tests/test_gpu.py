"""The GPU check: scripts/gpu_check.sh, benchmarks/train_step.py and the GPU-marked tests.

The `gpu` tests need a CUDA device: `scripts/gpu_check.sh` runs them (`pytest -m gpu`) on a GPU
machine; elsewhere they skip, saying why. The rest runs everywhere: the check's skipping mode and
its guard, and the benchmark's FLOP count and peak table on the CPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import require_vllm

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scripts" / "gpu_check.sh"

_spec = importlib.util.spec_from_file_location("train_step", ROOT / "benchmarks" / "train_step.py")
ts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: scripts/gpu_check.sh runs these on a GPU machine")


def run_check(out: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHECK), str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env}, timeout=300)


def test_gpu_check_without_a_gpu_says_so_and_skips_everything(tmp_path):
    done = run_check(tmp_path / "out", MAXIT_GPU="0")
    assert done.returncode == 0, done.stderr
    assert "no NVIDIA GPU" in done.stdout
    for part in ("GPU-marked tests", "main job on CUDA", "bf16 training step", "--train-processes 2"):
        assert part in done.stdout, part
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the guard of a machine whose torch sees no CUDA device")
def test_gpu_check_stops_when_torch_sees_no_cuda(tmp_path):
    """nvidia-smi lists a GPU but torch cannot use it (a +cpu torch, or a driver too old)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = run_check(tmp_path / "out", MAXIT_GPU="", PATH=f"{bin_dir}:{os.environ['PATH']}")
    assert done.returncode == 1
    assert "torch sees no CUDA device" in done.stderr and "available False" in done.stdout
    assert not (tmp_path / "out" / "main").exists()


def test_flops_per_token_counts_every_matmul_and_attention():
    model = ts.build_model("tiny", torch.float32, "cpu")
    c = ts.SIZES["tiny"]
    h, f, v, layers = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    # per layer q, k, v, o (h x h each: as many KV heads as heads) and gate, up, down (h x f); the head (h x v)
    matmul = layers * (4 * h * h + 3 * h * f) + h * v
    assert ts.matmul_params(model) == matmul
    assert ts.flops_per_token(model, 32) == 6 * matmul + 12 * layers * h * 32


def test_the_half_billion_model_is_half_a_billion():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**ts.SIZES["0.5b"], tie_word_embeddings=False))
    assert 0.4e9 < sum(p.numel() for p in model.parameters()) < 0.6e9


def test_device_peaks_are_the_dense_bf16_figures():
    assert ts.device_peak("NVIDIA H100 80GB HBM3") == 989.4e12  # SXM
    assert ts.device_peak("NVIDIA H100 PCIe") == 756e12
    assert ts.device_peak("NVIDIA H100 NVL") == 835e12
    assert ts.device_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert ts.device_peak("NVIDIA L4") == 121e12 and ts.device_peak("NVIDIA L40S") == 362e12
    assert ts.device_peak("Tesla T4") is None


def test_train_steps_learn_on_the_cpu():
    torch.manual_seed(0)
    model = ts.build_model("tiny", torch.bfloat16, "cpu")
    seconds, losses = ts.train_steps(model, batch=2, seq=16, steps=3, device="cpu")
    assert seconds > 0 and len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(ts.SIZES["tiny"]["vocab_size"]), rel=0.1)  # random init: uniform


def test_train_step_refuses_bad_arguments():
    for argv, flag in ((["--batch", "0"], "--batch"), (["--seq", "-1"], "--seq")):
        done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_step.py"), "--device", "cpu", *argv],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 2 and flag in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- on a CUDA device


@pytest.mark.gpu
@needs_cuda
def test_cuda_torch_computes_bf16_like_the_cpu():
    assert torch.version.cuda and "+cpu" not in torch.__version__
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    on_gpu = (a.cuda().bfloat16() @ b.cuda().bfloat16()).float().cpu()
    assert torch.allclose(on_gpu, a @ b, atol=0.5, rtol=0.05)
    from pipeline.engines.config import resolve_dtype

    assert resolve_dtype("auto", cuda=torch.cuda.is_available()) == "bfloat16"


@pytest.mark.gpu
@needs_cuda
def test_a_llama_trains_in_bf16_on_cuda():
    torch.manual_seed(0)
    model = ts.build_model("tiny", torch.bfloat16, "cuda")
    _, losses = ts.train_steps(model, batch=4, seq=64, steps=3, device="cuda")
    assert all(math.isfinite(x) for x in losses)
    assert torch.cuda.max_memory_allocated() > 0


@pytest.mark.gpu
@needs_cuda
def test_vllm_samples_on_cuda_reproducibly(tiny_model_dir):
    require_vllm()  # scripts/setup.sh installs vllm on a GPU machine; gpu_check.sh requires it where it imports
    from pipeline.engines import make_sampler
    from pipeline.models import encode_prompt, load_tokenizer
    from pipeline.tasks import ArithmeticTask

    tok, task = load_tokenizer(tiny_model_dir), ArithmeticTask()
    prompts = [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("train", 4, seed=0)]
    sampler = make_sampler("vllm", tiny_model_dir)
    try:
        first = sampler.generate(prompts, n=2, temperature=1.0, max_tokens=16, seed=3)
        again = sampler.generate(prompts, n=2, temperature=1.0, max_tokens=16, seed=3)
    finally:
        sampler.close()
    assert [[s.token_ids for s in g] for g in first] == [[s.token_ids for s in g] for g in again]
    for group in first:
        assert len(group) == 2
        for s in group:
            assert s.token_ids and len(s.logprobs) == len(s.token_ids) and all(x <= 0 for x in s.logprobs)
