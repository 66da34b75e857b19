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

A URL store (`s3://...`) is locked in its local working copy, and where its filesystem takes
conditional puts (S3 and S3 APIs) also by the writer's lease at the URL (`pipeline.store.lease`),
which makes runs on two machines see each other: the second is refused with the same error,
naming the first's host and process, until the first's lease is released or expires. A writer
that holds the working copy's flock exclusively knows that no process of a lease recorded by
this host for this working copy lives (they would hold the flock), so it takes such a lease over
at once: a run killed here is resumed here without waiting. On other filesystems (gs, memory)
only the working copy is locked. A store folder on a network filesystem is as safe as that
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
from pipeline.store import lease as leases
from pipeline.store.paths import is_url
from pipeline.store.url import canonical_url, url_of_working_copy, working_copy

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
    """Another live process is writing the store (or holds its lease at the URL: `expires`,
    the UNIX time its lease runs out unless renewed)."""

    def __init__(self, store: str | Path, holder: Holder | None, expires: float | None = None):
        self.store, self.holder = str(store), holder
        if holder is None:
            who = "another process (its details are unreadable)"
        else:
            who = holder.describe()
            if holder.host == socket.gethostname() and not _alive(holder.pid):
                if expires is None:  # the lock outlives its taker only through processes that share it (its steps)
                    who += ", which has exited while processes it started still hold the lock"
                else:
                    who += ", which has exited here; its lease at the URL runs out by " + _clock(expires)
            elif expires is not None:
                who += f" (its lease at the URL, renewed while it runs, runs out by {_clock(expires)} if it stops)"
        super().__init__(f"store {store} is being written by {who}; wait for it to finish, or stop it")


def _clock(when: float) -> str:
    return _dt.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")


@dataclass
class _Held:
    fd: int
    count: int
    holder: Holder
    lease: leases.Lease | None = None
    """A URL store's writer lease (shared by the processes of one writer)."""


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
                if held.lease is not None:
                    # the last process of this writer on this machine (no other holds the flock
                    # shared) gives the lease back; a failed conversion drops our shared lock,
                    # which is going anyway
                    last = _flock(held.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, self.store / LOCK_FILE)
                    held.lease.release(last)
                os.close(held.fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> "WriterLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(store: str | Path, command: str | None = None, token: str | None = None) -> WriterLock:
    """Take the writer lock of the store folder `store` (created if missing), or raise
    `StoreLocked` naming the process that holds it. `command` describes this writer in that
    error (default: this process's command line); `token` is the writer this process belongs to
    (default: `TOKEN_ENV`, else a new one). Re-entrant within a process.

    `store` may be a URL store, by its URL or by its working copy (the folder of a
    `pipeline.store.UrlStore` made in this process): its working copy is locked, and the writer's
    lease at the URL taken too where the filesystem has one (see the module's doc)."""
    url, root = _where(store)
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
                mine, lease = _take(fd, path, url, command, token)
            except BaseException:
                os.close(fd)
                raise
        finally:
            os.close(gate)
        _HELD[key] = _Held(fd, 1, mine, lease)
        return WriterLock(root, key, token)


def _where(store: str | Path) -> tuple[str | None, Path]:
    """(URL of a URL store or None, the folder locked: the store or the URL store's working copy)."""
    if is_url(store):
        url = canonical_url(str(store))
        return url, working_copy(url)
    return url_of_working_copy(store), Path(store)


def _take(fd: int, path: Path, url: str | None, command: str | None, token: str) -> tuple[Holder, leases.Lease | None]:
    """Behind the gate: take the flock of the lock file `fd` (exclusively, or shared by joining a
    holder with `token`) and, for a URL store with leases, the writer's lease. Raises
    `StoreLocked` naming the holder of either."""
    if _flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, path):
        mine = Holder(os.getpid(), socket.gethostname(), command or command_line(), _now(), token)
        _write(fd, mine)
        lease = _lease(url, mine, path.parent, exclusive=True)
        # shared from now on, so the other processes of this writer can join; the change is not
        # atomic, but every acquirer waits at the gate we hold
        _flock(fd, fcntl.LOCK_SH, path)
        return mine, lease
    mine = _read(fd)
    if mine is None or mine.token != token:
        raise StoreLocked(url or path.parent, mine)
    if not _flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, path):  # cannot happen behind the gate
        raise StoreLocked(url or path.parent, mine)
    return mine, _lease(url, mine, path.parent, exclusive=False)


def _lease(url: str | None, holder: Holder, copy: Path, exclusive: bool) -> leases.Lease | None:
    """The writer's lease of the URL store `url` for `holder`, or None where there is none to
    take. With `exclusive` (this process holds the working copy's flock alone), a lease that
    this host recorded for this working copy is a dead writer's and is taken over at once."""
    if url is None or not leases.supports_leases(url):
        return None
    record = dict(asdict(holder), copy=str(copy.resolve()))

    def dead_here(other: dict) -> bool:
        return exclusive and other.get("host") == holder.host and other.get("copy") == record["copy"]

    try:
        return leases.take(url, record, may_replace=dead_here)
    except leases.LeaseHeld as err:
        other = err.record or {}
        try:
            who = Holder(**{f: other[f] for f in Holder.__dataclass_fields__})
        except (KeyError, TypeError):
            who = None
        raise StoreLocked(url, who, expires=float(other.get("expires", 0))) from None


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
    """Who holds the store's writer lock now, or None when nobody does (nothing is written). For
    a URL store (its URL or working copy): who holds its working copy's lock."""
    root = _where(store)[1]
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
