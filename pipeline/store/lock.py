"""One writer per store: `maxit run`, and each asset materialization a Dagster UI run starts,
hold the store's writer lock while they write, and a second writer stops at once with a
`StoreLocked` error naming the first (pid, host, command, since when).

The lock is `flock(2)` on `<store>/.maxit-writer.lock`, so the kernel releases it when its holder
dies, however it dies (SIGKILL, OOM): a crashed run never blocks the next, and nothing has to
decide whether a recorded pid is stale. The file also holds the holder's details (JSON), written
by the process that took the lock, for the error message.

Who counts as one writer:

- one process: `acquire` is re-entrant per process (a `maxit run` holds the lock for the whole
  run, and the Dagster resources of the rounds it materializes in-process acquire it again);
- the processes of one run, by a shared token: the steps of a run on the multiprocess executor
  (`maxit run --shards N`, whose children inherit the token through `TOKEN_ENV`, or one Dagster
  UI run, whose token is its run id) may hold the lock together. The first takes it exclusively,
  writes its details, then holds it shared; a process with the same token joins it shared, a
  process with another token is refused. A short exclusive lock on a second file (the gate)
  makes the check-and-join one step.

Not covered: two machines. A URL store (`s3://...`) is locked in its local working copy, so
two runs on one machine exclude each other, but runs on two machines (each with its own working
copy) do not see each other's lock. A store folder on a network filesystem is as safe as that
filesystem's `flock` (NFS emulates it with byte-range locks; some FUSE filesystems refuse it,
which is an error here, not a silent pass).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from pipeline.errors import MaxitError

__all__ = ["LOCK_FILE", "TOKEN_ENV", "Holder", "StoreLocked", "WriterLock", "acquire", "writer_lock", "holder", "token_in_env", "command_line"]

LOCK_FILE = ".maxit-writer.lock"
"""The lock file, in the store's folder (a URL store's: in its local working copy)."""

GATE_FILE = LOCK_FILE + ".gate"

TOKEN_ENV = "MAXIT_WRITER_TOKEN"
"""Environment variable naming the token of the writer a process belongs to: `maxit run` sets it
while it holds the lock, so the step processes it starts join its lock instead of being refused."""


@dataclass(frozen=True)
class Holder:
    """Who took the lock: what the error of a refused writer names."""

    pid: int
    """Process id of the process that took the lock."""
    host: str
    """Host name it runs on."""
    command: str
    """Its command line (`maxit run ...`), or the Dagster run it serves."""
    since: str
    """When it took the lock (local time, ISO 8601, seconds)."""
    token: str
    """The writer it belongs to; processes with the same token share the lock."""

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} ({self.command}), since {self.since}"


class StoreLocked(MaxitError):
    """Another live process is writing the store."""

    def __init__(self, store: str | Path, holder: Holder | None):
        self.store, self.holder = str(store), holder
        if holder is None:
            who = "another process (its details are unreadable)"
        else:
            who = holder.describe()
            if holder.host == socket.gethostname() and not _alive(holder.pid):
                # the lock outlives its taker only through processes that share it (its steps)
                who += ", which has exited while processes it started still hold the lock"
        super().__init__(f"store {store} is being written by {who}; wait for it to finish, or stop it")


@dataclass
class _Held:
    fd: int
    count: int
    holder: Holder


_HELD: dict[str, _Held] = {}
"""This process's locks, by the lock file's resolved path."""
_MUTEX = threading.Lock()


def _forget_inherited() -> None:
    # a child made by fork() shares the parent's open lock files, and with them the flock: were
    # it to outlive its parent (an engine worker, say), the store would stay locked by a process
    # that is not writing it. The child lets go; a child that writes joins by token.
    global _MUTEX
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()
    _MUTEX = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_inherited)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    return True


def command_line(argv: list[str] | None = None) -> str:
    """The command a process was started with, its program by name (`maxit run --rounds 5`)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    return " ".join([Path(argv[0]).name, *argv[1:]])


