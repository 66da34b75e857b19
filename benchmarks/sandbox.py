"""Throughput of the sandbox against bare subprocesses.

One run: the same M small programs (a function and a few asserts each, all passing) go (1)
through `pipeline.sandbox.run_many` (bubblewrap where it works, a sandbox uid, limits, a
temporary folder each; `--workers` at a time) and (2) through a bare loop of
`subprocess.run([sys.executable, file])`, one after another, as a reward function without a
sandbox would run them; and (3), like for like, the same bare runs in `--workers` threads with
`python -S` (the sandbox starts Python without `site`, the standard library only: here `site`
alone costs a venv's python tens of milliseconds). Prints programs per second for each and the
ratios sandbox / bare.

    .venv/bin/python benchmarks/sandbox.py --programs 200
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def make_programs(m: int) -> list[str]:
    out = []
    for i in range(m):
        out.append(
            f"def f(x):\n    return x * {i} + {i % 7}\n\n"
            f"assert f(0) == {i % 7}\nassert f(3) == {3 * i + i % 7}\nassert [f(k) for k in range(3)] == {[k * i + i % 7 for k in range(3)]}\n"
            f"print(f({i}))\n"
        )
    return out


def main(argv=None) -> None:
    from pipeline.sandbox import isolation_report, run_many

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--memory-mb", type=int, default=256)
    args = ap.parse_args(argv)

    programs = make_programs(args.programs)
    report = isolation_report()  # probes once, outside the timed part
    print(f"sandbox: isolation {report['isolation']}, {report['user']}; {args.programs} programs, {args.workers} workers")

    t0 = time.perf_counter()
    results = run_many(programs, workers=args.workers, timeout=args.timeout, memory_mb=args.memory_mb)
    sandboxed = time.perf_counter() - t0
    bad = [r.to_json() for r in results if r.status != "ok"]
    assert not bad, bad[:3]

    with tempfile.TemporaryDirectory(prefix="maxit-bench-sandbox-") as tmp:
        files = []
        for i, src in enumerate(programs):
            path = Path(tmp) / f"p{i}.py"
            path.write_text(src)
            files.append(str(path))

        def bare(path: str, *flags: str) -> int:
            return subprocess.run([sys.executable, *flags, path], capture_output=True, timeout=args.timeout).returncode

        t0 = time.perf_counter()
        codes = [bare(f) for f in files]
        loop = time.perf_counter() - t0
        assert codes == [0] * len(files), codes[:5]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            codes = list(pool.map(lambda f: bare(f, "-S"), files))
        threaded = time.perf_counter() - t0
        assert codes == [0] * len(files)

    m = args.programs
    print(f"run_many (sandbox, {args.workers} workers):        {m / sandboxed:8.1f} programs/s  ({sandboxed:.2f} s)")
    print(f"bare subprocess.run loop:                {m / loop:8.1f} programs/s  ({loop:.2f} s)")
    print(f"bare subprocess.run -S, {args.workers} threads:        {m / threaded:8.1f} programs/s  ({threaded:.2f} s)")
    print(f"ratio sandbox / bare loop: {loop / sandboxed:.2f}")
    print(f"ratio sandbox / bare -S in {args.workers} threads: {threaded / sandboxed:.2f}")


if __name__ == "__main__":
    main()
