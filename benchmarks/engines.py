"""Rollout throughput of the vLLM and transformers engines, side by side in one run.

Measures completion tokens per second at 64 prompts x 8 samples (T=1) on
1. the default model (warm-started, ~1.1M parameters; arithmetic prompts, short answers), and
2. a larger Llama with random weights and the same tokenizer (~43M parameters by default),
   built in a temporary folder; its completions run to `--max-tokens-large`.
Each engine gets one untimed warm-up call (vLLM compiles a kernel on first use), then the best
of `--repeats` timed calls. Prints a markdown table with the vLLM/HF ratio.

With `--model-dir DIR --task-file FILE` it measures a real model instead (e.g. SmolLM2-135M
imported by `maxit model import`, on GSM8K questions rendered with the file task's
chain-of-thought prompt), at `--max-tokens-real` tokens per completion:

    python benchmarks/engines.py [--large-layers 6 --large-width 768]
    python benchmarks/engines.py --model-dir models/smollm2-135m-instruct \
        --task-file data/gsm8k/train.jsonl --prompts 16 --samples 4 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(sampler, prompts, n, max_tokens, repeats):
    sampler.generate(prompts[:4], n=2, temperature=1.0, max_tokens=max_tokens, seed=123)  # warm-up
    best = None
    for r in range(repeats):
        t0 = time.perf_counter()
        groups = sampler.generate(prompts, n=n, temperature=1.0, max_tokens=max_tokens, seed=r)
        dt = time.perf_counter() - t0
        tokens = sum(len(s.token_ids) for g in groups for s in g)
        if best is None or tokens / dt > best[0] / best[1]:
            best = (tokens, dt)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8, help="default model (answers are <= 5 tokens)")
    ap.add_argument("--max-tokens-large", type=int, default=16, help="larger random model")
    ap.add_argument("--large-layers", type=int, default=6)
    ap.add_argument("--large-width", type=int, default=768)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")))
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--model-dir", help="measure this local HF model folder (with --task-file) instead of the default and large models")
    ap.add_argument("--task-file", help="problems file whose questions are the prompts (with --model-dir)")
    ap.add_argument("--max-tokens-real", type=int, default=64, help="completion budget with --model-dir")
    args = ap.parse_args(argv)
    if bool(args.model_dir) != bool(args.task_file):
        ap.error("--model-dir and --task-file go together")

    import torch

    torch.set_num_threads(args.threads)
    from pipeline.engines import make_sampler, vllm_available
    from pipeline.models import count_parameters, encode_prompt, load_model, load_tokenizer
    from pipeline.workflows.math.model import default_model
    from pipeline.models.build import ModelConfig, build_untrained_model
    from pipeline.tasks import ArithmeticTask

    tmp = tempfile.TemporaryDirectory(prefix="maxit-bench-")
    if args.model_dir:
        from pipeline.tasks import build_task

        tok = load_tokenizer(args.model_dir)
        task = build_task(task_file=args.task_file)
        prompts = [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("heldout", args.prompts, seed=0)]
        models = [(Path(args.model_dir).name, Path(args.model_dir), args.max_tokens_real)]
    else:
        default_dir = default_model()
        tok = load_tokenizer(default_dir)
        task = ArithmeticTask()
        prompts = [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("heldout", args.prompts, seed=0)]
        models = [("default", default_dir, args.max_tokens)]
    if not args.skip_large and not args.model_dir:
        cfg = ModelConfig(num_layers=args.large_layers, hidden_size=args.large_width,
                          num_heads=args.large_width // 64, intermediate_size=(8 * args.large_width) // 3 // 64 * 64)
        models.append(("large (random)", build_untrained_model(cfg, tok, Path(tmp.name) / "large"), args.max_tokens_large))
    engines = ["hf"] + (["vllm"] if vllm_available() else [])
    rows = []
    vllm_sampler = None
    for name, model_dir, max_tokens in models:
        params = count_parameters(load_model(model_dir))
        result = {}
        for engine in engines:
            if engine == "vllm":
                t0 = time.perf_counter()
                if vllm_sampler is None:
                    vllm_sampler = make_sampler("vllm", model_dir)
                else:
                    vllm_sampler.load_checkpoint(model_dir)
                start = time.perf_counter() - t0
                sampler = vllm_sampler
            else:
                t0 = time.perf_counter()
                sampler = make_sampler("hf", model_dir, threads=args.threads)
                start = time.perf_counter() - t0
            tokens, dt = measure(sampler, prompts, args.samples, max_tokens, args.repeats)
            result[engine] = tokens / dt
            rows.append((name, params, engine, tokens, dt, tokens / dt, start))
            print(f"{name} {engine}: {tokens} tokens in {dt:.2f}s = {tokens / dt:.0f} tokens/s (start {start:.1f}s)", flush=True)
        if "vllm" in result:
            rows.append((name, params, "vllm/hf", None, None, result["vllm"] / result["hf"], None))
    if vllm_sampler is not None:
        vllm_sampler.close()

    print(f"\n{args.prompts} prompts x {args.samples} samples, T=1, fp32, {args.threads} threads\n")
    print("| model | parameters | engine | completion tokens | seconds | tokens/s | engine start (s) |")
    print("|---|---|---|---|---|---|---|")
    for name, params, engine, tokens, dt, tps, start in rows:
        if tokens is None:
            print(f"| {name} | {params / 1e6:.1f}M | **vLLM / HF** | | | **{tps:.2f}x** | |")
        else:
            print(f"| {name} | {params / 1e6:.1f}M | {engine} | {tokens} | {dt:.2f} | {tps:.0f} | {start:.1f} |")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
