"""How close each stage of a run comes to this machine's matmul rate.

Measures the GFLOP/s of a square float32 and bfloat16 matmul (`--size`, `--threads`, best of
`--repeats`), then for each store given reads every round's seconds per stage (`timings`) and the
tokens the stage processed, and prints tokens/s, GFLOP/s and the share of each dtype's matmul rate:
- rollouts: every agent call's prompt + completion tokens (`steps`), at 2 x parameters FLOPs a
  token (the forward pass). Prompt tokens served from the prefix cache are counted too, so this is
  an upper bound of the work done;
- training: the prompt + completion tokens of the training-view rows the trainer forwards (those
  whose loss can be nonzero under the run's loss: `trainer.trainable_rows`) times the epochs, at
  6 x parameters a token (forward, and backward for activations and weights); a LoRA run's backward
  skips the frozen weights' gradients, so it is counted at 4 x. Gradient checkpointing's second
  forward is not counted (it is work the stage chooses to redo).
The evaluation's calls are not stored, so it has no token count here.

    .venv/bin/python benchmarks/roofline.py --stores runs/acc-auto runs/acc-f32
    .venv/bin/python benchmarks/roofline.py --matmul-only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_gflops(dtype, size: int, repeats: int) -> float:
    import torch

    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b  # warm-up (oneDNN picks its kernel)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9


def store_rows(store: Path) -> list[dict]:
    """Per round and stage: seconds, tokens, FLOPs per token, and the dtype the run computed in."""
    import polars as pl

    from pipeline.engines.config import model_parameters, resolve_dtype
    from pipeline.run.experiment_record import read_experiment, stored_settings
    from pipeline.learn.trainer import trainable_rows

    settings = stored_settings(read_experiment(store))
    config = settings.run_config()
    model_dir = settings.model_dir
    if not model_dir:
        from pipeline.workflows.math.model import default_model

        model_dir = default_model()
    model_dir = next((p for p in (Path(model_dir), store.parent.parent / model_dir) if (p / "config.json").is_file()), Path(model_dir))
    params = model_parameters(model_dir)
    dtype = resolve_dtype(settings.dtype, params)
    lora = settings.lora
    rows = []
    for round_dir in sorted(store.glob("round=*"), key=lambda p: int(p.name.split("=")[1])):
        r = int(round_dir.name.split("=")[1])
        timings = round_dir / "timings.parquet"
        if r < 0 or not timings.exists():
            continue
        seconds = dict(pl.read_parquet(timings).select("stage", "seconds").iter_rows())
        steps = pl.read_parquet(round_dir / "steps.parquet", columns=["prompt_ids", "completion_ids"])
        roll_tokens = int(steps["prompt_ids"].list.len().sum() + steps["completion_ids"].list.len().sum())
        rows.append({"store": store.name, "round": r, "stage": "rollouts", "seconds": seconds.get("rollouts"), "tokens": roll_tokens,
                     "flops_per_token": 2 * params, "dtype": dtype})
        view_file = round_dir / "training_view.parquet"
        if view_file.exists():
            view = pl.read_parquet(view_file)
            reward = view["reward"].to_list() if "reward" in view.columns else [None] * view.height
            keep = trainable_rows(view["advantage"].to_list(), view["sample_weight"].to_list(), reward, view["strategy"].to_list(), config.train.loss)
            lengths = (view["train_prompt_ids"].list.len() + view["completion_ids"].list.len()).to_list()
            train_tokens = sum(n for n, k in zip(lengths, keep) if k) * config.train.epochs
            rows.append({"store": store.name, "round": r, "stage": "training", "seconds": seconds.get("training"), "tokens": train_tokens,
                         "flops_per_token": (4 if lora else 6) * params, "dtype": dtype})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stores", nargs="*", type=Path, default=[])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own, all cores)")
    ap.add_argument("--matmul-only", action="store_true")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    peak = {name: matmul_gflops(getattr(torch, name), args.size, args.repeats) for name in ("float32", "bfloat16")}
    print(f"matmul {args.size}x{args.size}, {torch.get_num_threads()} threads: float32 {peak['float32']:.0f} GFLOP/s, "
          f"bfloat16 {peak['bfloat16']:.0f} GFLOP/s ({peak['bfloat16'] / peak['float32']:.2f}x)")
    if args.matmul_only:
        return 0
    for store in args.stores:
        if not (store / "experiment.json").is_file():
            print(f"roofline: {store} is not a maxit store (no experiment.json)", file=sys.stderr)
            return 2
    print()
    print("| store | round | stage | dtype | seconds | tokens | tokens/s | GFLOP/s | share of float32 matmul | share of bfloat16 matmul |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for store in args.stores:
        for row in store_rows(store):
            sec = row["seconds"]
            if not sec:
                continue
            tps = row["tokens"] / sec
            gflops = tps * row["flops_per_token"] / 1e9
            print(f"| {row['store']} | {row['round']} | {row['stage']} | {row['dtype']} | {sec:.1f} | {row['tokens']:,} | {tps:,.0f} | {gflops:.0f} | "
                  f"{100 * gflops / peak['float32']:.0f}% | {100 * gflops / peak['bfloat16']:.0f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
