"""Sandbox uids: one unprivileged uid/gid per concurrent run when maxit runs as root, locked
across processes too (a lock file per uid), and the clean-up after a run: every process of the
uid killed, and outside bubblewrap the files it left in the machine's shared writable folders
removed."""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading
import time

from pipeline.sandbox.results import SandboxError

__all__ = ["UID_BASE", "UID_SLOTS", "GRACE", "SHARED_WRITABLE", "UIDS", "kill_uid", "pids_of", "remove_files_of"]

UID_BASE = 61000  # sandbox uids/gids UID_BASE .. UID_BASE + UID_SLOTS - 1 (skipping any in /etc/passwd or /etc/group)
UID_SLOTS = 64
GRACE = 2.0  # seconds to drain pipes and reap after the program ended or was killed


class _UidPool:
    """The uids UID_BASE .. UID_BASE + UID_SLOTS - 1 that are no user's or group's and run no
    process; `acquire` hands out a free one (waiting while all are taken), `release` returns it."""

    def __init__(self, base: int, slots: int):
        self.base, self.slots = base, slots
        self._cond = threading.Condition()
        self._used: dict[int, int] = {}
        self._usable: list[int] | None = None
        self._lock_dir: str | None = None

    def _setup(self) -> None:
        usable = []
        for uid in range(self.base, self.base + self.slots):
            try:
                pwd.getpwuid(uid)
                continue
            except KeyError:
                pass
            try:
                grp.getgrgid(uid)
                continue
            except KeyError:
                pass
            usable.append(uid)
        busy = _running_uids()  # a uid with processes is someone else's (another maxit's, or not ours at all)
        usable = [uid for uid in usable if uid not in busy]
        if not usable:
            raise SandboxError(f"every uid in {self.base}..{self.base + self.slots - 1} belongs to a user or group or runs processes")
        self._usable = usable
        for d in ("/run/maxit-sandbox", os.path.join(tempfile.gettempdir(), "maxit-sandbox-uids")):
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)
                st = os.lstat(d)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                    self._lock_dir = d
                    break
            except OSError:
                continue

    def acquire(self) -> tuple[int, int]:
        with self._cond:
            if self._usable is None:
                self._setup()
            while True:
                for uid in self._usable:
                    if uid in self._used:
                        continue
                    fd = -1
                    if self._lock_dir is not None:
                        fd = os.open(os.path.join(self._lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                        try:
                            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except OSError:
                            os.close(fd)
                            continue
                    self._used[uid] = fd
                    return uid, uid
                self._cond.wait(0.05)

    def release(self, uid: int) -> None:
        with self._cond:
            fd = self._used.pop(uid, -1)
            if fd >= 0:
                os.close(fd)
            self._cond.notify()


UIDS = _UidPool(UID_BASE, UID_SLOTS)
_KILL = shutil.which("kill") or "/bin/kill"


def kill_uid(uid: int, gid: int) -> None:
    """SIGKILL every process of `uid` (kill(-1) run as that uid reaches all of them, and the
    kernel holds fork off while it does), then wait (briefly) until they are reaped."""
    end = time.monotonic() + GRACE
    while pids_of(uid):
        try:
            subprocess.run([_KILL, "-9", "-1"], user=uid, group=gid, extra_groups=[], env={}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, cwd="/")
        except (OSError, subprocess.SubprocessError):
            pass
        if time.monotonic() > end:
            return
        time.sleep(0.005)


def _real_uids() -> dict[int, int]:
    """pid -> real uid of every process (zombies included), from /proc/PID/status: a process
    that changed its uid is not dumpable, and its /proc folder then belongs to root."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            found[int(name)] = int(line.split()[1])
                            break
            except (OSError, ValueError, IndexError):
                pass
    return found


def pids_of(uid: int) -> list[int]:
    """Processes (zombies included) whose real uid is `uid`."""
    return [pid for pid, u in _real_uids().items() if u == uid]


def _running_uids() -> set[int]:
    return set(_real_uids().values())


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # where any user may write, outside bubblewrap


def remove_files_of(uid: int) -> None:
    """Outside bubblewrap the program shares the machine's /tmp, /var/tmp and /dev/shm: remove
    what the sandbox uid left there (entries it owns, in those folders and in the world-writable
    folders below them)."""
    todo = [d for d in SHARED_WRITABLE if os.path.isdir(d)]
    while todo:
        folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid == uid:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    try:
                        os.unlink(entry.path)
                    except OSError:
                        pass
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002:
                todo.append(entry.path)
