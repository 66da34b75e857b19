"""Run untrusted, model-written Python in a sandbox: `run_program`, `run_many`, and the
unforgeable test runner `run_tests` for rewards. What each layer guards against, and what stays
visible without bubblewrap: docs/SANDBOX.md.

Layers, outermost first:

- isolation "bwrap": bubblewrap with new network, PID, IPC and UTS namespaces and a mount
  namespace holding only /usr (and the /lib*, /bin symlinks), the Python installation read-only,
  a fresh /proc, a minimal /dev, an empty /tmp and the program's own folder (read-write, at
  /sandbox). "netns": no bubblewrap, only a network namespace (unshare(CLONE_NEWNET) in the
  child before it runs the program); the file system stays the host's. "none": neither (only
  with allow_unisolated_network=True).
- a supervisor (root, inside the sandbox) forks the program and reports its exact wait status
  and CPU time on a pipe the program cannot write to;
- the program: its own session and process group, resource limits (RLIMIT_CPU, RLIMIT_AS,
  RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no core files), an unprivileged uid/gid of its own
  when maxit runs as root (one of UID_BASE .. UID_BASE + UID_SLOTS - 1, no supplementary groups,
  no_new_privs), a minimal environment, stdin closed, stdout and stderr read with a cap (the rest
  read and discarded), an empty temporary folder removed afterwards;
- afterwards the process group is killed whole and every process of the sandbox uid is killed
  (kill -9 -1 run as that uid) before the folder is removed and the uid is reused.

Nothing here imports Dagster.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import json
import math
import grp
import os
import pwd
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from pipeline.errors import MaxitError

__all__ = [
    "STATUSES",
    "SandboxError",
    "SandboxUnavailable",
    "SandboxResult",
    "TestCase",
    "TestResult",
    "TestReport",
    "available_isolation",
    "isolation_report",
    "parse_tests",
    "run_program",
    "run_many",
    "run_tests",
    "run_tests_many",
]

STATUSES = ("ok", "failed", "timeout", "killed", "error")
ISOLATIONS = ("bwrap", "netns", "none")

UID_BASE = 61000  # sandbox uids/gids UID_BASE .. UID_BASE + UID_SLOTS - 1 (skipping any in /etc/passwd or /etc/group)
UID_SLOTS = 64
BOX_INSIDE = "/sandbox"  # the program's folder inside bubblewrap
OUTPUT_CAP = 64 * 1024  # bytes of stdout and of stderr kept
CHANNEL_CAP = 4 * 1024 * 1024  # bytes of run_tests results kept
PROGRAM_NAME = "main.py"
TESTS_NAME = "tests.json"
_GRACE = 2.0  # seconds to drain pipes and reap after the program ended or was killed


class SandboxError(MaxitError, ValueError):
    """Bad arguments to the sandbox (a limit out of range, a test that cannot be checked)."""


class SandboxUnavailable(MaxitError, RuntimeError):
    """The sandbox refuses to start: the network isolation it needs is missing here."""


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class SandboxResult:
    """One program's outcome. status: ok (exit 0), failed (nonzero exit or an uncaught
    exception), timeout (wall clock or CPU time limit), killed (a signal, or the memory limit),
    error (the sandbox itself could not start the program). exit_code: the program's exit code,
    -N when signal N ended it, None when it never ran. reason: a short named reason."""

    status: str
    exit_code: int | None
    seconds: float
    reason: str
    stdout: str = ""
    stderr: str = ""
    isolation: str = "none"
    user: str = ""
    truncated: bool = False
    cpu_seconds: float | None = None

    def summary(self) -> dict:
        """status, exit_code, seconds, reason, isolation, user: the one-line record."""
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "reason": self.reason,
            "isolation": self.isolation,
            "user": self.user,
        }

    def to_json(self) -> str:
        """`summary()` as one line of JSON (no stdout/stderr)."""
        return json.dumps(self.summary(), separators=(", ", ": "))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TestCase:
    """`expr` is evaluated in the candidate's namespace inside the sandbox; `expected` stays in
    the parent and is never shown to the candidate."""

    __test__ = False  # not a pytest class
    expr: str
    expected: Any


@dataclass(frozen=True)
class TestResult:
    __test__ = False
    expr: str
    expected: str  # repr
    passed: bool
    actual: str | None = None  # repr of the value the candidate produced
    error: str | None = None  # why it failed, when it did not produce a comparable value


@dataclass(frozen=True)
class TestReport:
    """Per-test verdicts decided in the parent by comparing the candidate's values with the
    expected values (plain Python values on both sides); see `run_tests`."""

    __test__ = False
    results: tuple[TestResult, ...]
    sandbox: SandboxResult
    load_error: str | None = None

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def all_passed(self) -> bool:
        return bool(self.results) and self.passed == self.total

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.results else 0.0

    def summary(self) -> dict:
        return {
            "passed": self.passed,
            "total": self.total,
            "tests": [r.passed for r in self.results],
            "load_error": self.load_error,
            **{f"sandbox_{k}": v for k, v in self.sandbox.summary().items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.summary(), separators=(", ", ": "))


# --------------------------------------------------------------------------------------------
# The code that runs inside the sandbox. It is started as `python -s -B -c _BOOT ARGS...` with
# its working folder as the current directory; it starts as root when maxit runs as root.

_BOOT = r'''
import os, sys

def _describe(e):
    try:
        text = "%s: %s" % (type(e).__name__, e)
    except BaseException:
        text = type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."

def _print_exception(e):
    try:
        import traceback
        tb = e.__traceback__
        tb = tb.tb_next if tb is not None else None
        traceback.print_exception(type(e), e, tb)
    except BaseException:
        try:
            os.write(2, (_describe(e) + "\n").encode("utf-8", "replace"))
        except BaseException:
            pass

def _run(prog):
    import types
    mod = types.ModuleType("__main__")
    mod.__file__ = prog
    mod.__builtins__ = __builtins__
    sys.modules["__main__"] = mod
    sys.argv = [prog]
    with open(prog, "rb") as f:
        src = f.read()
    try:
        code = compile(src, prog, "exec")
        exec(code, mod.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        if isinstance(e, MemoryError):
            os.write(2, b"MemoryError\n")
        else:
            _print_exception(e)
        raise SystemExit(1)

def _enc(v, d=0):
    if d > 100:
        raise ValueError("value nested too deeply")
    if v is None:
        return ["n"]
    if v is True or v is False:
        return ["b", v is True]
    if isinstance(v, int):
        return ["i", format(int.__int__(v), "x")]
    if isinstance(v, float):
        return ["f", float.hex(float.__float__(v))]
    if isinstance(v, complex):
        c = complex.__complex__(v)
        return ["c", float.hex(c.real), float.hex(c.imag)]
    if isinstance(v, str):
        return ["s", str.__str__(v)]
    if isinstance(v, (bytes, bytearray)):
        return ["y", bytes(memoryview(v)).hex()]
    if isinstance(v, list):
        return ["l", [_enc(x, d + 1) for x in list.__iter__(v)]]
    if isinstance(v, tuple):
        return ["t", [_enc(x, d + 1) for x in tuple.__iter__(v)]]
    if isinstance(v, dict):
        return ["d", [[_enc(k, d + 1), _enc(x, d + 1)] for k, x in dict.items(v)]]
    if isinstance(v, frozenset):
        return ["F", [_enc(x, d + 1) for x in frozenset.__iter__(v)]]
    if isinstance(v, set):
        return ["S", [_enc(x, d + 1) for x in set.__iter__(v)]]
    raise TypeError("unsupported result type " + type.__getattribute__(type(v), "__name__"))

def _harness(prog, tests_path, rfd):
    import json, types
    write, dumps, exit_ = os.write, json.dumps, os._exit
    def emit(obj):
        data = (dumps(obj, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[write(rfd, data):]
    with open(tests_path) as f:
        exprs = json.load(f)
    with open(prog, "rb") as f:
        src = f.read()
    mod = types.ModuleType("solution")
    mod.__file__ = prog
    mod.__builtins__ = __builtins__
    sys.modules["solution"] = mod
    sys.argv = [prog]
    try:
        exec(compile(src, prog, "exec"), mod.__dict__)
    except BaseException as e:
        try:
            emit({"load": _describe(e)})
        finally:
            exit_(1)
    for i, expr in enumerate(exprs):
        try:
            rec = {"i": i, "v": _enc(eval(compile(expr, "<test %d>" % i, "eval"), mod.__dict__))}
        except BaseException as e:
            rec = {"i": i, "e": _describe(e)}
        try:
            emit(rec)
        except BaseException:
            exit_(3)
    try:
        emit({"done": len(exprs)})
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        exit_(0)

def _quit(code=None):
    raise SystemExit(code)

def _boot():
    import builtins
    builtins.exit = builtins.quit = _quit  # what site would have defined
    mode, sfd, rfd, uid, gid, iso, lim, prog, extra = sys.argv[1:10]
    sfd, rfd, uid, gid = int(sfd), int(rfd), int(uid), int(gid)
    lo = 3
    for fd in sorted(x for x in (sfd, rfd) if x >= 0):
        os.closerange(lo, fd)
        lo = fd + 1
    os.closerange(lo, 65536)
    libc = None
    if iso != "bwrap":
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
    if iso.startswith("netns"):
        flags = 0x40000000 | (0x10000000 if iso == "netns-user" else 0)
        if libc.unshare(flags) != 0:
            os.write(2, ("unshare(CLONE_NEWNET) failed: %s\n" % os.strerror(ctypes.get_errno())).encode())
            os._exit(125)
    supervisor = os.getpid()
    if libc is not None:
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the program's orphans are reaped here
    pid = os.fork()
    if pid:
        if rfd >= 0:
            os.close(rfd)
        _, status, ru = os.wait4(pid, 0)
        os.write(sfd, ("X %d %.4f %d\n" % (status, ru.ru_utime + ru.ru_stime, ru.ru_maxrss)).encode())
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    import resource as R, types
    if mode != "run":
        import json
    mem, cpu, nproc, fsize, nofile = (int(x) for x in lim.split(","))
    R.setrlimit(R.RLIMIT_CORE, (0, 0))
    R.setrlimit(R.RLIMIT_CPU, (cpu, cpu + 1))
    R.setrlimit(R.RLIMIT_FSIZE, (fsize, fsize))
    R.setrlimit(R.RLIMIT_NOFILE, (nofile, nofile))
    if uid >= 0:
        R.setrlimit(R.RLIMIT_NPROC, (nproc, nproc))
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
            os._exit(125)
    if libc is not None:
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            os._exit(125)
        libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG: SIGKILL when the supervisor dies
        if os.getppid() != supervisor:
            os._exit(125)
    R.setrlimit(R.RLIMIT_AS, (mem, mem))
    os.write(sfd, b"S")
    os.close(sfd)
    if mode == "run":
        _run(prog)
    else:
        _harness(prog, extra, rfd)

_boot()
'''


# --------------------------------------------------------------------------------------------
# Isolation: which layers this machine offers (probed once per process)


@functools.lru_cache(maxsize=None)
def _interpreter(python: str | None) -> tuple[str, tuple[str, ...]]:
    """The real interpreter (a venv's python resolves to its base installation: the sandbox gets
    the standard library, not the venv's packages) and the folders it needs outside /usr."""
    if python is None:
        exe = os.path.realpath(sys.executable)
        prefixes = [sys.base_prefix, sys.base_exec_prefix]
    else:
        found = shutil.which(python)
        if found is None:
            raise SandboxError(f"no Python interpreter {python!r}")
        exe = os.path.realpath(found)
        try:
            res = subprocess.run([exe, "-S", "-c", "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"],
                                 capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError) as err:
            raise SandboxError(f"{python!r} does not run: {err}") from None
        if res.returncode != 0:
            raise SandboxError(f"{python!r} is not a working Python interpreter")
        prefixes = res.stdout.split()
    roots = {os.path.dirname(os.path.dirname(exe)), *(os.path.realpath(p) for p in prefixes)}
    roots = {r for r in roots if r not in ("/", "/usr") and not r.startswith("/usr/")}
    return exe, tuple(sorted(r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots)))


