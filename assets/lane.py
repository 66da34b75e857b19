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

One process for the run (`--serve`, started by `TrainerLane`): it reads one request per line on
its stdin ({"round": R, "stages": [...], "settings": SETTINGS.json}), materializes it as the
per-round process would, and answers each on the file descriptor FD with one line,
{"round": R, "error": null | "the one-line reason"}; end of input ends it. It keeps what a
per-round process loads again each round: the interpreter with torch, transformers and Dagster
imported, the Dagster instance, and the model it trained last round (`pipeline.learn.trainer.
resident`: reused for the next round only when that round starts from the checkpoint this
process saved and its tensors on disk equal the kept ones bit for bit). An exception other than
a `MaxitError` ends the process, as it ends a per-round one: the round fails with its exit code.
With `--train-processes` > 1 or `--fsdp` the model lives in torchrun's ranks, which a round
starts anew, so `TrainerLane` starts a process per round as before and says so in the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Sequence

from pipeline.errors import MaxitError

__all__ = ["main", "TrainerLane", "trainer_lane", "materialize_in_lane", "close_lanes", "holds_model"]

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
    from assets.launch import materialize_round
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


def holds_model(settings) -> str | None:
    """None when one lane process can keep the trained model across rounds under `settings`;
    else why not (torchrun's ranks hold it, and a round starts them anew)."""
    processes, fsdp = int(getattr(settings, "train_processes", 1) or 1), str(getattr(settings, "fsdp", "off") or "off")
    shards, executor = int(getattr(settings, "shards", 1) or 1), str(getattr(settings, "executor", "") or "")
    if processes > 1:
        return f"--train-processes {processes}: the model lives in torchrun's ranks, started anew each round"
    if fsdp != "off":
        return f"--fsdp {fsdp}: the model is sharded over torchrun's ranks, started anew each round"
    if shards > 1 and executor != "ray":
        return f"--shards {shards}: each step of a round runs in a process of its own"
    return None


class TrainerLane:
    """The run's trainer lane as one process for all its rounds (`--serve`), started on the first
    round and given each round as a request; what `_materialize_in_process_of_its_own` of
    `assets.launch` gives its per-round process, it gives this one: the run's environment (its
    lifeline and writer lock token), `--trainer-devices` as CUDA_VISIBLE_DEVICES, `--trainer-cores`
    as the process's CPU affinity and OMP_NUM_THREADS, the parent-death signal."""

    def __init__(self, store: str, engine: str, home: str, env: dict[str, str], cores: str | None, cwd: Path):
        self.store, self.engine, self.home, self.env, self.cores, self.cwd = store, engine, home, env, cores, cwd
        self.proc: subprocess.Popen | None = None
        self._replies = None
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.rounds = 0
        self.model: dict = {}
        """The serving process's `resident.stats()` after its last round."""

    def start(self) -> int:
        """Start the lane's process (once); its pid. It is started from a thread of its own that
        lives until `close`: the parent-death signal fires when the thread that started a process
        ends, and the thread that asks for the first round (the trainer lane's worker thread of
        `run_overlapped`) ends with the overlapped loop, before the run closes its lanes."""
        if self.proc is not None:
            return self.proc.pid
        from pipeline.store.lifeline import preexec

        read, write = os.pipe()
        argv = [sys.executable, "-m", "assets.lane", "--serve", "--store", self.store, "--engine", self.engine, "--home", self.home,
                "--reply-fd", str(write)]
        pin = None if self.cores is None else (lambda: _pin(self.cores))
        started, box = threading.Event(), {}
        self._closed = threading.Event()

        def keeper() -> None:
            try:
                box["proc"] = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE, text=True, pass_fds=(write,),
                                               preexec_fn=preexec(pin))
            except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
                box["error"] = err
            finally:
                os.close(write)  # the child's copy alone: its end is this end's EOF
                started.set()
            self._closed.wait()

        threading.Thread(target=keeper, name="maxit-trainer-lane", daemon=True).start()
        started.wait()
        if "error" in box:
            os.close(read)
            raise box["error"]
        self.proc, self._replies = box["proc"], os.fdopen(read, "r", encoding="utf-8")
        return self.proc.pid

    def run(self, round_: int, stages: tuple[str, ...], settings_file: str | Path) -> None:
        """Round `round_`'s `stages`, in the lane's process; its failure raised as `MaxitError`."""
        with self._lock:
            if self.proc is None:
                self.start()
            assert self.proc is not None and self.proc.stdin is not None and self._replies is not None
            request = json.dumps({"round": int(round_), "stages": list(stages), "settings": str(settings_file)})
            try:
                self.proc.stdin.write(request + "\n")
                self.proc.stdin.flush()
                line = self._replies.readline()
            except (BrokenPipeError, OSError):
                line = ""
            if not line:  # the process ended (an exception, or killed) before it answered
                code = self.proc.wait()
                self.proc = None
                self._replies.close()
                self._closed.set()
                raise MaxitError(f"round {round_}: {' '.join(stages)} stopped with exit code {code} (the trainer lane's process)")
            reply = json.loads(line)
            self.rounds += 1
            self.model = reply.get("model") or {}
            if reply.get("error") is not None:
                raise MaxitError(reply["error"])

    def close(self) -> None:
        """End the process (end of its input), waiting for it."""
        with self._lock:
            proc, self.proc = self.proc, None
            if proc is None:
                return
            try:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            if self._replies is not None:
                self._replies.close()
            self._closed.set()


