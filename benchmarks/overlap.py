"""Synchronous rounds against overlapped ones (`--max-staleness 1`, the trainer sharing every core
or pinned to its own), the same job, in one run.

Each variant is `maxit run --rounds R` on a fresh store with the same flags (the main job's by
default); variants run one after another in the order given, repeated `--repeats` times in
turn, so background load hits them alike. Per variant: the run's wall seconds, the seconds per
round after the first (the first also builds the engines and evaluates the starting model), and
the ratio of each to the synchronous variant's. Overlap pays where the sampler and the trainer
each leave resources idle while the other works (an engine on a GPU while the trainer runs); on
a CPU both want every core, so the figure is mostly what sharing them costs.

    .venv/bin/python benchmarks/overlap.py [--rounds 3] [--repeats 1] [--trainer-cores 1] [-- maxit run flags]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_variant(flags: list[str], store: Path, rounds: int) -> tuple[float, list[float]]:
    """(wall seconds, each round's finishing time since the start) of one `maxit run`."""
    maxit = Path(sys.executable).with_name("maxit")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(maxit), "run", "--rounds", str(rounds), "--store", str(store), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    finished = []
    for line in proc.stdout:
        if re.match(r"\s*round \d+ \|", line.split("\r")[-1]):
            finished.append(time.perf_counter() - t0)
    if proc.wait() != 0:
        raise SystemExit(f"maxit run {' '.join(flags)} failed (store {store})")
    return time.perf_counter() - t0, finished


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--trainer-cores", default="1", help="the pinned variant's --trainer-cores (default 1)")
    ap.add_argument("extra", nargs="*", help="flags every variant gets (after --)")
    args = ap.parse_args(argv)
    variants = {
        "synchronous": [],
        "overlapped": ["--max-staleness", "1"],
        "overlapped, pinned": ["--max-staleness", "1", "--trainer-cores", args.trainer_cores],
    }
    results: dict[str, list[tuple[float, list[float]]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="maxit-bench-overlap-") as tmp:
        for rep in range(args.repeats):
            for name, flags in variants.items():
                store = Path(tmp) / f"{name.replace(', ', '-')}-{rep}"
                results[name].append(run_variant([*flags, *args.extra], store, args.rounds))
                wall, ends = results[name][-1]
                print(f"{name:20s} repeat {rep}: {wall:7.1f} s; rounds finished at {', '.join(f'{e:.0f}' for e in ends)} s", flush=True)
    base = min(w for w, _ in results["synchronous"])
    base_later = min((e[-1] - e[0]) / max(1, len(e) - 1) for _, e in results["synchronous"])
    print(f"\n{'variant':20s} {'wall s (best)':>14s} {'ratio':>6s} {'s/round after the first':>24s} {'ratio':>6s}")
    for name, runs in results.items():
        wall = min(w for w, _ in runs)
        later = min((e[-1] - e[0]) / max(1, len(e) - 1) for _, e in runs)
        print(f"{name:20s} {wall:14.1f} {wall / base:6.2f} {later:24.1f} {later / base_later:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