def _bwrap_argv(box: str, roots: Sequence[str]) -> list[str]:
    a = [shutil.which("bwrap") or "bwrap", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
         "--unshare-cgroup-try", "--die-with-parent", "--hostname", "sandbox"]
    if os.geteuid() != 0:
        a.append("--unshare-user")
    a += ["--ro-bind", "/usr", "/usr"]
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            a += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            a += ["--ro-bind", name, name]
    a += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    made = set()
    for root in roots:
        parts = root.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/" + "/".join(parts[:i])
            if d not in made:
                made.add(d)
                a += ["--perms", "0755", "--dir", d]
        a += ["--ro-bind", root, root]
    a += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", box, BOX_INSIDE, "--chdir", BOX_INSIDE, "--"]
    return a


_PROBE = "import json, socket, traceback, os\nprint('ok' if os.getuid() != 0 or os.geteuid() != 0 else 'root')\n"


@functools.lru_cache(maxsize=None)
def _probe(kind: str, python: str | None = None) -> str | None:
    """None when isolation `kind` works here (a program runs in it, unprivileged, and imports
    from the standard library), else why not, on one line."""
    if kind == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap: not installed (apt-get install bubblewrap)"
    res, _ = _execute("run", _PROBE, None, iso=kind, python=python, timeout=30, memory_mb=256, cpu_seconds=None,
                      max_processes=32, file_mb=1, max_open_files=64, output_cap=4096, work_root=None)
    if res.status == "ok" and res.stdout.strip() == "ok":
        return None
    lines = [l.strip() for l in res.stderr.splitlines() if l.strip()]
    why = lines[-1] if lines else res.reason
    if kind == "bwrap":
        return f"bwrap: cannot create its sandbox here ({why})"[:300]
    exe = _interpreter(python)[0]
    return f"netns: no program ran unprivileged with {exe} in a network namespace of its own ({why})"[:300]