_LANES: dict[tuple, TrainerLane] = {}


def materialize_in_lane(tables, r: int, settings, engine: str, stages: tuple[str, ...], per_round: Callable | None = None) -> None:
    """What `assets.launch._materialize_in_process_of_its_own` does for the trainer lane of
    overlapped rounds, in one process for the whole run (`TrainerLane`) where it can keep the
    model (`holds_model`), else by `per_round` (default: that function, a process per round)."""
    from dataclasses import asdict

    values = settings.settings() if hasattr(settings, "settings") else settings
    why = holds_model(values)
    if why is not None:
        if per_round is None:
            from assets.launch import _materialize_in_process_of_its_own as per_round
        log.info("trainer lane: a process per round (%s)", why)
        per_round(tables, r, settings, engine, stages)
        return
    lane = trainer_lane(tables, values, engine)
    with tempfile.TemporaryDirectory(prefix="maxit-lane-") as tmp:
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(values).items()}), encoding="utf-8")
        lane.run(r, stages, settings_file)


def trainer_lane(tables, values, engine: str) -> TrainerLane:
    """The run's `TrainerLane` for `tables`' store (made on first use, its process started on its
    first round), given what the per-round lane process is given (`TrainerLane`)."""
    from assets.instance import dagster_home
    from assets.launch import PROJECT_ROOT
    from pipeline.config.scale import devices_env, parse_cores

    key = (str(tables.location), engine, os.getpid())
    lane = _LANES.get(key)
    if lane is None:
        cores = getattr(values, "trainer_cores", None)
        env = devices_env(getattr(values, "trainer_devices", None)) or dict(os.environ)  # --trainer-devices: the lane
        if cores is not None:
            env["OMP_NUM_THREADS"] = str(len(parse_cores(cores, "--trainer-cores")))
        lane = _LANES[key] = TrainerLane(str(tables.location), engine, str(dagster_home(tables.root)), env, cores, PROJECT_ROOT)
        log.info("trainer lane: one process for the run's rounds, which keeps the model it trains")
    return lane


def close_lanes() -> dict[str, int]:
    """End every lane process `materialize_in_lane` started; the rounds each served, by store."""
    served = {}
    while _LANES:
        key, lane = _LANES.popitem()
        lane.close()
        served[key[0]] = lane.rounds
    return served


def _pin(cores: str) -> None:
    """In the lane's process before it starts: pinned to `cores` (`--trainer-cores`)."""
    from pipeline.config.scale import parse_cores

    os.sched_setaffinity(0, parse_cores(cores, "--trainer-cores"))


if __name__ == "__main__":
    sys.exit(main())
