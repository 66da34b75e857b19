"""Every process a `maxit run` starts dies with it, and a run stops what an earlier run of its
store left running before it trains.

A run's children are the trainer lane (`python -m assets.lane`), the step processes of a sharded
round (Dagster's multiprocess executor), the trainer's own process or torchrun's launcher, and
torchrun's ranks below that launcher. The kernel's parent-death signal (`PR_SET_PDEATHSIG`) kills
a child when the thread that started it ends, but only one generation down: a launcher whose
parent was killed lives on, and so do its ranks. So each process of a run is tied to the run
three ways:

- the spawner sets the parent-death signal in the child before it executes anything
  (`preexec`, as `preexec_fn`: libc's `prctl` is looked up in the parent, so the child between
  fork and exec only calls it), so a process that runs no maxit code dies with the process that
  started it; torchrun's launcher gets SIGTERM, on which it stops its ranks (each in a session of
  its own, maybe still importing torch) before it exits;
- a process that runs maxit code (the lane, the trainer, each rank, each step process) calls
  `hold_lifeline` in its first lines: the parent-death signal for its own parent, and a watchdog
  thread that kills it once its parent changes (it was re-parented: the parent died) or the
  run's own process is gone (`RUN_ENV` names it by pid and start time, so a reused pid is not
  taken for it);
- each such process records itself in the store (`<store>/.maxit-trainers/<pid>.json`: pid,
  start time, host, the run's pid and start time), and a run that finds a record whose process
  lives while its run does not stops it, named on the console, before it takes the store's
  writer lock (`stop_orphans`). For a URL store the records are in its local working copy, where
  its trainers run.

Linux only: elsewhere the parent-death signal is a no-op and the watchdog alone holds the tie.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

__all__ = [
    "RUN_ENV", "RUN_ID_ENV", "PARENT_ENV", "TRAINERS_ENV", "TRAINERS_DIR", "process_start", "alive",
    "die_with_parent", "preexec", "run_lifeline", "hold_lifeline", "record_child", "stop_orphans",
]

RUN_ENV = "MAXIT_RUN_PROCESS"
"""The run's own process as "pid:start" (start: its start time in clock ticks since boot)."""
RUN_ID_ENV = "MAXIT_RUN_ID"
"""A name for the run, the same in every process of it (for people, and for finding them)."""
PARENT_ENV = "MAXIT_PARENT_PID"
"""The pid of the last process of the run that held its lifeline: a child whose parent was it
and is gone by the time the child starts was orphaned before it could ask for the signal."""
TRAINERS_ENV = "MAXIT_TRAINERS_DIR"
"""The folder where the run's processes record themselves."""
TRAINERS_DIR = ".maxit-trainers"
"""That folder, in the store (a URL store's: its working copy)."""

PR_SET_PDEATHSIG = 1
WATCH_SECONDS = 0.5


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot, /proc/PID/stat field 22), or
    None when there is no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: fields follow the last ')'
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def alive(pid: int, start: int | None) -> bool:
    """Whether process `pid` runs and is the one that started at `start` (not a reused pid)."""
    now = process_start(pid)
    if now is None:
        return False
    if start is not None and now != start:
        return False
    try:  # a zombie has a /proc entry but is gone
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


_PRCTL = None


def _prctl():
    """libc's prctl (None off Linux), looked up once, in the parent of any `preexec` child."""
    global _PRCTL
    if _PRCTL is None and sys.platform.startswith("linux"):
        import ctypes

        try:
            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = False
    return _PRCTL or None


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Get `sig` (SIGKILL: be killed) when the parent dies; `parent`: the pid of the process
    that started this one: a process whose parent already died before this call (it was
    re-parented) exits at once."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def preexec(then: Callable[[], None] | None = None, sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn` for a process this one starts: `die_with_parent` (this process as the
    parent, `sig` the signal), then `then`. The parent-death signal survives the child's exec.
    torchrun's launcher gets SIGTERM, on which it stops its ranks before it exits (they run in
    sessions of their own, and a rank still importing torch holds no lifeline yet)."""
    _prctl()  # looked up here, in the parent: the child only calls it
    return functools.partial(_preexec, os.getpid(), then, int(sig))


def _preexec(parent: int, then: Callable[[], None] | None, sig: int) -> None:
    die_with_parent(parent, sig)
    if then is not None:
        then()


def _parse_run(value: str | None) -> tuple[int, int | None] | None:
    if not value:
        return None
    pid, _, start = value.partition(":")
    try:
        return int(pid), (int(start) if start else None)
    except ValueError:
        return None


@contextlib.contextmanager
def run_lifeline(store_root: str | Path) -> Iterator[str]:
    """While a run lasts: its processes' environment names it (`RUN_ENV`, `RUN_ID_ENV`,
    `TRAINERS_ENV`), so each child `hold_lifeline` ties to it. Yields the run id. The environment
    is restored on exit."""
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    values = {
        RUN_ENV: f"{os.getpid()}:{process_start(os.getpid()) or ''}",
        RUN_ID_ENV: run_id,
        PARENT_ENV: str(os.getpid()),
        TRAINERS_ENV: str(Path(store_root).resolve() / TRAINERS_DIR),
    }
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield run_id
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_HELD = False


def hold_lifeline(role: str, record: bool = True) -> bool:
    """In a process a run started, first thing: die with its parent and with the run (see the
    module docstring), and, with `record`, record itself in the run's store as `role` ("lane",
    "trainer", "rank 1", ...). Once per process; a no-op outside a run (no `RUN_ENV`) and in the
    run's own process. Returns whether it holds one now."""
    global _HELD
    run = _parse_run(os.environ.get(RUN_ENV))
    if run is None or run[0] == os.getpid():
        return False
    if _HELD:
        return True
    _HELD = True
    parent = os.getppid()
    die_with_parent()
    expected = _parse_run(os.environ.get(PARENT_ENV))
    if expected is not None and expected[0] != parent and not alive(expected[0], None):
        os._exit(1)  # the process that started this one died before it got here
    if not alive(*run):  # so did the run
        os._exit(1)
    os.environ[PARENT_ENV] = str(os.getpid())
    folder = os.environ.get(TRAINERS_ENV)
    path = None
    if record and folder:
        path = _record(Path(folder), role, run)
    threading.Thread(target=_watch, args=(parent, run, path), name="maxit-lifeline", daemon=True).start()
    return True


