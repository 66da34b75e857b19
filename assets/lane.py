"""One lane of overlapped rounds as a process of its own: some stages of one round materialized
on the store's Dagster instance (`assets.overlap`).

    python -m assets.lane --store STORE --engine ENGINE --settings SETTINGS.json --round R \\
        --stages policy [--home DAGSTER_HOME] --result RESULT.json

The trainer lane of `maxit run --max-staleness K` runs so, beside the run's own process, which
samples meanwhile: Dagster configures Python's logging when a run starts, which is not safe
while another thread of the same process logs, and a process of its own also keeps the trainer
off the sampler's interpreter lock. It shares the run's writer lock (the token in its
environment) and dies with the run. RESULT.json is {"error": null} or {"error": "the one-line
reason"}; the exit code is 0 or 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from pipeline.errors import MaxitError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.store.lifeline import hold_lifeline

    hold_lifeline("trainer lane")  # first: a lane whose run is gone must not write its store
    ap = argparse.ArgumentParser(prog="python -m assets.lane", description="Materialize some stages of one round (a lane of overlapped rounds).")
    ap.add_argument("--store", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--settings", required=True, help="the run's settings as JSON (the launchpad's fields)")
    ap.add_argument("--round", type=int, required=True)
    ap.add_argument("--stages", nargs="+", required=True)
    ap.add_argument("--home", required=True, help="the store's Dagster instance folder")
    ap.add_argument("--result", required=True)
    args = ap.parse_args(argv)
    from assets.config import RunSettings
    from assets.instance import instance_at
    from assets.launch import materialize_round
    from pipeline.store import Tables

    error = None
    try:
        settings = RunSettings(**json.loads(Path(args.settings).read_text(encoding="utf-8")))
        materialize_round(instance_at(Path(args.home)), Tables(args.store), args.round, settings, args.engine, True, stages=tuple(args.stages))
    except MaxitError as e:
        error = str(e)
    Path(args.result).write_text(json.dumps({"error": error}), encoding="utf-8")
    return 0 if error is None else 2


if __name__ == "__main__":
    sys.exit(main())
