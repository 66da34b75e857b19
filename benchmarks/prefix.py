"""A round's training with the shared prompt prefix computed once per micro-batch
(`TrainConfig.share_prefix`, the default) against every row run whole (`share_prefix=0`), on the
rows a stored run trained on, measured in the same run.

Each policy of the round is retrained from its parent checkpoint with the configuration its
checkpoint records (the micro-batch size re-derived from the budgets, as a run would), once per
mode, each in its own process (wall seconds of the training and peak resident memory).

With `--profile` each policy is trained once more in the default mode under torch's profiler,
which prints where the operators' time went: matmuls, attention, copies and casts (autocast's
among them), other
(`benchmarks/opsplit.py`); the seconds in the table stay the unprofiled runs'.

    .venv/bin/python benchmarks/prefix.py --store runs/words-ppo --round 2 [--policy solver] [--profile]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(store: str, round_: int, policy: str, share_prefix: int | None, profile: bool = False) -> dict:
    """In a child process: train `policy` on round `round_`'s view of `store` from its parent
    checkpoint; `share_prefix` None keeps the default. `profile`: train again under torch's
    profiler and add its operator seconds per kind as "split"."""
    import resource
    import time
    from dataclasses import fields, replace

    sys.path[:0] = [str(ROOT)]
    import pyarrow.parquet as pq

    from pipeline.config.loss import LossConfig, RatioConfig

    from pipeline.config.train import LoraSettings, TrainConfig
    from pipeline.learn.trainer import read_checkpoint_meta, train_policy

    ckpt = Path(store) / "checkpoints" / f"round={round_}" / policy
    meta = read_checkpoint_meta(ckpt)
    recorded = dict(meta.config)
    loss = dict(recorded.pop("loss"))
    loss["ratio"] = RatioConfig(**loss["ratio"])
    loss["sft_strategies"] = tuple(loss.get("sft_strategies", ()))
    lora = recorded.pop("lora")
    names = {f.name for f in fields(TrainConfig)}
    config = TrainConfig(
        **{k: v for k, v in recorded.items() if k in names and k != "micro_batch_size"},
        micro_batch_size=recorded["minibatch_size"],  # re-derived from the budgets, as the run did
        loss=LossConfig(**loss),
        lora=None if lora is None else LoraSettings(**{**lora, "target_modules": tuple(lora["target_modules"])}),
    )
    if share_prefix is not None:
        config = replace(config, share_prefix=share_prefix)
    view = pq.read_table(Path(store) / f"round={round_}" / "training_view.parquet")
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = train_policy(view, policy, Path(meta.parent), Path(out) / "ckpt", config, round_=round_)
        seconds = time.perf_counter() - t0
        used = read_checkpoint_meta(result.checkpoint).config
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the profiler's own memory
        split = None
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as torch_profile

            from opsplit import TRAIN_KINDS, split_seconds

            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                train_policy(view, policy, Path(meta.parent), Path(out) / "profiled", config, round_=round_)
            split = split_seconds(prof.key_averages(), TRAIN_KINDS)
    return {
        "split": split,
        "share_prefix": config.share_prefix, "seconds": seconds, "train_seconds": result.train_seconds, "rows": meta.n_rows,
        "steps": result.steps, "micro_batch_size": used["micro_batch_size"], "mean_loss": result.mean_loss,
        "peak_mb": peak_mb,
    }


def child(args: argparse.Namespace, policy: str, share_prefix: int | None, profile: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", "--store", args.store, "--round", str(args.round), "--policy", policy]
    if share_prefix is not None:
        cmd += ["--share-prefix", str(share_prefix)]
    if profile:
        cmd += ["--profile"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--round", type=int, required=True)
    ap.add_argument("--policy", action="append", help="policy id (repeatable; default: every policy the round trained)")
    ap.add_argument("--profile", action="store_true", help="train each policy once more under torch's profiler and print its operator time per kind")
    ap.add_argument("--share-prefix", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.store, args.round, args.policy[0], args.share_prefix, args.profile)))
        return
    round_dir = Path(args.store) / "checkpoints" / f"round={args.round}"
    if not round_dir.is_dir():
        sys.exit(f"{round_dir}: no checkpoints of round {args.round} in this store")
    policies = args.policy or sorted(p.name for p in round_dir.iterdir() if (p / "maxit_checkpoint.json").is_file())
    print("| policy | rows | mode | micro-batch | training s | peak MB | mean loss |")
    print("|---|---:|---|---:|---:|---:|---:|")
    splits = {}
    for policy in policies:
        whole = child(args, policy, 0)
        shared = child(args, policy, None, args.profile)
        splits[policy] = shared["split"]
        for name, r in (("every row whole", whole), (f"shared prefix (>= {shared['share_prefix']} tokens)", shared)):
            print(f"| {policy} | {r['rows']} | {name} | {r['micro_batch_size']} | {r['train_seconds']:.1f} | {r['peak_mb']:.0f} | {r['mean_loss']:.5g} |")
        print(f"{policy}: whole / shared = {whole['train_seconds'] / max(shared['train_seconds'], 1e-9):.2f}x the training seconds")
    if args.profile:
        from opsplit import shares_line

        print("\noperator self time of a profiled training in the default mode, per kind:")
        for policy, split in splits.items():
            print(f"- {policy}: {shares_line(split)}")


if __name__ == "__main__":
    main()
