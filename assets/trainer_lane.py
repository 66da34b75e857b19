"""The run's handle on its trainer lane: `maxit run --max-staleness K` hands the trainer stages of
each round to one lane process for the whole run (`python -m assets.lane --serve`, `TrainerLane`)
where that process can keep the model it trains (`holds_model`), else to a process per round (the
caller's `per_round`). Kept apart from `assets.lane`, the lane process itself, which materializes
rounds with `assets.jobs` and so cannot be imported by it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from pipeline.errors import MaxitError

__all__ = ["TrainerLane", "trainer_lane", "materialize_in_lane", "close_lanes", "holds_model", "pin_to_cores"]

log = logging.getLogger(__name__)


def holds_model(scale) -> str | None:
    """None when one lane process can keep the trained model across rounds under `scale` (the
    run's `ScaleConfig`, `RunConfig.scale`); else why not (torchrun's ranks hold it, and a round
    starts them anew). FSDP needs `train_processes` > 1 (`ScaleConfig` refuses it otherwise), so
    the processes say it."""
    if scale.train_processes > 1:
        sharded = f", sharded by --fsdp {scale.fsdp}" if scale.fsdp != "off" else ""
        return f"--train-processes {scale.train_processes}: the model lives in torchrun's ranks{sharded}, started anew each round"
    if scale.shards > 1 and scale.executor != "ray":
        return f"--shards {scale.shards}: each step of a round runs in a process of its own"
    return None


class TrainerLane:
    """The run's trainer lane as one process for all its rounds (`--serve`), started on the first
    round and given each round as a request; what `_materialize_in_process_of_its_own` of
    `assets.overlapped_run` gives its per-round process, it gives this one: the run's environment (its
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
        pin = None if self.cores is None else (lambda: pin_to_cores(self.cores))
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


def materialize_in_lane(tables, r: int, settings, engine: str, stages: tuple[str, ...], per_round: Callable) -> None:
    """What `assets.overlapped_run._materialize_in_process_of_its_own` does for the trainer lane of
    overlapped rounds, in one process for the whole run (`TrainerLane`) where it can keep the
    model (`holds_model`), else by `per_round` (default: that function, a process per round)."""
    from dataclasses import asdict

    scale = settings.run_config().scale
    why = holds_model(scale)
    if why is not None:
        log.info("trainer lane: a process per round (%s)", why)
        per_round(tables, r, settings, engine, stages)
        return
    lane = trainer_lane(tables, scale, engine)
    # the lane process is handed the settings as the launchpad's flat fields (`RunSettings(**values)`
    # there), the one form both sides share
    values = settings.settings() if hasattr(settings, "settings") else settings
    with tempfile.TemporaryDirectory(prefix="maxit-lane-") as tmp:
        settings_file = Path(tmp) / "settings.json"
        settings_file.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(values).items()}), encoding="utf-8")
        lane.run(r, stages, settings_file)


def trainer_lane(tables, scale, engine: str) -> TrainerLane:
    """The run's `TrainerLane` for `tables`' store (made on first use, its process started on its
    first round), given what the per-round lane process is given (`TrainerLane`); `scale`: the
    run's `ScaleConfig` (its trainer cores and devices)."""
    from assets.instance import dagster_home
    from assets.instance import PROJECT_ROOT
    from pipeline.config.scale import devices_env, parse_cores

    key = (str(tables.location), engine, os.getpid())
    lane = _LANES.get(key)
    if lane is None:
        cores = scale.trainer_cores
        env = devices_env(scale.trainer_devices) or dict(os.environ)  # --trainer-devices: the lane
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


def pin_to_cores(cores: str) -> None:
    """In a trainer lane's process before it starts (the run's one lane, or a round's): pinned to
    `cores` (`--trainer-cores`)."""
    from pipeline.config.scale import parse_cores

    os.sched_setaffinity(0, parse_cores(cores, "--trainer-cores"))
