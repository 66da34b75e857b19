"""Running one program in the sandbox: the interpreter and the bubblewrap command line, the
program's folder, the launch of the supervisor (`pipeline.sandbox.boot.BOOT`), reading its
output and status pipes with caps until they close (killing everything at the deadline), the
clean-up, and the status the run ends with (`execute`).
"""

from __future__ import annotations

import functools
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from pipeline.sandbox.boot import BOOT
from pipeline.sandbox.results import SandboxError, SandboxResult
from pipeline.sandbox.uids import GRACE, UIDS, kill_uid, remove_files_of

__all__ = ["BOX_INSIDE", "OUTPUT_CAP", "CHANNEL_CAP", "PROGRAM_NAME", "TESTS_NAME", "check_limits", "execute", "interpreter"]

BOX_INSIDE = "/sandbox"  # the program's folder inside bubblewrap
OUTPUT_CAP = 64 * 1024  # bytes of stdout and of stderr kept
CHANNEL_CAP = 4 * 1024 * 1024  # bytes of run_tests results kept
PROGRAM_NAME = "main.py"
TESTS_NAME = "tests.json"


def execute(mode: str, source: str, tests_json: str | None, *, iso: str, python: str | None, timeout: float, memory_mb: int,
            cpu_seconds: float | None, max_processes: int, file_mb: int, max_open_files: int, output_cap: int,
            work_root: str | None) -> tuple[SandboxResult, bytes]:
    """Run `source` (mode "run") or the test harness on it (mode "tests") under isolation `iso`
    (already chosen); returns the result and the raw results channel."""
    exe, roots = interpreter(python)
    root = os.geteuid() == 0
    uid, gid = UIDS.acquire() if root else (-1, -1)
    user = f"uid {uid}" if root else f"caller uid {os.getuid()}"
    cpu_limit = max(1, math.ceil(cpu_seconds if cpu_seconds is not None else timeout))
    outer = None
    t0 = time.monotonic()
    try:
        outer = tempfile.mkdtemp(prefix="maxit-sandbox-", dir=work_root)
        box = _make_box(outer, ((PROGRAM_NAME, source), (TESTS_NAME, tests_json)), (uid, gid) if root else None)
        inside = BOX_INSIDE if iso == "bwrap" else box
        prefix = _bwrap_argv(box, roots) if iso == "bwrap" else []
        boot_iso = iso if (iso != "netns" or root) else "netns-user"
        status_r, status_w = os.pipe()
        chan_r, chan_w = os.pipe() if mode == "tests" else (-1, -1)
        limits = f"{memory_mb * 1024 * 1024},{cpu_limit},{max_processes},{file_mb * 1024 * 1024},{max_open_files}"
        argv = [*prefix, exe, "-S", "-B", "-c", BOOT, mode, str(status_w), str(chan_w), str(uid), str(gid), boot_iso, limits,
                PROGRAM_NAME, TESTS_NAME]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    pass_fds=tuple(f for f in (status_w, chan_w) if f >= 0), cwd=box,
                                    env=_env(inside, inside), start_new_session=True)
        except OSError as err:
            _close(status_r, status_w, chan_r, chan_w)
            return SandboxResult("error", None, time.monotonic() - t0, f"the sandbox could not start: {err}"[:200],
                                 isolation=iso, user=user), b""
        t0 = time.monotonic()
        _close(status_w, chan_w)
        try:
            out, err, status, chan, timed_out = _pump(proc, status_r, chan_r, t0 + timeout,
                                                      (output_cap, output_cap, CHANNEL_CAP), uid, gid, iso == "bwrap")
            seconds = time.monotonic() - t0
        finally:
            _close(status_r, chan_r)
            _end(proc, uid, gid, iso, root)
        started, wait_status, cpu = _read_status(status)
        status_, code, reason = _classify(timed_out=timed_out, started=started, wait_status=wait_status, rc=proc.returncode,
                                          cpu=cpu, stderr=err.text(), timeout=timeout, cpu_limit=cpu_limit, memory_mb=memory_mb)
        truncated = out.truncated or err.truncated
        if truncated:
            cut = [f"{name} kept {b.kept} of {b.total} bytes" for name, b in (("stdout", out), ("stderr", err)) if b.truncated]
            reason = f"{reason}; output truncated ({', '.join(cut)})"
        return SandboxResult(status_, code, seconds, reason, out.text(), err.text(), iso, user, truncated, cpu), chan
    finally:
        if outer is not None:
            _remove_box(outer)
        if root:
            UIDS.release(uid)


def _make_box(outer: str, files, owner: tuple[int, int] | None) -> str:
    """The program's folder `<outer>/box` with `files` ((name, text or None) pairs) written in it,
    owned by the sandbox uid `owner` when there is one."""
    os.chmod(outer, 0o711)
    box = os.path.join(outer, "box")
    os.mkdir(box, 0o700)
    for name, text in files:
        if text is not None:
            with open(os.path.join(box, name), "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
            os.chmod(os.path.join(box, name), 0o644)
    if owner is not None:
        os.chown(box, *owner)
    return box


def _close(*fds: int) -> None:
    for f in fds:
        if f >= 0:
            os.close(f)


def _end(proc: subprocess.Popen, uid: int, gid: int, iso: str, root: bool) -> None:
    """Whatever happened, nothing of the run survives it: its pipes closed, every process of its
    group and uid killed and reaped, and outside bubblewrap the uid's files in shared folders
    removed."""
    proc.stdout.close()
    proc.stderr.close()
    _kill_all(proc, uid, gid, sweep=iso != "bwrap")
    try:
        proc.wait(timeout=GRACE + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if root:
        kill_uid(uid, gid)
        if iso != "bwrap":
            remove_files_of(uid)


def _read_status(status: str) -> tuple[bool, int | None, float | None]:
    """(started, wait status, CPU seconds) from what the supervisor wrote on the status pipe:
    "S" once the program starts, then "X <wait status> <CPU seconds> <max RSS>" when it ended."""
    started = status.startswith("S")
    wait_status = cpu = None
    for line in status[1:].splitlines() if started else []:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "X":
            wait_status, cpu = int(parts[1]), float(parts[2])
    return started, wait_status, cpu


def _remove_box(outer: str) -> None:
    shutil.rmtree(outer, ignore_errors=True)
    if os.path.exists(outer):  # a folder the program made unwritable: root can still empty it
        for dirpath, dirnames, _ in os.walk(outer):
            for d in dirnames:
                try:
                    os.chmod(os.path.join(dirpath, d), 0o700, follow_symlinks=False)
                except OSError:
                    pass
        shutil.rmtree(outer, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def interpreter(python: str | None) -> tuple[str, tuple[str, ...]]:
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
    """The bubblewrap command line before the interpreter's: new namespaces, /usr and the
    interpreter's `roots` read-only, a fresh /proc, a minimal /dev, an empty /tmp, and `box`
    read-write at BOX_INSIDE, the working folder."""
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


def check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap) -> None:
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
        kill_uid(uid, gid)
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
                stop = time.monotonic() + GRACE
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
                stop = time.monotonic() + GRACE
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