def available_isolation(python: str | None = None) -> str:
    """The strongest isolation that works here: "bwrap", "netns" or "none"."""
    for kind in ("bwrap", "netns"):
        if _probe(kind, python) is None:
            return kind
    return "none"


def isolation_report(python: str | None = None) -> dict:
    """What is active on this machine and why the missing layers are missing."""
    root = os.geteuid() == 0
    return {
        "isolation": available_isolation(python),
        "bwrap": _probe("bwrap", python) or "ok",
        "netns": _probe("netns", python) or "ok",
        "user": f"uids {UID_BASE}..{UID_BASE + UID_SLOTS - 1}, dropped from root" if root else f"the caller's uid {os.getuid()} (maxit does not run as root)",
        "python": _interpreter(python)[0],
    }


def _choose(isolation: str, allow_unisolated_network: bool, python: str | None = None) -> str:
    if isolation not in ("auto", *ISOLATIONS):
        raise SandboxError(f"isolation must be auto, bwrap, netns or none, not {isolation!r}")
    if isolation == "auto":
        isolation = available_isolation(python)
    elif isolation != "none" and _probe(isolation, python) is not None:
        raise SandboxUnavailable(f"isolation {isolation} is not available here: {_probe(isolation, python)}")
    if isolation == "none" and not allow_unisolated_network:
        raise SandboxUnavailable(
            "refusing to run without network isolation: "
            f"{_probe('bwrap', python)}; {_probe('netns', python)} "
            "(allow_unisolated_network=True / --allow-network-unisolated runs it with the machine's network)"
        )
    return isolation


