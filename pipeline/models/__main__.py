"""`python -m pipeline.models [--seed S] [--cache-dir DIR] [--force]`: build (or reuse) the
warm-started default model and print where it is and its held-out Solver accuracy."""

from __future__ import annotations

import argparse

from . import build_default_model, build_info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.models", description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", default=None, help="default: $MAXIT_CACHE_DIR or ./.cache/maxit")
    ap.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    args = ap.parse_args(argv)
    path = build_default_model(args.cache_dir, seed=args.seed, force=args.force)
    info = build_info(path)
    ws = info["warm_start"]
    print(f"model: {path}")
    print(f"  {info['parameters'] / 1e6:.2f}M parameters, vocab {info['vocab_size']}, warm start {ws['steps']} steps "
          f"in {ws['seconds']:.0f}s")
    print(f"  held-out Solver accuracy at T=1: {info['heldout_acc_t1']:.1%} without hint, "
          f"{info['heldout_acc_t1_hint']:.1%} with hint; greedy {info['heldout_acc_greedy']:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
