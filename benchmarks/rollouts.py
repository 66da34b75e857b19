"""Throughput of `run_rollouts` against the raw engine.

One run: (1) a mixed-strategy two-agent round (`iid`, `prompt_aug`, `feedback`, `tree`) on the
default task and model; (2) the same engine generating the same number of completions from the
same prompts (every row's `prompt_ids`, n=1) in ONE `generate` call, same temperature and
budget, so prompt lengths and token counts match. Prints both completion-token throughputs and
their ratio, and how much of the round was spent inside the engine; the goal is a ratio >= 0.8
(the agent steps run one after another, and orchestration, prompt rendering, scoring and table
building cost less than a fifth of the engine's own time).

    .venv/bin/python benchmarks/rollouts.py --engine hf --problems 32 --samples 4
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
    from pipeline.workflows.math import MathWorkflow
    from pipeline.engines import make_sampler
    from pipeline.workflows.math.model import default_model
    from pipeline.models import load_tokenizer
    from pipeline.models.chat import encode_prompt
    from pipeline.rollout.loop import run_rollouts
    from pipeline.rollout.sampling import RolloutConfig
    from pipeline.strategies import make_strategy
    from pipeline.tasks import make_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="hf", choices=["auto", "hf", "vllm"])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="alternate round/raw this many times, keep the best of each")
    args = ap.parse_args(argv)

    model_dir = args.model_dir or default_model()
    tokenizer = load_tokenizer(model_dir)
    sampler = make_sampler(args.engine, model_dir)
    task = make_task()
    problems = task.problems("train", args.problems, 0)
    strategies = [make_strategy(s, group_size=args.samples) for s in ("iid", "prompt_aug", "feedback", "tree")]
    config = RolloutConfig(max_tokens=args.max_tokens, alpha=1.0, local_weight=1.0)
    prompts = [encode_prompt(tokenizer, task.solver_messages(p)) for p in problems]

    engine_seconds = [0.0]
    generate = sampler.generate

    def timed_generate(*a, **k):
        t = time.perf_counter()
        try:
            return generate(*a, **k)
        finally:
            engine_seconds[0] += time.perf_counter() - t

    sampler.generate = timed_generate

    # warm-up (engine start, kernels, first imports)
    run_rollouts(problems[:2], MathWorkflow(task), strategies, sampler, config, tokenizer=tokenizer)
    sampler.generate(prompts[:2], 2, config.temperature, args.max_tokens, 0)

    best_round = best_raw = 0.0
    for rep in range(args.repeats):
        engine_seconds[0] = 0.0
        t0 = time.perf_counter()
        table = run_rollouts(problems, MathWorkflow(task), strategies, sampler, RolloutConfig(max_tokens=args.max_tokens, seed=rep, alpha=1.0, local_weight=1.0), tokenizer=tokenizer)
        t_round = time.perf_counter() - t0
        round_tokens = sum(table.column("completion_ids").combine_chunks().value_lengths().to_pylist())
        calls = len(set(table.column("step").to_pylist()))

        in_engine = engine_seconds[0]
        same_prompts = table.column("prompt_ids").to_pylist()
        t0 = time.perf_counter()
        out = generate(same_prompts, 1, config.temperature, args.max_tokens, rep)
        t_raw = time.perf_counter() - t0
        raw_tokens = sum(len(s.token_ids) for row in out for s in row)

        tps_round, tps_raw = round_tokens / t_round, raw_tokens / t_raw
        best_round, best_raw = max(best_round, tps_round), max(best_raw, tps_raw)
        print(
            f"[{rep}] run_rollouts: {table.num_rows} rows, {calls} engine calls, {round_tokens} tokens in {t_round:.2f}s = {tps_round:.0f} tok/s | "
            f"{in_engine / t_round:.0%} in the engine | raw generate: {len(same_prompts)} prompts, {raw_tokens} tokens in {t_raw:.2f}s = {tps_raw:.0f} tok/s | ratio {tps_round / tps_raw:.2f}"
        )
    sampler.close()
    print(f"engine={sampler.engine} best run_rollouts {best_round:.0f} tok/s, best raw {best_raw:.0f} tok/s, ratio {best_round / best_raw:.2f} (goal >= 0.80)")


if __name__ == "__main__":
    main()
