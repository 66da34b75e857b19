"""Training steps of a randomly initialised Llama-shaped model: tokens/s and the share of the
device's dense bf16 peak they reach (model FLOP utilisation).

    .venv/bin/python benchmarks/train_step.py                                   # ~0.5B, bf16, CUDA
    .venv/bin/python benchmarks/train_step.py --size tiny --device cpu --batch 2 --seq 32

Nothing is loaded from disk or a hub: `transformers.LlamaForCausalLM` is built from a config with
random weights, in bf16 (weights, gradients and AdamW states alike), and trained on random token
ids (next-token loss) for one warm-up step and `--steps` timed steps. FLOPs per token, PaLM's
convention: 6 x the parameters of the matmuls (every Linear, the output head's included) + 12 x
layers x width x sequence length (attention's scores and values, forward and backward, the
causal mask not halving it). The peak is the vendor's dense bf16
figure for the device (`PEAKS`, looked up by its name), or `--peak-tflops`; on a CPU the bf16
matmul rate measured in the same run (benchmarks/roofline.py's `matmul_gflops`) stands in for it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = {
    # width 1024, 24 layers, MLP 4096, a 32,000-token vocabulary, untied head: 0.47B parameters
    "0.5b": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, vocab_size=32000),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256),
}

PEAKS = [
    # (words in torch.cuda.get_device_name, dense bf16 FLOP/s; NVIDIA's data sheets quote twice
    # these "with sparsity"). The first match wins, so the specific names come first.
    (("H100", "PCIe"), 756e12),
    (("H100", "NVL"), 835e12),
    (("H100",), 989.4e12),  # SXM5 (reported as "NVIDIA H100 80GB HBM3")
    (("H200",), 989.4e12),
    (("A100",), 312e12),
    (("L40S",), 362e12),
    (("L4",), 121e12),
]


def device_peak(name: str) -> float | None:
    """The dense bf16 peak FLOP/s of the device called `name`, or None when it is not known."""
    return next((peak for words, peak in PEAKS if all(w in name for w in words)), None)


def build_model(size: str, dtype, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**SIZES[size], max_position_embeddings=4096, tie_word_embeddings=False,
                         attn_implementation="sdpa")
    with torch.device(device):  # initialised where it trains: a 0.5B init on the CPU takes seconds
        model = LlamaForCausalLM(config)
    return model.to(dtype=dtype)


def matmul_params(model) -> int:
    """Parameters that take part in a matmul per token: every Linear's, the output head's included
    (the input embedding is a lookup, the norms elementwise)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def flops_per_token(model, seq: int) -> float:
    c = model.config
    return 6 * matmul_params(model) + 12 * c.num_hidden_layers * c.hidden_size * seq


def train_steps(model, batch: int, seq: int, steps: int, device: str) -> tuple[float, list[float]]:
    """Mean seconds of `steps` optimizer steps after one warm-up step, and every step's loss."""
    import torch

    fused = device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (steps + 1, batch, seq), generator=gen).to(device)
    losses, seconds = [], []
    for i in range(steps + 1):
        if fused:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=ids[i], labels=ids[i]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))  # a host sync, inside the timed step
        seconds.append(time.perf_counter() - t0)
    return sum(seconds[1:]) / steps, losses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up step")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak (default: looked up by name)")
    args = ap.parse_args(argv)
    for flag in ("batch", "seq", "steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})")
    torch.manual_seed(0)
    if args.device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(args.device))
        peak = args.peak_tflops * 1e12 if args.peak_tflops else device_peak(name)
        source = "given" if args.peak_tflops else "vendor's dense bf16 figure"
    else:
        from benchmarks.roofline import matmul_gflops

        name = f"CPU, {torch.get_num_threads()} threads"
        peak = args.peak_tflops * 1e12 if args.peak_tflops else matmul_gflops(torch.bfloat16, 1024, 3) * 1e9
        source = "given" if args.peak_tflops else "bf16 matmul measured now"
    model = build_model(args.size, torch.bfloat16, args.device)
    n = sum(p.numel() for p in model.parameters())
    step_s, losses = train_steps(model, args.batch, args.seq, args.steps, args.device)
    tokens = args.batch * args.seq
    achieved = tokens / step_s * flops_per_token(model, args.seq)
    print(f"device: {name}; model: Llama-shaped {args.size}, {n / 1e6:,.1f}M parameters, bf16, random init")
    print(f"step: {args.batch} x {args.seq} tokens, {step_s:.3f} s (mean of {args.steps} after 1 warm-up); "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    share = f"{100 * achieved / peak:.1f}% of {peak / 1e9:,.0f} GFLOP/s ({source})" if peak else "peak unknown for this device (--peak-tflops)"
    print(f"tokens/s: {tokens / step_s:,.0f}; {achieved / 1e9:,.1f} GFLOP/s = {share}")
    if args.device.startswith("cuda"):
        print(f"peak memory: {torch.cuda.max_memory_allocated(torch.device(args.device)) / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
