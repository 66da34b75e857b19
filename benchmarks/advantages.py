"""Throughput of the advantage engine against a plain-Python per-row reference, in one run.

    .venv/bin/python benchmarks/advantages.py [--sizes 1000000 10000000] [--reference-rows 200000]
        [--trajectory-mean]

Tables: synthetic rollouts in the "loops" layout (2 agents, up to 3 turns, 3 strategies
interleaved, 4 samples per problem; ~10 rows per problem, so 10M rows hold ~1M distinct uids).
Configs: the default AdvantageConfig (groups uid + strategy + agent_id + turn, reward = global +
local, sample_weight = membership weight; stratified strategy weights are the training view's
and not measured here); --trajectory-mean adds the trajectory-mean mode with each row scored by
its own reward (the default score) and by its trajectory's mean.
Each size runs in a fresh subprocess so its peak memory is its own; rows/s is the best of
--repeats runs (the machine is shared and noisy). The reference (pipeline.learn.advantages_reference,
one Python loop over row dicts) runs on --reference-rows rows of the same layout; the ratio is
engine rows/s over reference rows/s measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def measure_engine(rows: int, repeats: int, config_kwargs: dict) -> dict:
    from pipeline.learn.advantages import compute_advantages
    from pipeline.config import AdvantageConfig
    from pipeline.rollout.synthetic import synthetic_steps

    df = synthetic_steps(max(rows // 10, 1), samples=4, layout="loops")
    config = AdvantageConfig(**config_kwargs)
    base = _rss()
    peak = [base]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = compute_advantages(df, config)
        times.append(time.perf_counter() - t0)
        del out
    stop.set()
    t.join()
    return {
        "rows": df.height,
        "uids": df["uid"].n_unique(),
        "best_s": min(times),
        "median_s": sorted(times)[len(times) // 2],
        "rows_per_s": df.height / min(times),
        "table_mb": df.estimated_size() / 2**20,
        "peak_extra_mb": (peak[0] - base) / 2**20,
        "peak_rss_mb": peak[0] / 2**20,
    }


def measure_reference(rows: int, config_kwargs: dict) -> dict:
    from pipeline.learn.advantages_reference import reference_advantages
    from pipeline.config import AdvantageConfig
    from pipeline.rollout.synthetic import synthetic_steps

    df = synthetic_steps(max(rows // 10, 1), samples=4, layout="loops")
    dicts = df.to_dicts()
    config = AdvantageConfig(**config_kwargs)
    t0 = time.perf_counter()
    reference_advantages(dicts, config)
    dt = time.perf_counter() - t0
    return {"rows": len(dicts), "s": dt, "rows_per_s": len(dicts) / dt}


def _child(kind: str, rows: int, repeats: int, config_kwargs: dict) -> dict:
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--child", kind, str(rows), str(repeats), json.dumps(config_kwargs)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, rows, repeats, cfg = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
        res = measure_engine(rows, repeats, cfg) if kind == "engine" else measure_reference(rows, cfg)
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--reference-rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trajectory-mean", action="store_true", help="also benchmark the trajectory-mean mode (both scores)")
    args = ap.parse_args()

    configs = {"per-call (default)": {}}
    if args.trajectory_mean:
        configs["trajectory-mean, own score"] = {"trajectory_mean": True, "trajectory_score": "own"}
        configs["trajectory-mean, mean score"] = {"trajectory_mean": True, "trajectory_score": "mean"}
    print(f"cores: {os.cpu_count()}, polars threads: {__import__('polars').thread_pool_size()}")
    for label, cfg in configs.items():
        ref = _child("reference", args.reference_rows, 1, cfg)
        from pipeline.config import AdvantageConfig

        key = "+".join(AdvantageConfig(**cfg).group_key)
        print(f"\n## {label} (groups {key}): Python reference {ref['rows']:,} rows in {ref['s']:.2f} s = {ref['rows_per_s'] / 1e6:.3f} M rows/s")
        print("| rows | uids | best s | engine M rows/s | x Python reference | table MB | peak extra MB | peak RSS MB |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for size in args.sizes:
            r = _child("engine", size, args.repeats, cfg)
            print(
                f"| {r['rows']:,} | {r['uids']:,} | {r['best_s']:.2f} | {r['rows_per_s'] / 1e6:.2f} | "
                f"{r['rows_per_s'] / ref['rows_per_s']:.0f}x | {r['table_mb']:.0f} | {r['peak_extra_mb']:.0f} | {r['peak_rss_mb']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