# --------------------------------------------------------------------------------------------
# Sandbox uids: one per concurrent run, locked across processes too


class _UidPool:
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


_UIDS = _UidPool(UID_BASE, UID_SLOTS)
_KILL = shutil.which("kill") or "/bin/kill"


def _kill_uid(uid: int, gid: int) -> None:
    """SIGKILL every process of `uid` (kill(-1) run as that uid reaches all of them, and the
    kernel holds fork off while it does), then wait (briefly) until they are reaped."""
    end = time.monotonic() + _GRACE
    while _pids_of(uid):
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


def _pids_of(uid: int) -> list[int]:
    """Processes (zombies included) whose real uid is `uid`."""
    return [pid for pid, u in _real_uids().items() if u == uid]


def _running_uids() -> set[int]:
    return set(_real_uids().values())


SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # where any user may write, outside bubblewrap


def _remove_files_of(uid: int) -> None:
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


# --------------------------------------------------------------------------------------------
# Running one program


def _env(home: str, tmp: str) -> dict:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": tmp,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONUTF8": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap) -> None:
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise SandboxError(f"timeout must be a positive number of seconds, not {timeout!r}")
    if not (isinstance(memory_mb, int) and memory_mb >= 32):
        raise SandboxError(f"memory_mb must be an integer >= 32 (Python itself needs about 20 MB), not {memory_mb!r}")
    if cpu_seconds is not None and not (isinstance(cpu_seconds, (int, float)) and cpu_seconds > 0):
        raise SandboxError(f"cpu_seconds must be positive, not {cpu_seconds!r}")
    for name, value, least in (("max_processes", max_processes, 1), ("file_mb", file_mb, 1), ("max_open_files", max_open_files, 16), ("output_cap", output_cap, 0)):
        if not (isinstance(value, int) and value >= least):
            raise SandboxError(f"{name} must be an integer >= {least}, not {value!r}")


class _Capped:
    def __init__(self, cap: int):
        self.cap, self.parts, self.kept, self.total = cap, [], 0, 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self.kept
        if room > 0:
            piece = data[:room]
            self.parts.append(piece)
            self.kept += len(piece)

    @property
    def truncated(self) -> bool:
        return self.total > self.kept

    def bytes(self) -> bytes:
        return b"".join(self.parts)

    def text(self) -> str:
        return self.bytes().decode("utf-8", "replace")