def _watch(parent: int, run: tuple[int, int | None], path: Path | None) -> None:
    while os.getppid() == parent and alive(*run):
        time.sleep(WATCH_SECONDS)
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
    # SIGKILL, not an exit: no handler, no atexit, no half-written file made whole; its own
    # children die by their parent-death signal
    os.kill(os.getpid(), signal.SIGKILL)


def record_child(pid: int, role: str) -> Path | None:
    """Record process `pid`, which this process of a run started and which runs no maxit code
    (torchrun's launcher), as `role` in the run's store; None outside a run. The caller removes
    the file once the process ended."""
    run, folder = _parse_run(os.environ.get(RUN_ENV)), os.environ.get(TRAINERS_ENV)
    if run is None or not folder:
        return None
    return _record(Path(folder), role, run, pid, command="", at_exit=False)


def _record(folder: Path, role: str, run: tuple[int, int | None], pid: int | None = None, command: str | None = None,
            at_exit: bool = True) -> Path | None:
    import atexit

    pid = os.getpid() if pid is None else int(pid)
    record = {
        "pid": pid, "start": process_start(pid), "host": socket.gethostname(), "role": role,
        "run_pid": run[0], "run_start": run[1], "run_id": os.environ.get(RUN_ID_ENV, ""),
        "command": (" ".join(sys.argv) if command is None else command)[:300], "since": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    path = folder / f"{pid}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{pid}.json.tmp"
        tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a store this process cannot write: the watchdog still holds the tie
        return None
    if at_exit:
        atexit.register(lambda: path.unlink(missing_ok=True))
    return path


def stop_orphans(store_root: str | Path, say: Callable[[str], None], wait_seconds: float = 10.0) -> list[int]:
    """Stop the processes an earlier run of the store left running: those recorded in
    `<store_root>/.maxit-trainers/` that live on this host while their run's process does not.
    Each is named through `say` and killed (SIGKILL: its round is made again from scratch by the
    resumed run), and this waits until it is gone (up to `wait_seconds`). Records of processes
    that ended are removed; a process whose run still lives is left alone (that run holds the
    writer lock, which refuses this one). Returns the pids stopped."""
    folder = Path(store_root) / TRAINERS_DIR
    if not folder.is_dir():
        return []
    host = socket.gethostname()
    stopped: list[int] = []
    for path in sorted(folder.glob("*.json")):
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
            pid, start = int(rec["pid"]), rec.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if rec.get("host") != host:
            say(f"{path}: a process of a run on host {rec.get('host')!r} (pid {pid}); it cannot be checked from here")
            continue
        if not alive(pid, start):
            path.unlink(missing_ok=True)
            continue
        if alive(int(rec.get("run_pid", -1)), rec.get("run_start")):
            continue
        say(f"stopping pid {pid} ({rec.get('role', 'process')} of run {rec.get('run_id', '?')}, since {rec.get('since', '?')}: "
            f"{rec.get('command', '')}), left running by an earlier run of this store")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_seconds
        while alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid, start):
            from pipeline.errors import MaxitError

            raise MaxitError(f"pid {pid}, left running by an earlier run of this store, did not stop within {wait_seconds:.0f} s; stop it, then run again")
        path.unlink(missing_ok=True)
        stopped.append(pid)
    return stopped
