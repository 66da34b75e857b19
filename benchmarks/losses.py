"""What each training loss costs per completion token, against the rs loss in the same run.

All losses train the same rows of one synthetic training view (arithmetic-sized prompts and
completions, half of them rewarded, advantages +-1) on the same 0.66M-parameter model, one epoch
each, through the maxit trainer (`train_policy`), after one untimed warm-up run. Runs alternate
(rs, ppo, is, ppo + proximal anchor, rs, ...) so background load hits all alike; the best of each is reported, as completion
tokens per second and as a ratio to rs. Every loss runs the same forward and backward pass over
every row (rs masks the unrewarded rows out of its mean), so the ratios show the loss arithmetic
and, for the proximal anchor, its extra forward pass over the round's rows before the first step.
How many rows a round trains is a different matter: rs trains only the right rows, the PG losses
every row with a nonzero advantage (docs/results/ablation-math.md: optimizer steps per run).

    .venv/bin/python benchmarks/losses.py [--rows 1024] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from pipeline.config.loss import LossConfig  # noqa: E402

from pipeline.config.train import TrainConfig  # noqa: E402
from pipeline.learn.trainer import train_policy  # noqa: E402
from training import bench_parser, bench_setup  # noqa: E402  (benchmarks/training.py)

LOSSES = {
    "rs": LossConfig(kind="rs"),
    "ppo": LossConfig(kind="ppo"),
    "is": LossConfig(kind="is"),
    "ppo, proximal anchor": LossConfig(kind="ppo", anchor="proximal"),
}


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    with bench_setup(args, half_rewarded=True) as (threads, tmp, init_dir, tok, view):
        base = TrainConfig(
            epochs=1, minibatch_size=64, micro_batch_size=64, report_to="none", num_threads=threads, loss=LossConfig(kind="ppo"),
            micro_batch_tokens=None, gradient_checkpointing=False,
        )
        train_policy(view, "shared", init_dir, tmp / "warm-up", base)  # one-time costs (imports, first allocations) out of the timings
        best: dict[str, float] = {}
        for r in range(args.repeats):
            for i, (name, loss) in enumerate(LOSSES.items()):
                result = train_policy(view, "shared", init_dir, tmp / f"ckpt-{r}-{i}", replace(base, loss=loss))
                best[name] = max(best.get(name, 0.0), result.tokens_per_second)
                print(f"repeat {r}: {name:22s} {result.tokens_per_second:7.0f} completion tokens/s ({result.train_seconds:.2f} s, {result.steps} steps)", flush=True)
        print(f"\nrows {args.rows}, threads {threads}, best of {args.repeats}")
        print(f"{'loss':22s} {'tokens/s':>9s}  x rs")
        for name, rate in best.items():
            print(f"{name:22s} {rate:9.0f}  {rate / best['rs']:.2f}")


if __name__ == "__main__":
    main()
