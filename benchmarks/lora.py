"""LoRA rollouts against the base model's on vLLM, for the same requests, in one run.

Two policies, each a LoRA adapter on one base model (`--separate-policies`), share one engine.
A pass is what a round's turns ask of it: `--turns` times, the first policy samples its half of
the prompts, then the second policy its half. The same calls run on
1. base:     an engine on the base model, no adapters (the time to match);
2. requests: an engine built with LoRA, each call a vLLM LoRA request (vLLM's own LoRA path);
3. merged:   an engine without LoRA that writes the asked-for adapter's merged weights into its
             layers before a call (`EngineConfig.lora_sampling="merged"`, the CPU default).
Adapters: rank --rank (alpha 2 x rank) on maxit's LoRA target modules, random weights scaled by
--scale so the samples stay close to the base model's (similar lengths). Each engine gets one
untimed warm-up pass, then the best of --repeats timed passes; engine starts are printed apart.
Figures: seconds per pass, completion tokens, seconds per 1,000 completion tokens, and the
ratio to the base engine of both (the goal: LoRA within 1.5x of the base).

    .venv/bin/python benchmarks/lora.py                                    # SmolLM2-135M (imported), word problems
    .venv/bin/python benchmarks/lora.py --modes base merged --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_adapter(base_dir: Path, out_dir: Path, seed: int, rank: int, scale: float) -> Path:
    """A peft LoRA checkpoint on `base_dir` with random A and B (B is zero at peft's init, which
    would make the adapter the base model), as maxit saves one."""
    import torch
    from peft import LoraConfig, get_peft_model

    from pipeline.models import load_model, load_tokenizer
    from pipeline.config.train import LoraSettings

    torch.manual_seed(seed)
    model = get_peft_model(
        load_model(base_dir),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(LoraSettings().target_modules), init_lora_weights=False),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(scale)
    model.peft_config["default"].base_model_name_or_path = str(base_dir)
    model.save_pretrained(out_dir)
    load_tokenizer(base_dir).save_pretrained(out_dir)
    return out_dir


def run_pass(sampler, halves, lora, n, max_tokens, turns, seed):
    """One pass; `lora`: the two policies' requests (None for both on the base engine)."""
    tokens = 0
    t0 = time.perf_counter()
    for t in range(turns):
        for half, request in zip(halves, lora):
            groups = sampler.generate(half, n, 1.0, max_tokens, seed * 100 + t, lora_request=request)
            tokens += sum(len(s.token_ids) for g in groups for s in g)
    return time.perf_counter() - t0, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    ap.add_argument("--task-file", help="problems whose questions are the prompts (default: generated word problems)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per pass (half per policy)")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--scale", type=float, default=0.05, help="factor on the adapters' random weights")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=["base", "requests", "merged"], choices=["base", "requests", "merged"])
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args(argv)
    if not (args.model_dir / "config.json").is_file():
        ap.error(f"--model-dir {args.model_dir}: no model folder (import SmolLM2 with `maxit model import`, see the README)")

    from pipeline.engines.vllm import VLLMSampler
    from pipeline.engines.config import EngineConfig
    from pipeline.models import encode_prompt, load_tokenizer
    from pipeline.tasks import build_task

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        task_file = args.task_file
        if task_file is None:
            from pipeline.tasks.words import write_word_problems

            task_file = str(write_word_problems(tmp / "words.jsonl", 200, seed=0))
        task = build_task(task_file=task_file)
        tok = load_tokenizer(args.model_dir)
        prompts = [encode_prompt(tok, task.solver_messages(p)) for p in task.problems("heldout", args.prompts, seed=0)]
        halves = [prompts[: len(prompts) // 2], prompts[len(prompts) // 2 :]]
        adapters = [make_adapter(args.model_dir, tmp / f"adapter{i}", seed=i, rank=args.rank, scale=args.scale) for i in (1, 2)]
        print(f"{len(prompts)} prompts of {sum(map(len, prompts)) / len(prompts):.0f} tokens on average, x {args.samples} samples, "
              f"{args.max_tokens} tokens, {args.turns} turns per pass; adapters rank {args.rank}")
        results = {}
        for mode in args.modes:
            config = EngineConfig(dtype=args.dtype, enable_lora=mode != "base", lora_sampling="merged" if mode == "merged" else "requests", max_lora_rank=args.rank)
            t0 = time.perf_counter()
            sampler = VLLMSampler(args.model_dir, config)
            start = time.perf_counter() - t0
            lora = [None, None] if mode == "base" else [sampler.lora_request(a) for a in adapters]
            run_pass(sampler, [h[:2] for h in halves], lora, 1, 8, args.turns, seed=99)  # warm-up
            best = min((run_pass(sampler, halves, lora, args.samples, args.max_tokens, args.turns, seed=r) for r in range(args.repeats)), key=lambda x: x[0] / max(x[1], 1))
            swaps = f", {sampler.merged.swaps} swaps in {sampler.merged.swap_seconds:.1f} s" if sampler.merged is not None else ""
            results[mode] = best
            print(f"{mode:9s} engine start {start:5.1f} s; pass {best[0]:6.1f} s, {best[1]} tokens, {1000 * best[0] / max(best[1], 1):6.2f} s per 1k tokens ({sampler.dtype}{swaps})", flush=True)
            sampler.close()
            del sampler
            gc.collect()
        if "base" in results:
            b_sec, b_tok = results["base"]
            for mode, (sec, tok_) in results.items():
                if mode != "base":
                    print(f"{mode} / base: {sec / b_sec:.2f}x the seconds per pass, {(sec / max(tok_, 1)) / (b_sec / max(b_tok, 1)):.2f}x the seconds per token")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