def _exited(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_all(proc: subprocess.Popen, uid: int, gid: int, sweep: bool = True) -> None:
    """Every process of the sandbox uid first (outside bubblewrap the supervisor, still alive,
    reaps them), then the whole process group (the leader is not reaped yet: the group id is
    still ours). Inside bubblewrap, killing the group takes the PID namespace's init with it,
    and the kernel kills the rest of the namespace."""
    if sweep and uid >= 0:
        _kill_uid(uid, gid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(proc: subprocess.Popen, status_fd: int, chan_fd: int, deadline: float, caps: tuple[int, int, int], uid: int, gid: int,
          pid_namespace: bool):
    """Read stdout, stderr, the status pipe and the results channel until they close, keeping the
    first `caps` bytes of each and discarding the rest; kill everything at the deadline. Returns
    (stdout, stderr, status, channel, timed_out)."""
    out, err, chan = _Capped(caps[0]), _Capped(caps[1]), _Capped(caps[2])
    st = _Capped(4096)
    sel = selectors.DefaultSelector()
    for f, buf in ((proc.stdout.fileno(), out), (proc.stderr.fileno(), err), (status_fd, st), (chan_fd, chan)):
        if f >= 0:
            os.set_blocking(f, False)
            sel.register(f, selectors.EVENT_READ, buf)
    timed_out = ended = False
    stop = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if not ended and now >= deadline:
                timed_out = ended = True
                _kill_all(proc, uid, gid)
                stop = time.monotonic() + _GRACE
            if stop is not None and now >= stop:
                break
            wait = (stop if stop is not None else deadline) - now
            for key, _ in sel.select(max(0.0, min(wait, 0.05))):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if data:
                    key.data.add(data)
                else:
                    sel.unregister(key.fd)
            if not ended and (b"X" in st.bytes() or _exited(proc.pid)):
                # the program ended: whatever it left behind (holding the pipes open) goes now
                ended = True
                _kill_all(proc, uid, gid, sweep=not pid_namespace)
                stop = time.monotonic() + _GRACE
    finally:
        sel.close()
    return out, err, st.bytes().decode("ascii", "replace"), chan.bytes(), timed_out


def _classify(*, timed_out: bool, started: bool, wait_status: int | None, rc: int, cpu: float | None, stderr: str,
              timeout: float, cpu_limit: int, memory_mb: int) -> tuple[str, int | None, str]:
    """(status, exit_code, reason)."""
    tail = [l.strip() for l in stderr.splitlines() if l.strip()]
    last = tail[-1] if tail else ""
    if timed_out:
        return "timeout", -signal.SIGKILL, f"wall-clock timeout after {timeout:g}s"
    if not started:
        why = last or f"exit code {rc}"
        return "error", None, f"the sandbox could not start the program: {why}"[:200]
    if wait_status is not None:
        code = os.waitstatus_to_exitcode(wait_status)
    else:  # the supervisor died before it could report (should not happen)
        code = rc if rc < 128 else -(rc - 128)
    if code < 0:
        sig = -code
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        over_cpu = cpu is not None and cpu >= cpu_limit - 0.05
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and over_cpu):
            return "timeout", code, f"CPU time limit ({cpu_limit}s)"
        if sig == signal.SIGXFSZ:
            return "killed", code, "file size limit"
        if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT):
            return "killed", code, f"killed by {name} (memory limit {memory_mb} MB?)"
        return "killed", code, f"killed by {name}"
    if code == 0:
        return "ok", 0, "exit code 0"
    if last.startswith("MemoryError"):
        return "killed", code, f"memory limit ({memory_mb} MB)"
    detail = f": {last}" if last and not last.startswith("Traceback") else ""
    return "failed", code, f"exit code {code}{detail}"[:200]


