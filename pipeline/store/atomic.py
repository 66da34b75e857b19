"""Writes a reader sees whole or not at all: a file (`atomic_write`: a temporary sibling, fsync,
rename) and a folder (`atomic_dir`: built under a temporary name while its builder holds a lock,
renamed into place), and the sweep of what a killed builder left (`clear_dead_builds`)."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

__all__ = ["atomic_write", "atomic_write_bytes", "atomic_write_text", "atomic_dir", "clear_dead_builds", "fsync_dir", "file_mode"]


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_mode(base: int) -> int:
    """`base` as the process umask lets a new file or directory have it."""
    umask = os.umask(0)
    os.umask(umask)
    return base & ~umask


def atomic_write(path: str | Path, fill: Callable[[str], None]) -> Path:
    """The one way a local file is written whole: `fill(tmp)` writes the temporary sibling
    `<path>.tmp-<random>`, which is fsynced and renamed over `path`. On any error the temporary
    file is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        os.chmod(tmp, file_mode(0o666))  # mkstemp makes it owner-only; a table is as readable as any file
        fill(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_bytes(path: str | Path, body: bytes) -> Path:
    """`body` as the local file `path`, all or nothing (`atomic_write`)."""
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(body))


def atomic_write_text(path: str | Path, text: str) -> Path:
    """`text` (UTF-8) as the local file `path`, all or nothing."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def clear_dead_builds(path: str | Path) -> list[Path]:
    """Remove what `atomic_dir(path)` leaves when its process is killed before it can clean up
    (SIGKILL, the OOM killer: a model build, a checkpoint). A build holds an exclusive `flock` on
    its `<tmp>.lock` file from before that file has its name until the build ends, and the kernel
    drops the lock with the process, so a lock that can be taken is a dead build's: its
    temporary folder is removed, and the previous `path` it moved aside (`<tmp>.old`) too once
    `path` exists again. A `<tmp>.old` while `path` is missing is the only whole copy (the build
    died between its two renames): it is kept, for a person to move back; the sweep never writes
    `path`, so it cannot collide with a live build's swap. A live build's lock cannot be taken,
    whatever host or container runs it, so its folders are left alone; so are temporary folders
    without a lock file (a build killed before it made one, or an older maxit). Returns the
    temporary folders removed."""
    path = Path(path)
    removed = []
    for lock in path.parent.glob(f".{glob.escape(path.name)}.tmp-*.lock"):
        stem = lock.with_name(lock.name[: -len(".lock")])
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:  # its build just ended
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino != os.stat(lock).st_ino:  # unlinked by its build as it ended
                    continue
            except OSError:  # a live build (or the file went away)
                continue
            old = stem.with_name(stem.name + ".old")
            if stem.exists():
                shutil.rmtree(stem, ignore_errors=True)
                removed.append(stem)
            if old.is_dir() and not path.exists():  # the lock stays: the next sweep removes `old` once `path` is back
                log.warning("%s: a build died between its two renames; the previous %s is kept at %s", path, path.name, old)
            else:
                shutil.rmtree(old, ignore_errors=True)
                lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return removed


def _lock_build(tmp: Path) -> int | None:
    """Take the build's lock (`clear_dead_builds`): made under a name the sweep does not match,
    locked, then renamed, so no sweep ever sees it unlocked. None where the filesystem has no
    `flock` (the build then runs unmarked, as before locks)."""
    staging = tmp.with_name(tmp.name + ".lock.new")
    fd = os.open(staging, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(staging, tmp.with_name(tmp.name + ".lock"))
        return fd
    except OSError:
        os.close(fd)
        staging.unlink(missing_ok=True)
        return None


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Build a directory atomically: yields a temporary sibling to fill; on success it replaces
    `path` (an existing `path` is moved aside first and removed after), on error it is deleted
    and `path` is untouched. The build holds a lock on `<tmp>.lock` while it runs, so a later
    `atomic_dir` of the same path removes what a killed one left (`clear_dead_builds`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_dead_builds(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    lock = tmp.with_name(tmp.name + ".lock")
    fd = _lock_build(tmp)
    try:
        os.chmod(tmp, file_mode(0o777))  # mkdtemp makes it owner-only
        yield tmp
        old = None
        if path.exists():
            old = tmp.with_name(tmp.name + ".old")
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:  # put the previous directory back
                os.replace(old, path)
            raise
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)  # before the lock goes: a sweep that opened it sees another inode or none
            os.close(fd)


