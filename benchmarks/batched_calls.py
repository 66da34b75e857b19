"""Independent generate calls as one vLLM batch (`pipeline.types.generate_calls`) against the
same calls one at a time, on one engine, in one run.

Two jobs of the GSM8K acceptance command (`maxit run` with the README's flags), each run both
ways on the same engine, alternating, best of `--repeats`:
  rollouts    round 0's rollouts of the default algorithm (iid, prompt_aug, feedback, tree;
              `--problems` x `--samples`, Solver and Verifier, up to `--max-tokens` tokens): an
              agent step's requests of different counts (the iid/feedback/tree prompts shared
              by a problem's samples, the hinted ones alone) are separate calls one at a time
  evaluation  the math evaluation of the starting model (`--eval-problems` held-out problems;
              the Solver's sampled and greedy passes, the Verifier's sampled and greedy verdicts)
"One at a time" is the same engine behind a wrapper without `generate_calls`, which is how any
such sampler is run. Each sample has its own seed either way, so the two
draw the same requests (in bfloat16 a batch's shape can still change a logit's last bits, and
with it a sampled token now and then: the tokens column shows how far the work differs).

    .venv/bin/python benchmarks/batched_calls.py --model-dir models/smollm2-135m-instruct \\
        --task-file data/gsm8k/train.jsonl
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Counting:
    """The engine, counting the completion tokens of every call; with `batched` False it has no
    `generate_calls`, so every call runs on its own (how any such sampler is run)."""

    def __init__(self, sampler, batched: bool):
        self._s, self.tokens = sampler, 0
        self.engine, self.model_dir, self.tokenizer = sampler.engine, sampler.model_dir, sampler.tokenizer
        if batched:
            self.generate_calls = self._calls

    @property
    def model_version(self) -> str:
        return self._s.model_version

    def _count(self, groups):
        self.tokens += sum(len(s.token_ids) for g in groups for s in g)
        return groups

    def generate(self, *args):
        return self._count(self._s.generate(*args))

    def _calls(self, calls):
        return [self._count(groups) for groups in self._s.generate_calls(calls)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="a local HF model folder (e.g. the imported SmolLM2-135M)")
    p.add_argument("--task-file", required=True, help="a JSONL/Parquet file of problems with worked examples (GSM8K)")
    p.add_argument("--problems", type=int, default=8)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--eval-problems", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = p.parse_args(argv)
    for name in ("model_dir", "task_file"):
        if not Path(getattr(args, name)).exists():
            print(f"batched_calls: --{name.replace('_', '-')} {getattr(args, name)!r} does not exist", file=sys.stderr)
            return 2
    for name in ("problems", "samples", "max_tokens", "eval_problems", "repeats"):
        if getattr(args, name) < 1:
            print(f"batched_calls: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2

    from pipeline.config import RunConfig
    from pipeline.engines import make_sampler
    from pipeline.rollout.evaluation import EvalConfig
    from pipeline.run.context import build_workflow, run_strategies
    from pipeline.run.problems import draw_problems
    from pipeline.run.rounds import rollout_config, sample_steps
    from pipeline.workflows.math import evaluate_team

    config = RunConfig(task_file=args.task_file, problems=args.problems, samples=args.samples, max_tokens=args.max_tokens)
    workflow = build_workflow(config)
    strategies = list(run_strategies(config, workflow).values())
    problems = draw_problems(workflow, args.problems, config.seed, 0)
    engine = make_sampler("vllm", args.model_dir, dtype=args.dtype)
    print(f"engine: vLLM, {engine.dtype}; rollouts: {args.problems} problems x {args.samples} samples, strategies "
          f"{' '.join(s.strategy_id for s in strategies)}; evaluation: {args.eval_problems} problems", flush=True)

    def rollouts(sampler):
        sample_steps(problems, workflow, strategies, {"shared": sampler}, rollout_config(config, workflow, 0, config.seed))

    def evaluation(sampler):
        cfg = EvalConfig(problems=args.eval_problems, samples=2, max_tokens=args.max_tokens)
        evaluate_team(workflow.task, workflow.agents, {"shared": sampler}, {"shared": engine.tokenizer}, cfg, round_=-1)

    engine.generate([engine.tokenizer.encode("warm up")], 2, 1.0, 8, 0)
    rows = []
    for job, fn in (("rollouts", rollouts), ("evaluation", evaluation)):
        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.repeats):
            for mode in ("one at a time", "batched"):
                sampler = Counting(engine, batched=mode == "batched")
                t = time.perf_counter()
                fn(sampler)
                seconds = time.perf_counter() - t
                if mode not in best or seconds < best[mode][0]:
                    best[mode] = (seconds, sampler.tokens)
        base = best["one at a time"][0]
        rows += [(job, mode, s, tok, base / s) for mode, (s, tok) in best.items()]
    print(f"\n| job | calls | seconds (best of {args.repeats}) | completion tokens | tokens/s | speed vs one at a time (wall) |")
    print("|---|---|---:|---:|---:|---:|")
    for job, mode, s, tok, ratio in rows:
        print(f"| {job} | {mode} | {s:.1f} | {tok:,} | {tok / s:.0f} | {ratio:.2f}x |")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
