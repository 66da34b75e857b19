"""Peak memory of one training micro-batch (forward + backward), with the vocabulary projection in
one piece against chunked under the logits budget (`TrainConfig.logits_chunk_mb`), measured in
the same run.

The model is a random-weight Llama built in code with a real model's vocabulary (49,152 tokens,
SmolLM2's) and a small body, so the (rows x completion length x vocabulary) float32 logits
dominate, as they do for a 0.1-1B model with long completions. Each measurement runs in its own
process (peak resident memory of that process, `ru_maxrss`), after a baseline process that loads
the same model and batch without the forward pass.

    .venv/bin/python benchmarks/training_memory.py [--rows 32] [--completion 256] [--budget-mb 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(mode: str, rows: int, completion: int, budget_mb: float) -> dict:
    """Run in a child process: build the model and batch, then (unless mode is "baseline") one
    forward + backward of the completion logprobs; print the peak RSS in MB."""
    import random
    import resource

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path[:0] = [str(ROOT)]
    from pipeline.learn.trainer import collate, completion_logps, logit_elements

    torch.manual_seed(0)
    torch.set_num_threads(2)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=1024, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    rng = random.Random(0)
    batch = collate(
        [
            dict(
                step_id=f"s{i}", train_prompt_ids=[rng.randint(3, 49000) for _ in range(64)],
                completion_ids=[rng.randint(3, 49000) for _ in range(completion)], sampling_logprobs=[-1.0] * completion,
                advantage=1.0, sample_weight=1.0, reward=1.0, strategy="iid", agent_id="solver",
            )
            for i in range(rows)
        ]
    )
    if mode != "baseline":
        budget = None if mode == "whole" else logit_elements(budget_mb)
        logp = completion_logps(model, batch, 1.0, budget)
        logp.sum().backward()
    return {"mode": mode, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--budget-mb", type=float, default=256.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.completion, args.budget_mb)))
        return
    out = {}
    for mode in ("baseline", "whole", "chunked"):
        cmd = [sys.executable, __file__, "--child", mode, "--rows", str(args.rows), "--completion", str(args.completion), "--budget-mb", str(args.budget_mb)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])["peak_mb"]
    logits_mb = args.rows * args.completion * 49152 * 4 / 2**20
    print(f"micro-batch: {args.rows} rows x {args.completion} completion tokens x 49,152 vocabulary = {logits_mb:.0f} MB of float32 logits")
    print(f"baseline (model + batch, no forward): {out['baseline']:7.0f} MB peak")
    print(f"one projection:                       {out['whole']:7.0f} MB peak ({out['whole'] - out['baseline']:.0f} MB above baseline)")
    print(f"chunked under {args.budget_mb:g} MB:                {out['chunked']:7.0f} MB peak ({out['chunked'] - out['baseline']:.0f} MB above baseline)")
    print(f"ratio chunked/one projection, above baseline: {(out['chunked'] - out['baseline']) / (out['whole'] - out['baseline']):.1%}")


if __name__ == "__main__":
    main()