def _execute(mode: str, source: str, tests_json: str | None, *, iso: str, python: str | None, timeout: float, memory_mb: int,
             cpu_seconds: float | None, max_processes: int, file_mb: int, max_open_files: int, output_cap: int,
             work_root: str | None) -> tuple[SandboxResult, bytes]:
    """Run `source` (mode "run") or the test harness on it (mode "tests") under isolation `iso`
    (already chosen); returns the result and the raw results channel."""
    exe, roots = _interpreter(python)
    root = os.geteuid() == 0
    uid, gid = _UIDS.acquire() if root else (-1, -1)
    user = f"uid {uid}" if root else f"caller uid {os.getuid()}"
    cpu_limit = max(1, math.ceil(cpu_seconds if cpu_seconds is not None else timeout))
    outer = None
    t0 = time.monotonic()
    try:
        outer = tempfile.mkdtemp(prefix="maxit-sandbox-", dir=work_root)
        os.chmod(outer, 0o711)
        box = os.path.join(outer, "box")
        os.mkdir(box, 0o700)
        for name, text in ((PROGRAM_NAME, source), (TESTS_NAME, tests_json)):
            if text is not None:
                with open(os.path.join(box, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                    f.write(text)
                os.chmod(os.path.join(box, name), 0o644)
        if root:
            os.chown(box, uid, gid)
        inside = BOX_INSIDE if iso == "bwrap" else box
        prefix = _bwrap_argv(box, roots) if iso == "bwrap" else []
        boot_iso = iso if (iso != "netns" or root) else "netns-user"
        status_r, status_w = os.pipe()
        chan_r, chan_w = os.pipe() if mode == "tests" else (-1, -1)
        limits = f"{memory_mb * 1024 * 1024},{cpu_limit},{max_processes},{file_mb * 1024 * 1024},{max_open_files}"
        argv = [*prefix, exe, "-S", "-B", "-c", _BOOT, mode, str(status_w), str(chan_w), str(uid), str(gid), boot_iso, limits,
                PROGRAM_NAME, TESTS_NAME]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=tuple(f for f in (status_w, chan_w) if f >= 0), cwd=box,
                                    env=_env(inside, inside), start_new_session=True)
        except OSError as err:
            for f in (status_r, status_w, chan_r, chan_w):
                if f >= 0:
                    os.close(f)
            return SandboxResult("error", None, time.monotonic() - t0, f"the sandbox could not start: {err}"[:200],
                                 isolation=iso, user=user), b""
        t0 = time.monotonic()
        os.close(status_w)
        if chan_w >= 0:
            os.close(chan_w)
        try:
            out, err, status, chan, timed_out = _pump(proc, status_r, chan_r, t0 + timeout,
                                                      (output_cap, output_cap, CHANNEL_CAP), uid, gid, iso == "bwrap")
            seconds = time.monotonic() - t0
        finally:
            # whatever happened, nothing of the run survives it
            for f in (status_r, chan_r):
                if f >= 0:
                    os.close(f)
            proc.stdout.close()
            proc.stderr.close()
            _kill_all(proc, uid, gid, sweep=iso != "bwrap")
            try:
                proc.wait(timeout=_GRACE + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if root:
                _kill_uid(uid, gid)
                if iso != "bwrap":
                    _remove_files_of(uid)
        started = status.startswith("S")
        wait_status = cpu = None
        for line in status[1:].splitlines() if started else []:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "X":
                wait_status, cpu = int(parts[1]), float(parts[2])
        status_, code, reason = _classify(timed_out=timed_out, started=started, wait_status=wait_status, rc=proc.returncode,
                                          cpu=cpu, stderr=err.text(), timeout=timeout, cpu_limit=cpu_limit, memory_mb=memory_mb)
        truncated = out.truncated or err.truncated
        if truncated:
            cut = [f"{name} kept {b.kept} of {b.total} bytes" for name, b in (("stdout", out), ("stderr", err)) if b.truncated]
            reason = f"{reason}; output truncated ({', '.join(cut)})"
        result = SandboxResult(status_, code, seconds, reason, out.text(), err.text(), iso, user, truncated, cpu)
        return result, chan
    finally:
        if outer is not None:
            shutil.rmtree(outer, ignore_errors=True)
            if os.path.exists(outer):  # a folder the program made unwritable: root can still empty it
                for dirpath, dirnames, _ in os.walk(outer):
                    for d in dirnames:
                        try:
                            os.chmod(os.path.join(dirpath, d), 0o700, follow_symlinks=False)
                        except OSError:
                            pass
                shutil.rmtree(outer, ignore_errors=True)
        if root:
            _UIDS.release(uid)


def run_program(source: str, *, timeout: float, memory_mb: int, cpu_seconds: float | None = None, max_processes: int = 32,
                file_mb: int = 16, max_open_files: int = 64, output_cap: int = OUTPUT_CAP, isolation: str = "auto",
                allow_unisolated_network: bool = False, python: str | None = None, work_root: str | None = None) -> SandboxResult:
    """Run the Python program `source` in the sandbox and return its outcome.

    timeout: wall-clock seconds; cpu_seconds: RLIMIT_CPU of the program (default: the timeout,
    rounded up); memory_mb: its address-space limit (RLIMIT_AS); max_processes: RLIMIT_NPROC of
    its uid (processes and threads); file_mb: the largest file it may write (RLIMIT_FSIZE);
    max_open_files: RLIMIT_NOFILE; output_cap: bytes of stdout and of stderr kept.
    isolation: "auto" (the strongest available), "bwrap", "netns" or "none"; without network
    isolation it raises SandboxUnavailable unless allow_unisolated_network=True. python: the
    interpreter (default: the one running maxit, without its venv's packages). work_root: where
    the temporary folder is made (default: the system's temporary folder)."""
    _check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap)
    if not isinstance(source, str):
        raise SandboxError(f"the program must be a str of Python source, not {type(source).__name__}")
    iso = _choose(isolation, allow_unisolated_network, python)
    result, _ = _execute("run", source, None, iso=iso, python=python, timeout=timeout, memory_mb=memory_mb,
                         cpu_seconds=cpu_seconds, max_processes=max_processes, file_mb=file_mb, max_open_files=max_open_files,
                         output_cap=output_cap, work_root=work_root)
    return result


def _pool_map(fn, items: Sequence, workers: int | None) -> list:
    items = list(items)
    if not items:
        return []
    workers = max(1, min(workers or os.cpu_count() or 1, len(items), UID_SLOTS))
    if workers == 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="maxit-sandbox") as pool:
        return list(pool.map(fn, items))


