"""bf16 against float32 on this CPU, and the padding of length-sorted micro-batches, measured in
the same run.

    .venv/bin/python benchmarks/dtype.py [--models default mid smollm2-135m] [--sections detect generate train agreement packing]
        [--repeats 3] [--threads N]

detect    what `pipeline.engines.config` sees: the /proc/cpuinfo bf16 flags, torch's oneDNN check,
          and what dtype="auto" resolves to for each model.
generate  the transformers engine's `generate` call (do_sample, top_k 0, scores kept, as
          `HFSampler` calls it) on `--gen-prompts` prompts of 40 tokens, `--gen-tokens` new tokens
          each (forced: no early EOS), weights in float32 against weights in bfloat16.
train     one optimizer step of `--train-rows` rows (40 prompt + 24 completion tokens) through the
          trainer's `batch_loss` + backward + AdamW, float32 against bf16 autocast over float32
          weights (what the trainer does under dtype "bfloat16").
packing   the padding of a minibatch's micro-batches in the shuffle's order against
          `MinibatchSortedSampler`'s (rows by length; rows whose loss is 0 last), for arithmetic-
          and GSM8K-like row lengths, and the forward + backward time of one minibatch on the
          default model: shuffled, sorted, sorted with the zero rows skipped (`trainable_rows`,
          the ppo preset's negative_weight 0 on half the rows).
agreement the per-token |log p_train - log q_sample| of the warm-started default model sampled by
          the HF engine and scored by the trainer, both in float32, then both in bf16 (not run by
          default: it builds the default model if it is not cached).

Models (random weights; speed does not depend on them): default = the embedded default
architecture (4 x 128, vocabulary 312, 1.1M parameters); mid = 6 x 384, vocabulary 49,152
(28.3M); smollm2-135m = SmolLM2-135M's shape (30 x 576, 9 heads / 3 KV heads, vocabulary 49,152,
134.5M). Runs alternate float32 / bf16 so background load hits both alike; the best of
`--repeats` is kept; ratios are bf16 speed over float32 speed (above 1: bf16 is faster). On a
loaded machine use --threads 1: two OpenMP threads on two busy cores stall each other and the
figures become noise. Measured (2-core AVX512-BF16 EPYC, load 3-5, --threads 1):
  generate default 1.14x, mid 1.54x, smollm2-135m 2.01x; train default 1.40x, mid 1.51x,
  smollm2-135m 1.96x; agreement float32 4.3e-7 / bf16 5.7e-3 per token (max 1.1e-1);
  padding arithmetic-like 34.3% -> 22.1%, GSM8K-like 49.6% -> 32.4%; one default-model minibatch
  1.19x faster sorted, 2.09x sorted with half its rows zero and skipped (gradients equal to 2e-9).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import torch  # noqa: E402

MODELS = {
    "default": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, vocab_size=312),
    "mid": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2, vocab_size=49152),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
}


def build(name: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**MODELS[name], max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float().eval()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def best_alternating(fns: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each function, runs alternating (one warm-up each first)."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def detect(models: list[str]) -> None:
    from pipeline.engines.config import BF16_CPU_FLAGS, BF16_MIN_PARAMETERS, _read_cpuinfo, _torch_cpu_bf16, cpu_has_bf16, resolve_dtype

    text = _read_cpuinfo() or ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    print(f"cpu flags {[f for f in BF16_CPU_FLAGS if f in flags] or 'none of ' + str(BF16_CPU_FLAGS)}; torch oneDNN bf16 {_torch_cpu_bf16()}; "
          f"cpu_has_bf16 {cpu_has_bf16()}; threshold {BF16_MIN_PARAMETERS:,} parameters")
    for name in models:
        n = n_params(build(name))
        print(f"  {name:>13} {n / 1e6:7.1f}M parameters: auto -> {resolve_dtype('auto', n)}")


def bench_generate(name: str, args) -> tuple[float, float]:
    base = build(name)
    models = {"float32": base, "bfloat16": build(name).to(torch.bfloat16)}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, MODELS[name]["vocab_size"], (args.gen_prompts, 40), generator=g)
    mask = torch.ones_like(ids)

    def run(model):
        def fn():
            with torch.inference_mode():
                torch.manual_seed(0)
                model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens, do_sample=True,
                    temperature=1.0, top_k=0, top_p=1.0, output_scores=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=1,
                )
        return fn

    best = best_alternating({k: run(m) for k, m in models.items()}, args.repeats)
    tokens = args.gen_prompts * args.gen_tokens
    return tokens / best["float32"], tokens / best["bfloat16"]


def synthetic_rows(n: int, prompt: int, completion: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "train_prompt_ids": [rng.randrange(2, vocab) for _ in range(prompt)],
            "completion_ids": [rng.randrange(2, vocab) for _ in range(completion)],
            "sampling_logprobs": [-5.0] * completion,
            "advantage": rng.choice([-1.0, 1.0]),
            "sample_weight": 1.0,
            "reward": 1.0,
            "strategy": "iid",
            "agent_id": "solver",
            "step_id": f"r{i}",
        }
        for i in range(n)
    ]


def bench_train(name: str, args) -> tuple[float, float, float]:
    from pipeline.config.loss import LossConfig, RatioConfig
    from pipeline.learn.trainer import batch_loss, collate

    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"))
    batch = collate(synthetic_rows(args.train_rows, 40, 24, MODELS[name]["vocab_size"]))
    tokens = int(batch["completion_mask"].sum())
    models, losses = {}, {}
    for dtype in ("float32", "bfloat16"):
        model = build(name).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        autocast = torch.bfloat16 if dtype == "bfloat16" else None

        def step(model=model, opt=opt, autocast=autocast, dtype=dtype):
            opt.zero_grad()
            loss = batch_loss(model, batch, cfg, 1.0, autocast_dtype=autocast).loss
            loss.backward()
            opt.step()
            losses[dtype] = float(loss.detach())

        models[dtype] = step
    best = best_alternating(models, args.repeats)
    return tokens / best["float32"], tokens / best["bfloat16"], abs(losses["bfloat16"] - losses["float32"])


def lengths_like(kind: str, n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, completion) tokens of `n` rows: arithmetic-like (the default task, budget 16) or
    GSM8K-like (chain of thought, budget 512; feedback prompts carry a first attempt)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if kind == "arithmetic":
            prompt = rng.randint(38, 70) + (rng.randint(8, 20) if rng.random() < 0.25 else 0)  # verifier / feedback rows are longer
            out.append((prompt, rng.randint(2, 16)))
        else:
            prompt = rng.randint(90, 260) + (rng.randint(60, 400) if rng.random() < 0.25 else 0)
            out.append((prompt, min(512, max(8, int(rng.lognormvariate(5.0, 0.6))))))
    return out


def packing(args) -> None:
    from pipeline.config.loss import LossConfig, RatioConfig
    from pipeline.learn.trainer import MinibatchSortedSampler, batch_loss, collate, minibatch_count, padding_fraction, row_sort_keys, select_rows, trainable_rows

    n, minibatch = 1024, 256
    for kind, micro in (("arithmetic", 64), ("gsm8k", 8)):
        lengths = lengths_like(kind, n, seed=1)
        shuffled = list(torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist())
        rng = random.Random(2)
        zero = [rng.random() < 0.5 for _ in range(n)]  # the ppo preset's negative rows: A w = 0
        sorted_all = list(MinibatchSortedSampler(shuffled, row_sort_keys(lengths), minibatch))
        sorted_skip = list(MinibatchSortedSampler(shuffled, row_sort_keys(lengths, [not z for z in zero]), minibatch))
        by_c = list(MinibatchSortedSampler(shuffled, [(-c, -p) for p, c in lengths], minibatch))
        # micro-batches of the sorted-with-skips order, each with its zero rows left out
        skip_real = skip_padded = 0
        for s in range(0, n, micro):
            rows = [lengths[i] for i in sorted_skip[s : s + micro] if not zero[i]]
            if rows:
                skip_real += sum(p + c for p, c in rows)
                skip_padded += len(rows) * (max(p for p, _ in rows) + max(c for _, c in rows))
        print(
            f"  {kind}-like ({n} rows, minibatch {minibatch}, micro-batch {micro}): padding {padding_fraction(lengths, shuffled, micro):.1%} shuffled -> "
            f"{padding_fraction(lengths, sorted_all, micro):.1%} sorted by prompt + completion (by completion only "
            f"{padding_fraction(lengths, by_c, micro):.1%}); half the rows zero and skipped: {skip_padded:,} positions forwarded instead "
            f"of {_positions(lengths, shuffled, micro):,} ({1 - skip_real / skip_padded:.1%} padding)"
        )

    # measured: one minibatch of arithmetic-like rows on the default model
    vocab = MODELS["default"]["vocab_size"]
    rng = random.Random(3)
    lengths = lengths_like("arithmetic", minibatch, seed=3)
    rows = []
    for i, (p, c) in enumerate(lengths):
        rows.append({
            "train_prompt_ids": [rng.randrange(2, vocab) for _ in range(p)], "completion_ids": [rng.randrange(2, vocab) for _ in range(c)],
            "sampling_logprobs": [-5.0] * c, "advantage": 1.0 if i % 2 == 0 else -1.0, "sample_weight": 1.0, "reward": 1.0,
            "strategy": "iid", "agent_id": "solver", "step_id": f"r{i}",
        })
    cfg = LossConfig(kind="ppo", ratio=RatioConfig(mode="none"), negative_weight=0.0)
    trainable = trainable_rows([r["advantage"] for r in rows], [1.0] * minibatch, [1.0] * minibatch, ["iid"] * minibatch, cfg)
    order_shuffled = list(range(minibatch))
    order_sorted = list(MinibatchSortedSampler(order_shuffled, row_sort_keys(lengths), minibatch))
    order_skip = list(MinibatchSortedSampler(order_shuffled, row_sort_keys(lengths, trainable), minibatch))
    micro = 64
    model = build("default").train()
    grads = {}

    def run(order, skip, label):
        def fn():
            model.zero_grad()
            batches = [collate([rows[i] for i in order[s : s + micro]]) for s in range(0, minibatch, micro)]
            total = minibatch_count(batches, cfg)
            for b in batches:
                if skip:
                    keep = [i for i, t in enumerate(trainable_rows(b["advantages"].tolist(), b["sample_weight"].tolist(), b["reward"].tolist(), b["strategy"], cfg)) if t]
                    b = select_rows(b, keep or [0])
                batch_loss(model, b, cfg, 1.0, denominator=total).loss.backward()
            grads[label] = torch.cat([p.grad.flatten() for p in model.parameters()]).clone()
        return fn

    best = best_alternating({"shuffled": run(order_shuffled, False, "shuffled"), "sorted": run(order_sorted, False, "sorted"),
                             "sorted+skip": run(order_skip, True, "sorted+skip")}, args.repeats)
    diff = max(float((grads[k] - grads["shuffled"]).abs().max()) for k in grads)
    print(f"  default model, {minibatch} arithmetic rows, micro-batch {micro}, forward+backward: shuffled {best['shuffled'] * 1e3:.0f} ms, "
          f"sorted {best['sorted'] * 1e3:.0f} ms ({best['shuffled'] / best['sorted']:.2f}x), sorted + zero rows skipped "
          f"{best['sorted+skip'] * 1e3:.0f} ms ({best['shuffled'] / best['sorted+skip']:.2f}x); largest gradient difference {diff:.1e}")


def agreement(args) -> None:
    """Sampled logprobs against the trainer's, on the warm-started default model: the HF engine
    in each dtype samples arithmetic prompts, the trainer scores the same completions (float32,
    or bf16 autocast); the per-token |log p_train - log q| is what the first step's ratios see."""
    from pipeline.engines.config import EngineConfig
    from pipeline.engines.hf import HFSampler
    from pipeline.workflows.math.model import default_model
    from pipeline.models import encode_prompt, load_model
    from pipeline.learn.trainer import collate, completion_logps

    model_dir = default_model()
    rng = random.Random(0)
    for dtype in ("float32", "bfloat16"):
        sampler = HFSampler(model_dir, EngineConfig(dtype=dtype))
        prompts = [encode_prompt(sampler.tokenizer, [{"role": "user", "content": f"{rng.randint(10, 99)}+{rng.randint(10, 99)}="}]) for _ in range(32)]
        groups = sampler.generate(prompts, n=4, temperature=1.0, max_tokens=16, seed=0)
        rows = [
            {"train_prompt_ids": p, "completion_ids": x.token_ids, "sampling_logprobs": x.logprobs, "advantage": 0.0, "sample_weight": 1.0,
             "strategy": "iid", "agent_id": "solver", "step_id": f"{i}-{j}"}
            for i, (p, g) in enumerate(zip(prompts, groups)) for j, x in enumerate(g)
        ]
        batch = collate(rows, sampler.pad_id)
        trainer_model = load_model(model_dir)
        with torch.no_grad(), (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else torch.autocast("cpu", enabled=False)):
            logp = completion_logps(trainer_model, batch, 1.0).float()
        d = ((logp - batch["sampling_logprobs"]) * batch["completion_mask"]).abs()
        n = float(batch["completion_mask"].sum())
        seq = ((logp - batch["sampling_logprobs"]) * batch["completion_mask"]).sum(1).abs()
        print(f"  default model, engine {dtype:>8} / trainer {'bf16 autocast' if dtype == 'bfloat16' else 'float32':>13}: per-token |log p - log q| "
              f"mean {float(d.sum()) / n:.1e}, max {float(d.max()):.1e}; per-row |sum log ratio| max {float(seq.max()):.1e} ({len(rows)} rows)")
        sampler.close()