def _read(fd: int) -> Holder | None:
    try:
        raw = os.pread(fd, 65536, 0)
        return Holder(**json.loads(raw.decode()))
    except (OSError, ValueError, TypeError):  # empty, torn or from another version
        return None


def _write(fd: int, holder: Holder) -> None:
    data = (json.dumps(asdict(holder), sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _flock(fd: int, op: int, path: Path) -> bool:
    """flock; False when another process holds a conflicting lock (non-blocking ops)."""
    try:
        fcntl.flock(fd, op)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise MaxitError(f"cannot lock {path}: {err.strerror} (the store's filesystem does not support flock)") from None
    return True


class WriterLock:
    """This process's hold on a store's writer lock (one `acquire`); `release()` once."""

    def __init__(self, store: Path, key: str, token: str):
        self.store, self._key, self.token = store, key, token
        self._released = False

    def release(self) -> None:
        with _MUTEX:
            if self._released:
                return
            self._released = True
            held = _HELD.get(self._key)
            if held is None:  # forgotten after a fork
                return
            held.count -= 1
            if held.count == 0:
                del _HELD[self._key]
                os.close(held.fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(store: str | Path, command: str | None = None, token: str | None = None) -> WriterLock:
    """Take the writer lock of the store folder `store` (created if missing), or raise
    `StoreLocked` naming the process that holds it. `command` describes this writer in that
    error (default: this process's command line); `token` is the writer this process belongs to
    (default: `TOKEN_ENV`, else a new one). Re-entrant within a process."""
    root = Path(store)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    key = str(path.resolve())
    with _MUTEX:
        held = _HELD.get(key)
        if held is not None:
            held.count += 1
            return WriterLock(root, key, held.holder.token)
        token = token or os.environ.get(TOKEN_ENV) or uuid.uuid4().hex
        gate = _open(root / GATE_FILE)
        try:
            _flock(gate, fcntl.LOCK_EX, root / GATE_FILE)  # held only while a writer checks the lock
            fd = _open(path)
            try:
                if _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path):
                    mine = Holder(os.getpid(), socket.gethostname(), command or command_line(), _now(), token)
                    _write(fd, mine)
                    # shared from now on, so the other processes of this writer can join; the
                    # change is not atomic, but every acquirer waits at the gate we hold
                    _flock(fd, fcntl.LOCK_SH, path)
                else:
                    mine = _read(fd)
                    if mine is None or mine.token != token:
                        raise StoreLocked(root, mine)
                    if not _flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path):  # cannot happen behind the gate
                        raise StoreLocked(root, mine)
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(gate)
        _HELD[key] = _Held(fd, 1, mine)
        return WriterLock(root, key, token)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise MaxitError(f"cannot open the store's lock file {path}: {err.strerror}") from None


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


@contextlib.contextmanager
def writer_lock(store: str | Path, command: str | None = None, token: str | None = None) -> Iterator[WriterLock]:
    """`acquire` for a `with` block."""
    lock = acquire(store, command, token)
    try:
        yield lock
    finally:
        lock.release()


@contextlib.contextmanager
def token_in_env(token: str) -> Iterator[None]:
    """`TOKEN_ENV` set to `token` for the block, so processes started in it join this writer."""
    before = os.environ.get(TOKEN_ENV)
    os.environ[TOKEN_ENV] = token
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TOKEN_ENV, None)
        else:
            os.environ[TOKEN_ENV] = before


def holder(store: str | Path) -> Holder | None:
    """Who holds the store's writer lock now, or None when nobody does (nothing is written)."""
    root = Path(store)
    path = root / LOCK_FILE
    if not path.is_file():
        return None
    key = str(path.resolve())
    with _MUTEX:
        if key in _HELD:
            return _HELD[key].holder
    gate = _open(root / GATE_FILE)
    try:
        # behind the gate: our brief probe must not make a writer checking the lock refuse itself
        _flock(gate, fcntl.LOCK_EX, root / GATE_FILE)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            # a shared lock is held while it runs, so "free" is: exclusive succeeds (given back at once)
            if _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None
            return _read(fd)
        finally:
            os.close(fd)
    finally:
        os.close(gate)
