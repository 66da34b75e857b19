"""Ablation of the expert-iteration run on one sample budget, over several seeds.

    .venv/bin/python scripts/ablation.py [--rounds 5] [--seeds 0 1] [--variants all iid ...] [--out runs/ablation]

Every variant runs `maxit run` with the same problems x samples per round (the same sample
budget) into its own store, sequentially (the machine's cores go to one run at a time). The
table printed at the end (markdown) gives held-out Solver accuracy (T=1, no hint) per round,
the gain over the starting checkpoint, the optimizer steps taken and the wall time.
Variants:
  all          all strategies (iid, prompt_aug, feedback, tree), rejection-sampling loss (the default)
  iid          iid only, rejection-sampling loss
  iid+aug      iid + prompt_aug, rejection-sampling loss
  ppo          all strategies, importance-weighted PG (PPO clip), per-agent (uid, agent, turn, strategy) groups
  ppo-grpo     as ppo with plain GRPO groups (uid only)
  sft          step-matched SFT on ground-truth answers (as many rows/steps as `all` trains each round)
  no-balance   as all, without equal weight for the Verifier's yes/no rows (--no-balance-verdicts)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
# Same sample budget: the default samples 4 strategies x 4 samples per problem, so a variant with
# fewer strategies draws proportionally more samples per strategy.
VARIANTS = {
    "all": [],
    "iid": ["--strategies", "iid", "--samples", "16"],
    "iid+aug": ["--strategies", "iid", "prompt_aug", "--samples", "8"],
    "ppo": ["--loss", "ppo"],
    "ppo-grpo": ["--loss", "ppo", "--group-by", "none"],
    "sft": ["--train-on", "ground_truth"],
    "no-balance": ["--no-balance-verdicts"],
}


def run_variant(name: str, seed: int, rounds: int, out: Path, extra: list[str]) -> dict:
    store = out / f"{name}-seed{seed}"
    cmd = [str(ROOT / ".venv/bin/maxit"), "run", "--rounds", str(rounds), "--store", str(store), "--seed", str(seed), *VARIANTS[name], *extra]
    t0 = time.perf_counter()
    log = out / f"{name}-seed{seed}.log"
    if (store / f"round={rounds - 1}" / "evaluation.parquet").exists() and (out / f"{name}-seed{seed}.seconds").exists():
        seconds = float((out / f"{name}-seed{seed}.seconds").read_text())
        return _result(name, seed, store, seconds, cmd)
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"variant": name, "seed": seed, "error": f"exit {proc.returncode}, see {log}", "cmd": " ".join(cmd[1:])}
    (out / f"{name}-seed{seed}.seconds").write_text(str(seconds))
    return _result(name, seed, store, seconds, cmd)


def _result(name: str, seed: int, store: Path, seconds: float, cmd: list[str]) -> dict:
    ev = pl.read_parquet(str(store / "round=*" / "evaluation.parquet"), hive_partitioning=True)
    acc = ev.filter((pl.col("metric") == "accuracy") & (pl.col("agent_id") == "solver")).sort("round")["value"].to_list()
    ver = ev.filter(pl.col("metric") == "verdict_accuracy").sort("round")["value"].to_list()
    steps = 0
    for meta in store.glob("checkpoints/round=*/*/maxit_checkpoint.json"):
        steps += int(json.loads(meta.read_text())["metrics"].get("steps", 0))
    return {"variant": name, "seed": seed, "acc": acc, "verdict": ver, "steps": steps, "seconds": seconds, "cmd": "maxit " + " ".join(cmd[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default="runs/ablation")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="more flags for every `maxit run` (after --)")
    args = ap.parse_args()
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    extra = [a for a in args.extra if a != "--"]
    results = []
    for seed in args.seeds:
        for name in args.variants:
            res = run_variant(name, seed, args.rounds, out, extra)
            results.append(res)
            (out / "results.json").write_text(json.dumps(results, indent=2))
            print(json.dumps({k: v for k, v in res.items() if k != "cmd"}), flush=True)
    print()
    header = "| variant | seed | " + " | ".join(f"r{r}" for r in range(-1, args.rounds)) + " | gain | verdict acc (last) | steps | seconds |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for res in results:
        if "error" in res:
            print(f"| {res['variant']} | {res['seed']} | {res['error']} |")
            continue
        accs = " | ".join(f"{100 * a:.1f}" for a in res["acc"])
        gain = 100 * (res["acc"][-1] - res["acc"][0])
        print(f"| {res['variant']} | {res['seed']} | {accs} | {gain:+.1f} | {100 * res['verdict'][-1]:.1f} | {res['steps']} | {res['seconds']:.0f} |")
    print("\nreproduce one row: the `cmd` field of", out / "results.json")


if __name__ == "__main__":
    sys.exit(main())