def run_many(programs: Iterable[str], *, workers: int | None = None, **kwargs) -> list[SandboxResult]:
    """`run_program` on each program, `workers` at a time (default: the number of cores), in
    worker threads (each run is its own sandbox and uid); results in the programs' order."""
    _choose(kwargs.get("isolation", "auto"), kwargs.get("allow_unisolated_network", False), kwargs.get("python"))  # refuse before starting any
    return _pool_map(lambda src: run_program(src, **kwargs), programs, workers)


# --------------------------------------------------------------------------------------------
# Tests for rewards


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is made only of the types a test can expect (what ast.literal_eval makes)."""
    if depth > 100:
        return False
    t = type(value)
    if value is None or t in (bool, int, float, complex, str, bytes):
        return True
    if t in (list, tuple, set, frozenset):
        return all(_plain(x, depth + 1) for x in value)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def parse_tests(tests: str | Sequence) -> list[TestCase]:
    """Tests as `assert EXPR == LITERAL` lines (MBPP style; the literal may be on either side),
    or a sequence of (EXPR, expected value) pairs. Any other kind of test is refused: the value
    an `assert EXPR` expects (True) is known to the program, so a program could claim it
    without computing anything."""
    if isinstance(tests, str):
        try:
            tree = ast.parse(tests)
        except SyntaxError as err:
            raise SandboxError(f"tests: not Python: {err}") from None
        cases = []
        for node in tree.body:
            where = f"tests line {node.lineno}"
            if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                    and isinstance(node.test.ops[0], ast.Eq)):
                raise SandboxError(f"{where}: only `assert EXPR == LITERAL` tests can be checked unforgeably: "
                                   f"{ast.get_source_segment(tests, node)!r}")
            left, right = node.test.left, node.test.comparators[0]
            for expr, lit in ((left, right), (right, left)):
                try:
                    expected = ast.literal_eval(lit)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                cases.append(TestCase(ast.get_source_segment(tests, expr), expected))
                break
            else:
                raise SandboxError(f"{where}: neither side of == is a literal: {ast.get_source_segment(tests, node)!r}")
        return cases
    cases = []
    for i, item in enumerate(tests):
        if isinstance(item, TestCase):
            expr, expected = item.expr, item.expected
        else:
            try:
                expr, expected = item
            except (TypeError, ValueError):
                raise SandboxError(f"tests[{i}]: expected an (expression, expected value) pair, got {item!r}") from None
        if not isinstance(expr, str):
            raise SandboxError(f"tests[{i}]: the expression must be a str, not {type(expr).__name__}")
        try:
            compile(expr, f"<test {i}>", "eval")
        except SyntaxError as err:
            raise SandboxError(f"tests[{i}]: not an expression: {expr!r} ({err.msg})") from None
        if not _plain(expected):
            raise SandboxError(f"tests[{i}]: the expected value must be made of None, bool, int, float, complex, str, bytes, "
                               f"list, tuple, set, frozenset and dict, not {type(expected).__name__}")
        cases.append(TestCase(expr, expected))
    return cases


def _decode(x: Any, depth: int = 0) -> Any:
    """The candidate's value from its tagged JSON; only builtin types come out."""
    if depth > 100 or not isinstance(x, list) or not x or not isinstance(x[0], str):
        raise ValueError("malformed value")
    tag, rest = x[0], x[1:]

    def one(kind):
        if len(rest) != 1 or not isinstance(rest[0], kind):
            raise ValueError("malformed value")
        return rest[0]

    if tag == "n" and not rest:
        return None
    if tag == "b":
        return one(bool)
    if tag == "i":
        text = one(str)
        if len(text) > 100_000:
            raise ValueError("integer too large")
        return int(text, 16)
    if tag == "f":
        return float.fromhex(one(str))
    if tag == "c" and len(rest) == 2 and all(isinstance(r, str) for r in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "s":
        return one(str)
    if tag == "y":
        return bytes.fromhex(one(str))
    if tag in ("l", "t", "S", "F"):
        items = [_decode(v, depth + 1) for v in one(list)]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        pairs = one(list)
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ValueError("malformed value")
        return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in pairs}
    raise ValueError("malformed value")


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return all(_same_types(a[k], b[k]) and any(_same_types(k, kb) and k == kb for kb in b) for k in a if k in b)
    return True


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def _verdicts(cases: list[TestCase], chan: bytes, strict_types: bool) -> tuple[list[TestResult], str | None]:
    records: dict[int, list] = {}
    load_error = None
    for line in chan.split(b"\n"):
        if not line:
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if "load" in rec and isinstance(rec["load"], str):
            load_error = load_error or rec["load"][:300]
        i = rec.get("i")
        if type(i) is int and 0 <= i < len(cases):
            records.setdefault(i, []).append(rec)
    results = []
    for i, case in enumerate(cases):
        expected = _short_repr(case.expected)
        recs = records.get(i, [])
        if not recs:
            why = f"the code raised {load_error}" if load_error else "no result: the program ended or was stopped before this test reported"
            results.append(TestResult(case.expr, expected, False, error=why))
            continue
        if len(recs) > 1:
            results.append(TestResult(case.expr, expected, False, error="more than one result for this test"))
            continue
        rec = recs[0]
        if "e" in rec:
            results.append(TestResult(case.expr, expected, False, error=str(rec["e"])[:300]))
            continue
        try:
            actual = _decode(rec.get("v"))
            passed = bool(actual == case.expected) and (not strict_types or _same_types(actual, case.expected))
        except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
            results.append(TestResult(case.expr, expected, False, error=f"unreadable result: {err}"[:300]))
            continue
        results.append(TestResult(case.expr, expected, passed, actual=_short_repr(actual)))
    return results, load_error


