"""Training one policy on 1 process and on N (torch.distributed ranks started by torchrun), the same
view, in one run.

Both run as a process of their own (`train_in_subprocess`), so both pay a process start, the
imports, the model load and the checkpoint write; the rows, config and seed are the same, and the
update is the same (tests/test_distributed_training.py). Runs alternate (1, N, 1, N, ...) so
background load hits both alike; the best of each is reported. Figures per variant: the training
loop's seconds (`TrainResult.train_seconds`: the slowest rank's), the whole process's wall seconds
(start to result), and the ratio N/1 of each. On a CPU the ranks split its cores (each runs
cores / N threads), so the gain is small and the figure is mostly the overhead: the gradient
all-reduce, the process group's start and the extra interpreters.

The view: `--view FILE --policy ID --init DIR` (e.g. a round's `training_view` and its start
checkpoint from a `maxit run` store), else `--rows` synthetic arithmetic rows on the embedded
default model (the main job's model).

    .venv/bin/python benchmarks/train_processes.py [--processes 2] [--rows 1024] [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]


def default_view(rows: int, path: Path) -> tuple[Path, str, Path]:
    """(view file, policy, init dir): `rows` synthetic rows on the embedded default model."""
    import pyarrow.parquet as pq

    from pipeline.models import load_tokenizer
    from pipeline.workflows.math.model import default_model
    from training import synthetic_view

    init = Path(default_model())
    pq.write_table(synthetic_view(load_tokenizer(init), rows, seed=0), path)
    return path, "shared", init


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=2, help="ranks of the distributed run (default 2)")
    ap.add_argument("--rows", type=int, default=1024, help="synthetic rows when no --view is given")
    ap.add_argument("--view", default=None, help="a training_view Parquet file (with --policy and --init)")
    ap.add_argument("--policy", default=None)
    ap.add_argument("--init", default=None, help="the checkpoint training starts from")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each variant, alternating (default 2)")
    args = ap.parse_args(argv)

    from pipeline.config.train import TrainConfig
    from pipeline.learn.trainer import train_in_subprocess, view_temperature

    with tempfile.TemporaryDirectory(prefix="maxit-bench-") as tmp:
        tmp = Path(tmp)
        if args.view:
            view, policy, init = Path(args.view), args.policy, Path(args.init)
        else:
            view, policy, init = default_view(args.rows, tmp / "view.parquet")
        import pyarrow.parquet as pq

        config = TrainConfig(report_to="none", epochs=args.epochs)
        config = replace(config, temperature=view_temperature(pq.read_table(view)) or config.temperature)
        runs: dict[int, list[tuple[float, float]]] = {1: [], args.processes: []}
        for rep in range(args.repeats):
            for n in runs:
                t0 = time.perf_counter()
                res = train_in_subprocess(view, policy, init, tmp / f"out-{n}-{rep}", config, processes=n)
                wall = time.perf_counter() - t0
                runs[n].append((res.train_seconds, wall))
                print(f"  run {rep + 1}, {n} process(es): train {res.train_seconds:.2f} s, wall {wall:.2f} s, {res.steps} steps", flush=True)
        print(f"view {view}: policy {policy}, {res.n_rows} rows, {res.completion_tokens} completion tokens over {args.epochs} epochs")
        best = {n: (min(t for t, _ in r), min(w for _, w in r)) for n, r in runs.items()}
        print(f"{'processes':>10} {'train s':>9} {'wall s':>9} {'tokens/s':>9}")
        for n, (train, wall) in best.items():
            print(f"{n:>10} {train:>9.2f} {wall:>9.2f} {res.completion_tokens / train if train else 0:>9.0f}")
        (t1, w1), (tn, wn) = best[1], best[args.processes]
        print(f"ratio {args.processes}/1: train {tn / t1:.2f}x, wall {wn / w1:.2f}x (below 1: faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
