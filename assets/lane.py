"""The trainer lane of overlapped rounds as a process of its own: some stages of a round
materialized on the store's Dagster instance (`assets.overlap`).

    python -m assets.lane --store STORE --engine ENGINE --settings SETTINGS.json --round R \\
        --stages policy [--home DAGSTER_HOME] --result RESULT.json
    python -m assets.lane --serve --store STORE --engine ENGINE --home DAGSTER_HOME --reply-fd FD

The trainer lane of `maxit run --max-staleness K` runs so, beside the run's own process, which
samples meanwhile: Dagster configures Python's logging when a run starts, which is not safe
while another thread of the same process logs, and a process of its own also keeps the trainer
off the sampler's interpreter lock. It shares the run's writer lock (the token in its
environment) and dies with the run (`pipeline.store.lifeline`).

One round per process (`--round`): RESULT.json is {"error": null} or {"error": "the one-line
reason"}; the exit code is 0 or 2.

One process for the run (`--serve`, started by `assets.trainer_lane.TrainerLane`): it reads one request per line on
its stdin ({"round": R, "stages": [...], "settings": SETTINGS.json}), materializes it as the
per-round process would, and answers each on the file descriptor FD with one line,
{"round": R, "error": null | "the one-line reason"}; end of input ends it. It keeps what a
per-round process loads again each round: the interpreter with torch, transformers and Dagster
imported, the Dagster instance, and the model it trained last round (`pipeline.learn.trainer.
resident`: reused for the next round only when that round starts from the checkpoint this
process saved and its tensors on disk equal the kept ones bit for bit). An exception other than
a `MaxitError` ends the process, as it ends a per-round one: the round fails with its exit code.
With `--train-processes` > 1 or `--fsdp` the model lives in torchrun's ranks, which a round
starts anew, so `assets.trainer_lane` starts a process per round as before and says so in the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from pipeline.errors import MaxitError

__all__ = ["main", "serve"]

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.store.lifeline import hold_lifeline

    hold_lifeline("trainer lane")  # first: a lane whose run is gone must not write its store
    ap = argparse.ArgumentParser(prog="python -m assets.lane", description="Materialize some stages of rounds (a lane of overlapped rounds).")
    ap.add_argument("--store", required=True)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--settings", help="the run's settings as JSON (the launchpad's fields); with --round")
    ap.add_argument("--round", type=int)
    ap.add_argument("--stages", nargs="+")
    ap.add_argument("--home", required=True, help="the store's Dagster instance folder")
    ap.add_argument("--result", help="with --round: the JSON file the outcome is written to")
    ap.add_argument("--serve", action="store_true", help="take rounds from stdin, one JSON request a line, until its end")
    ap.add_argument("--reply-fd", type=int, help="with --serve: the file descriptor each round's answer is written to")
    args = ap.parse_args(argv)
    if args.serve:
        if args.reply_fd is None:
            ap.error("--serve needs --reply-fd")
        return serve(args.store, args.engine, args.home, sys.stdin, os.fdopen(args.reply_fd, "w", encoding="utf-8"))
    missing = [f"--{name}" for name in ("settings", "round", "stages", "result") if getattr(args, name) is None]
    if missing:
        ap.error(f"one round needs {' '.join(missing)} (or --serve)")
    error = _materialize(args.store, args.engine, args.home, args.round, tuple(args.stages), args.settings)
    Path(args.result).write_text(json.dumps({"error": error}), encoding="utf-8")
    return 0 if error is None else 2


def _materialize(store: str, engine: str, home: str, round_: int, stages: tuple[str, ...], settings_file: str, held: dict | None = None) -> str | None:
    """`materialize_round(..., stages=stages)` of round `round_`; its `MaxitError` as one line,
    else None. `held`: what a serving process keeps between calls (the Dagster instance), and
    that it keeps the model each round trains (`resident`)."""
    values = json.loads(Path(settings_file).read_text(encoding="utf-8"))
    if held is not None and "instance" not in held:  # torch and the trainer: seconds to import, so once there is a round
        from pipeline.learn.trainer import resident

        resident.keep_models(True)
    from assets.config import RunSettings
    from assets.instance import instance_at
    from assets.jobs import materialize_round
    from pipeline.store import Tables

    try:
        settings = RunSettings(**values)
        held = {} if held is None else held
        if "instance" not in held:
            held["instance"] = instance_at(Path(home))
        materialize_round(held["instance"], Tables(store), round_, settings, engine, True, stages=stages)
    except MaxitError as e:
        return str(e)
    return None


def serve(store: str, engine: str, home: str, requests, replies) -> int:
    """`--serve`: each request line materialized in turn, each answered on `replies`."""
    held: dict = {}
    for line in requests:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            round_, stages, settings_file = int(req["round"]), tuple(req["stages"]), str(req["settings"])
        except (ValueError, KeyError, TypeError) as err:
            replies.write(json.dumps({"round": None, "error": f"trainer lane: a request that is not one: {line.strip()[:200]!r} ({err})"}) + "\n")
            replies.flush()
            continue
        error = _materialize(store, engine, home, round_, stages, settings_file, held)
        from pipeline.learn.trainer import resident

        if error is not None:
            resident.forget()  # the run stops after this round; nothing half-trained is kept
        replies.write(json.dumps({"round": round_, "error": error, "model": resident.stats()}) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