def _positions(lengths, order, micro) -> int:
    return sum(len(order[s : s + micro]) * (max(lengths[i][0] for i in order[s : s + micro]) + max(lengths[i][1] for i in order[s : s + micro]))
               for s in range(0, len(order), micro))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["default", "smollm2-135m"], choices=list(MODELS))
    ap.add_argument("--sections", nargs="+", default=["detect", "generate", "train", "packing"], choices=["detect", "generate", "train", "agreement", "packing"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gen-prompts", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--train-rows", type=int, default=16)
    args = ap.parse_args(argv)
    from pipeline.learn.trainer import set_threads

    print(f"torch {torch.__version__}, {set_threads(args.threads)} threads")
    if "detect" in args.sections:
        detect(args.models)
    for name in args.models:
        if "generate" in args.sections:
            f32, bf16 = bench_generate(name, args)
            print(f"generate {name:>13}: float32 {f32:8.1f} tokens/s, bf16 {bf16:8.1f} tokens/s, bf16/fp32 {bf16 / f32:.2f}x")
        if "train" in args.sections:
            f32, bf16, dloss = bench_train(name, args)
            print(f"train    {name:>13}: float32 {f32:8.1f} tokens/s, bf16 autocast {bf16:8.1f} tokens/s, bf16/fp32 {bf16 / f32:.2f}x "
                  f"(loss differs by {dloss:.1e})")
    if "agreement" in args.sections:
        print("sampling/training agreement:")
        agreement(args)
    if "packing" in args.sections:
        print("packing:")
        packing(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