def run_tests(code: str, tests: str | Sequence, *, timeout: float, memory_mb: int, strict_types: bool = False,
              cpu_seconds: float | None = None, max_processes: int = 32, file_mb: int = 16, max_open_files: int = 64,
              output_cap: int = OUTPUT_CAP, isolation: str = "auto", allow_unisolated_network: bool = False,
              python: str | None = None, work_root: str | None = None) -> TestReport:
    """Run `code` and then each test's expression in the sandbox, and decide pass/fail here.

    The program only ever reports values: after `code` has run in its own namespace (module
    name "solution", so an `if __name__ == "__main__":` block does not run), the harness
    evaluates each test's EXPR there and writes the value (plain types only, read through the
    builtin types' own methods, so a custom __eq__/__repr__ plays no part) to a pipe. The
    expected values never enter the sandbox; the parent rebuilds each value as plain Python
    objects and compares it with the expected value with == (Python's assert semantics: 1 ==
    1.0 == True; strict_types=True also requires equal types). So code that patches the
    harness, prints fake results, writes to the pipe itself, overrides __eq__ or exits early
    can at most supply values of its own choosing, and a value it did not produce is a fail:
    a test with no result (os._exit, a crash, the timeout) failed, and so did one with two.
    Other keyword arguments: as `run_program`. Tests all run in one process, in order."""
    cases = parse_tests(tests)
    _check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap)
    if not isinstance(code, str):
        raise SandboxError(f"the code must be a str, not {type(code).__name__}")
    iso = _choose(isolation, allow_unisolated_network, python)
    result, chan = _execute("tests", code, json.dumps([c.expr for c in cases]), iso=iso, python=python, timeout=timeout,
                            memory_mb=memory_mb, cpu_seconds=cpu_seconds, max_processes=max_processes, file_mb=file_mb,
                            max_open_files=max_open_files, output_cap=output_cap, work_root=work_root)
    results, load_error = _verdicts(cases, chan, strict_types)
    return TestReport(tuple(results), result, load_error)


def run_tests_many(items: Iterable[tuple[str, str | Sequence]], *, workers: int | None = None, **kwargs) -> list[TestReport]:
    """`run_tests(code, tests, **kwargs)` for each (code, tests) pair, `workers` at a time."""
    items = list(items)
    for _, tests in items:
        parse_tests(tests)  # refuse bad tests before running anything
    _choose(kwargs.get("isolation", "auto"), kwargs.get("allow_unisolated_network", False), kwargs.get("python"))
    return _pool_map(lambda item: run_tests(item[0], item[1], **kwargs), items, workers)
