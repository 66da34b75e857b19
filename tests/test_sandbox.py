"""The sandbox for model-written code (pipeline/sandbox/, docs/SANDBOX.md): hostile programs
get the named status and leave nothing behind (no process of the sandbox uid or still holding
its folder, no temporary folder, no file outside its folder, no socket on this machine), and
`run_tests` cannot be talked into a pass. Nothing here is skipped: on a machine that lacks a
layer (bubblewrap, root to drop privileges) the tests that need it fail, naming what is missing
(scripts/setup.sh installs bubblewrap)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pipeline import sandbox
from pipeline.sandbox import isolation as layers
from pipeline.sandbox import process, uids
from pipeline.sandbox import SandboxError, SandboxUnavailable, parse_tests, run_many, run_program, run_tests, run_tests_many

REPO = Path(__file__).resolve().parents[1]
T = dict(timeout=2.0, memory_mb=256)


@pytest.fixture
def work(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    return root


@pytest.fixture(scope="module")
def bwrap():
    """The full sandbox: bubblewrap works here and maxit runs as root (so programs run as a
    sandbox uid of their own)."""
    report = sandbox.isolation_report()
    assert report["isolation"] == "bwrap", f"bubblewrap does not work on this machine ({report['bwrap']}); scripts/setup.sh installs it"
    assert os.geteuid() == 0, "these tests check the drop to a sandbox uid: run them as root, as CI does"
    return report


@pytest.fixture(scope="module")
def netns_python():
    """An interpreter the sandbox uid can run outside bubblewrap (the default one may live in a
    folder only root can read, e.g. under /root)."""
    for python in (None, "/usr/bin/python3"):
        if python is None or os.path.exists(python):
            if layers._probe("netns", python) is None:
                return python
    pytest.fail(f"no network namespace with a Python the sandbox uid can run: {layers._probe('netns', None)}")


def uid_of(result) -> int:
    assert result.user.startswith("uid "), result.user
    return int(result.user.split()[1])


def host_sockets_of(uid: int) -> list[str]:
    found = []
    for name in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        found += [f"{name}: {line.strip()}" for line in lines if len(line.split()) > 7 and line.split()[7] == str(uid)]
    return found


def processes_using(path: Path) -> list[str]:
    """Processes whose command line or working folder mentions `path` (bwrap, the supervisor)."""
    found, text = [], str(path)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if text in cmd or cwd.startswith(text):
            found.append(f"{pid}: {cmd[:120]} (in {cwd})")
    return found


def assert_nothing_survives(result, work: Path) -> None:
    uid = uid_of(result)
    deadline = time.monotonic() + 3
    while (uids.pids_of(uid) or processes_using(work)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not uids.pids_of(uid), f"processes of the sandbox uid {uid} survived: {uids.pids_of(uid)}"
    assert not processes_using(work), f"processes of the run survived: {processes_using(work)}"
    assert list(work.iterdir()) == [], f"the temporary folder was not removed: {list(work.iterdir())}"
    assert not host_sockets_of(uid), host_sockets_of(uid)


# ---------------------------------------------------------------------------------------------
# ordinary programs


def test_a_program_runs_unprivileged_with_a_minimal_environment(bwrap, work, monkeypatch):
    monkeypatch.setenv("MAXIT_TEST_SECRET", "hunter2")
    prog = (
        "import json, os, sys\n"
        "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'groups': os.getgroups(),\n"
        "    'env': dict(os.environ), 'cwd': os.getcwd(), 'root': sorted(os.listdir('/')), 'stdin': sys.stdin.read()}))\n"
    )
    r = run_program(prog, **T, work_root=str(work))
    assert (r.status, r.exit_code, r.reason, r.isolation) == ("ok", 0, "exit code 0", "bwrap"), r
    seen = json.loads(r.stdout)
    assert seen["uid"] == seen["euid"] == seen["gid"] == uid_of(r) != 0 and seen["groups"] == []
    assert "MAXIT_TEST_SECRET" not in seen["env"] and "hunter2" not in r.stdout
    assert set(seen["env"]) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PWD", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
                                "PYTHONUTF8", "PYTHONIOENCODING"}, seen["env"]
    assert seen["cwd"] == "/sandbox" and seen["stdin"] == ""
    assert "work" not in seen["root"] and "home" not in seen["root"], seen["root"]
    line = r.to_json()
    assert "\n" not in line and json.loads(line) == r.summary()
    assert set(r.summary()) == {"status", "exit_code", "seconds", "reason", "isolation", "user"}
    assert_nothing_survives(r, work)


def test_failures_are_named(bwrap, work):
    r = run_program("def f():\n    return 1 / 0\nf()\n", **T, work_root=str(work))
    assert (r.status, r.exit_code) == ("failed", 1) and "ZeroDivisionError" in r.reason, r
    assert 'File "main.py", line 2, in f' in r.stderr and "_boot" not in r.stderr
    r = run_program("import sys\nsys.exit(3)\n", **T, work_root=str(work))
    assert (r.status, r.exit_code, r.reason) == ("failed", 3, "exit code 3"), r
    r = run_program("def (:\n", **T, work_root=str(work))
    assert r.status == "failed" and "SyntaxError" in r.reason, r
    assert_nothing_survives(r, work)


def test_the_sandbox_itself_failing_is_an_error_not_a_program_failure(bwrap, work, monkeypatch):
    monkeypatch.setattr(process, "_bwrap_argv", lambda box, roots: ["bwrap", "--no-such-flag", "--"])
    r = run_program("print(1)", **T, isolation="bwrap", work_root=str(work))
    assert (r.status, r.exit_code) == ("error", None) and "could not start" in r.reason, r
    assert list(work.iterdir()) == []


def test_bad_limits_are_refused():
    for bad in (dict(timeout=0, memory_mb=256), dict(timeout=1, memory_mb=8), dict(timeout=float("nan"), memory_mb=256)):
        with pytest.raises(SandboxError):
            run_program("print(1)", **bad)
    with pytest.raises(SandboxError, match="isolation"):
        run_program("print(1)", **T, isolation="chroot")


# ---------------------------------------------------------------------------------------------
# hostile programs


def test_fork_bomb(bwrap, work):
    prog = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r = run_program(prog, timeout=1.5, memory_mb=256, work_root=str(work))
    assert r.status == "timeout" and r.reason == "wall-clock timeout after 1.5s", r
    assert time.monotonic() - t0 < 6
    assert_nothing_survives(r, work)


def test_fork_bomb_leaving_detached_children_behind(bwrap, work):
    # the program exits at once; its children left their session and keep forking
    # (the parent's own forks may already meet the process limit its first children filled: it stops forking then)
    prog = ("import os, time\nfor _ in range(8):\n    try:\n        child = os.fork()\n    except OSError:\n        break\n"
            "    if child == 0:\n        os.setsid()\n        while True:\n"
            "            try:\n                os.fork()\n            except OSError:\n                time.sleep(0.01)\nprint('bye')\n")
    r = run_program(prog, **T, work_root=str(work))
    assert (r.status, r.stdout) == ("ok", "bye\n"), r
    assert_nothing_survives(r, work)


def test_infinite_loop(bwrap, work):
    r = run_program("while True:\n    pass\n", timeout=1.0, memory_mb=256, work_root=str(work))
    assert r.status == "timeout" and r.seconds < 2.5, r
    assert_nothing_survives(r, work)


def test_cpu_time_limit(bwrap, work):
    r = run_program("while True:\n    pass\n", timeout=3.0, cpu_seconds=1, memory_mb=256, work_root=str(work))
    assert (r.status, r.reason) == ("timeout", "CPU time limit (1s)"), r
    assert_nothing_survives(r, work)


def test_sleeping_past_the_limit(bwrap, work):
    r = run_program("import time\ntime.sleep(60)\n", timeout=1.0, memory_mb=256, work_root=str(work))
    assert (r.status, r.exit_code, r.reason) == ("timeout", -9, "wall-clock timeout after 1s"), r
    assert r.seconds < 2.5
    assert_nothing_survives(r, work)


def test_memory_hog(bwrap, work):
    r = run_program("hog = []\nwhile True:\n    hog.append(bytearray(10**7))\n", timeout=3.0, memory_mb=128, work_root=str(work))
    assert (r.status, r.reason) == ("killed", "memory limit (128 MB)"), r
    assert_nothing_survives(r, work)


def test_huge_print(bwrap, work):
    r = run_program("import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)\nprint('done', file=sys.stderr)\n",
                    **T, work_root=str(work))
    assert r.status == "ok" and r.truncated, r
    assert r.stdout == "x" * sandbox.OUTPUT_CAP and r.stderr == "done\n"
    assert "output truncated (stdout kept 65536 of 50000000 bytes)" in r.reason
    r = run_program("while True:\n    print('y' * 10000)\n", timeout=1.0, memory_mb=256, work_root=str(work))
    assert r.status == "timeout" and r.truncated and len(r.stdout) == sandbox.OUTPUT_CAP, r
    assert_nothing_survives(r, work)


def test_writing_outside_its_folder(bwrap, work):
    token = secrets.token_hex(6)
    targets = [f"/tmp/escape-{token}", str(REPO / f"escape-{token}"), f"/escape-{token}", f"/dev/shm/escape-{token}",
               f"../escape-{token}", f"/usr/escape-{token}", f"{work}/escape-{token}"]
    prog = (
        "import json\nout = {}\n"
        f"for path in {targets!r} + ['inside.txt']:\n"
        "    try:\n        with open(path, 'w') as f:\n            f.write('x')\n        out[path] = 'written'\n"
        "    except OSError as e:\n        out[path] = type(e).__name__\n"
        "print(json.dumps(out))\n"
    )
    r = run_program(prog, **T, work_root=str(work))
    assert r.status == "ok", r
    out = json.loads(r.stdout)
    assert out.pop("inside.txt") == "written"
    assert all(v != "written" for v in out.values()), out
    for path in targets:
        assert not Path(path).exists() or path.startswith(".."), path
        assert not (REPO / f"escape-{token}").exists()
    assert not list(Path("/tmp").glob(f"escape-{token}*"))
    assert_nothing_survives(r, work)


def test_writing_outside_its_folder_with_the_network_namespace_alone(netns_python, work):
    # without a mount namespace the program shares the machine's /tmp: what it leaves there is removed
    token = secrets.token_hex(6)
    prog = (f"import os\nfor path in ['/tmp/escape-{token}', '/var/tmp/escape-{token}', '/dev/shm/escape-{token}', "
            f"'{REPO}/escape-{token}']:\n"
            "    try:\n        open(path, 'w').write('x')\n    except OSError:\n        pass\n"
            f"os.makedirs('/tmp/escape-dir-{token}/a/b', exist_ok=True)\n")
    r = run_program(prog, **T, isolation="netns", python=netns_python, work_root=str(work))
    assert r.status == "ok", r
    for folder in ("/tmp", "/var/tmp", "/dev/shm", str(REPO)):
        assert not list(Path(folder).glob(f"escape-*{token}*")), folder
    assert_nothing_survives(r, work)


def test_reading_the_users_files(bwrap, work, tmp_path):
    token = secrets.token_hex(8)
    private = tmp_path / "private.txt"
    private.write_text(f"SECRET-{token}")
    private.chmod(0o600)
    public = tmp_path / "public.txt"
    public.write_text(f"PUBLIC-{token}")
    public.chmod(0o644)
    paths = [str(private), str(public), "/root", str(REPO / "README.md"), str(REPO), "/etc/passwd", "/etc/shadow",
             "/proc/1/environ", f"/proc/{os.getpid()}/environ", "/home"]
    prog = (
        "import json, os\nout = {}\n"
        f"for path in {paths!r}:\n"
        "    try:\n        out[path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, errors='replace').read()\n"
        "    except OSError as e:\n        out[path] = type(e).__name__\n"
        "print(json.dumps(out))\n"
    )
    r = run_program(prog, **T, work_root=str(work))
    assert r.status == "ok", r
    out = json.loads(r.stdout)
    assert token not in r.stdout and "root:x:0:0" not in r.stdout
    for path in paths:
        assert out[path] in ("FileNotFoundError", "PermissionError") or (path == "/root" and out[path] == [".pyenv"]), (path, out[path])
    assert_nothing_survives(r, work)


def _listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    return srv


_CONNECT = (
    "import json, socket\nout = {}\n"
    "for host in ('127.0.0.1', '1.1.1.1', 'localhost'):\n"
    "    try:\n        socket.create_connection((host, PORT), timeout=1).sendall(b'hello')\n        out[host] = 'connected'\n"
    "    except OSError as e:\n        out[host] = type(e).__name__\n"
    "try:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'hello', ('127.0.0.1', PORT))\n"
    "except OSError as e:\n    pass\n"
    "print(json.dumps(out))\n"
)


def _assert_no_connection(srv) -> None:
    try:
        conn, peer = srv.accept()
    except socket.timeout:
        return
    conn.close()
    pytest.fail(f"a connection from the sandbox arrived: {peer}")


def test_opening_a_socket(bwrap, work):
    with _listener() as srv:
        r = run_program(_CONNECT.replace("PORT", str(srv.getsockname()[1])), **T, work_root=str(work))
        assert r.status == "ok", r
        assert all(v != "connected" for v in json.loads(r.stdout).values()), r.stdout
        _assert_no_connection(srv)
    assert_nothing_survives(r, work)


def test_opening_a_socket_with_the_network_namespace_alone(netns_python, work):
    with _listener() as srv:
        r = run_program(_CONNECT.replace("PORT", str(srv.getsockname()[1])), **T, isolation="netns", python=netns_python,
                        work_root=str(work))
        assert (r.status, r.isolation) == ("ok", "netns"), r
        assert all(v != "connected" for v in json.loads(r.stdout).values()), r.stdout
        _assert_no_connection(srv)
    assert_nothing_survives(r, work)


_KILL_PARENT = (
    "import os, signal\n"
    "for name, f in [('parent', lambda: os.kill(os.getppid(), 9)), ('parent group', lambda: os.killpg(os.getpgid(os.getppid()), 9)),\n"
    "                ('pid 1', lambda: os.kill(1, 9)), ('everyone', lambda: os.kill(-1, 9)), ('sentinel', lambda: os.kill(SENTINEL, 9))]:\n"
    "    try:\n        f()\n        print(name, 'signalled', flush=True)\n"
    "    except OSError as e:\n        print(name, type(e).__name__, flush=True)\n"
    "os.killpg(0, 9)\n"
    "print('still here')\n"
)


@pytest.mark.parametrize("isolation", ["bwrap", "netns"])
def test_killing_its_parent(isolation, work, request):
    python = None
    if isolation == "bwrap":
        request.getfixturevalue("bwrap")
    else:
        python = request.getfixturevalue("netns_python")
    sentinel = subprocess.Popen(["sleep", "30"])
    try:
        r = run_program(_KILL_PARENT.replace("SENTINEL", str(sentinel.pid)), **T, isolation=isolation, python=python,
                        work_root=str(work))
        assert (r.status, r.exit_code, r.reason) == ("killed", -9, "killed by SIGKILL"), r
        assert "still here" not in r.stdout
        assert sentinel.poll() is None, "the program killed a process of the machine"
        assert_nothing_survives(r, work)
        again = run_program("print('fine')", **T, isolation=isolation, python=python, work_root=str(work))
        assert (again.status, again.stdout) == ("ok", "fine\n"), again
    finally:
        sentinel.kill()
        sentinel.wait()


def test_nothing_survives_a_timeout_with_the_network_namespace_alone(netns_python, work):
    prog = "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        os.setsid()\nwhile True:\n    time.sleep(0.1)\n"
    r = run_program(prog, timeout=1.0, memory_mb=256, isolation="netns", python=netns_python, work_root=str(work))
    assert r.status == "timeout", r
    assert_nothing_survives(r, work)


def test_no_isolation_is_refused_unless_allowed(work, monkeypatch, netns_python):
    missing = {"bwrap": "bwrap: not installed (apt-get install bubblewrap)", "netns": "netns: unshare(CLONE_NEWNET) failed"}
    monkeypatch.setattr(layers, "_probe", lambda kind, python=None: missing[kind])
    with pytest.raises(SandboxUnavailable) as err:
        run_program("print(1)", **T, work_root=str(work))
    message = str(err.value)
    assert "\n" not in message and "bwrap: not installed" in message and "netns" in message and "--allow-network-unisolated" in message
    with pytest.raises(SandboxUnavailable):
        run_many(["print(1)"], **T)
    r = run_program("import os\nprint(os.getuid())", **T, allow_unisolated_network=True, python=netns_python, work_root=str(work))
    assert (r.status, r.isolation, r.stdout) == ("ok", "none", f"{uid_of(r)}\n"), r
    assert_nothing_survives(r, work)


def test_run_many_keeps_the_order(bwrap, work):
    programs = [f"import time\ntime.sleep({0.2 * (i % 3)})\nprint({i})\n" for i in range(6)] + ["raise SystemExit(4)"]
    results = run_many(programs, workers=3, **T, work_root=str(work))
    assert [r.stdout for r in results[:6]] == [f"{i}\n" for i in range(6)]
    assert (results[-1].status, results[-1].exit_code) == ("failed", 4)
    assert list(work.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# run_tests


ADD_TESTS = "assert add(1, 2) == 3\nassert add('a', 'b') == 'ab'\nassert 5 == add(2, 3)\nassert add([1], [2]) == [1, 2]\n"


def test_run_tests_reports_each_test(bwrap, work):
    rep = run_tests("def add(a, b):\n    return a + b\n", ADD_TESTS, **T, work_root=str(work))
    assert (rep.passed, rep.total, rep.all_passed, rep.load_error) == (4, 4, True, None), rep
    wrong = run_tests("def add(a, b):\n    if a == 2:\n        raise ValueError('two')\n    return a - b if isinstance(a, int) else a + b\n",
                      ADD_TESTS, **T, work_root=str(work))
    assert [t.passed for t in wrong.results] == [False, True, False, True]
    assert wrong.results[0].actual == "-1" and wrong.results[2].error == "ValueError: two"
    broken = run_tests("def add(a, b):\n    return a + b\nraise RuntimeError('at import')\n", ADD_TESTS, **T, work_root=str(work))
    assert broken.passed == 0 and broken.load_error == "RuntimeError: at import", broken
    assert "RuntimeError: at import" in broken.results[0].error
    assert json.loads(wrong.to_json())["tests"] == [False, True, False, True]
    assert list(work.iterdir()) == []


def test_run_tests_equality_is_pythons_unless_strict(bwrap, work):
    code = "def f():\n    return 1.0\ndef g():\n    return (1, [2, 3])\n"
    tests = [("f()", 1), ("g()", (1, [2, 3])), ("g()", [1, [2, 3]])]
    assert [t.passed for t in run_tests(code, tests, **T, work_root=str(work)).results] == [True, True, False]
    assert [t.passed for t in run_tests(code, tests, **T, strict_types=True, work_root=str(work)).results] == [False, True, False]


def test_run_tests_accepts_only_checkable_tests():
    assert parse_tests("assert f(1) == {'a': (1, 2.5)}\nassert -3 == g()\n") == [
        sandbox.TestCase("f(1)", {"a": (1, 2.5)}), sandbox.TestCase("g()", -3)]
    for bad in ("assert is_prime(7)\n", "assert f(1) == g(2)\n", "import math\nassert f(1) == 2\n", "assert f(1) != 2\n",
                "assert math.isclose(f(1), 2.5)\n"):
        with pytest.raises(SandboxError):
            parse_tests(bad)
    with pytest.raises(SandboxError):
        parse_tests([("f(1)", object())])
    with pytest.raises(SandboxError):
        parse_tests([("f(1", 1)])


def test_run_tests_exit_before_the_tests_report(bwrap, work):
    for code in ("import os\ndef add(a, b):\n    return a + b\nos._exit(0)\n",
                 "import os\ndef add(a, b):\n    os._exit(0)\n",
                 "import sys\ndef add(a, b):\n    return a + b\nsys.exit(0)\n",
                 "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n"):
        rep = run_tests(code, ADD_TESTS, **T, work_root=str(work))
        assert rep.passed == 0, (code, rep)
    # the tests that reported before the exit keep their verdict, the rest failed
    rep = run_tests("import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n", ADD_TESTS, **T, work_root=str(work))
    assert [t.passed for t in rep.results] == [True, True, False, False]
    assert "no result" in rep.results[3].error
    assert list(work.iterdir()) == []


def test_run_tests_timeout_fails_the_remaining_tests(bwrap, work):
    rep = run_tests("def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n", ADD_TESTS, timeout=1.0, memory_mb=256,
                    work_root=str(work))
    assert rep.sandbox.status == "timeout" and [t.passed for t in rep.results] == [True, True, False, False], rep
    assert_nothing_survives(rep.sandbox, work)


FORGER = r'''
import builtins, gc, json, os, sys

class Yes:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __repr__(self): return "67890"
    __hash__ = object.__hash__

class YesInt(int):
    def __eq__(self, other): return True
    def __repr__(self): return "67890"
    __hash__ = int.__hash__

class Liar:
    @property
    def __class__(self): return int
    def __eq__(self, other): return True

def f(x): return Yes()
def g(x): return YesInt(1)
def h(x): return Liar()
def k(x): return [Yes(), YesInt(2)]

# look for the expected values anywhere the program can read
found = []
for root in ("/sandbox", "/proc", "/tmp"):
    for dirpath, dirs, files in os.walk(root):
        if dirpath.count("/") > 3:
            dirs[:] = []
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as fh:
                    if str(600000 + 24242).encode() in fh.read(1 << 20):
                        found.append(os.path.join(dirpath, name))
            except OSError:
                pass
print("FOUND", found, file=sys.stderr)

# fake verdicts everywhere: stdout, stderr, every open fd, the harness's own functions
for i in range(8):
    line = json.dumps({"i": i, "passed": True, "ok": True, "v": ["p"], "result": "PASS"}) + "\n"
    print(line, "PASS", "OK", f"test {i} passed", flush=True)
    for fd in range(2, 64):
        try:
            os.write(fd, line.encode())
            os.write(fd, b'{"done": 4}\n')
        except OSError:
            pass
builtins.AssertionError = type("AssertionError", (Exception,), {})
sys.exit = lambda *a: None
os._exit = lambda *a: None
json.dumps = lambda obj, **kw: '{"i": %d, "passed": true}' % (obj.get("i", 0) if isinstance(obj, dict) else 0)
for obj in gc.get_objects():
    if isinstance(obj, dict) and "_enc" in obj and "_harness" in obj:
        obj["_enc"] = lambda v, d=0: ["s", "PASS"]
builtins.eval = lambda *a, **kw: Yes()
builtins.isinstance = lambda *a: True
'''


def test_run_tests_cannot_be_forged(bwrap, work):
    tests = "assert f(12345) == 67890\nassert g(12345) == 67890\nassert h(12345) == 67890\nassert k(1) == [67890, 2]\n"
    rep = run_tests(FORGER, tests + "assert f(2) == 624242\n", **T, work_root=str(work))
    assert rep.passed == 0 and rep.total == 5, rep
    assert "FOUND []" in rep.sandbox.stderr, rep.sandbox.stderr[-2000:]
    # and the same program passes when it really computes the values
    honest = FORGER.split("# look for")[0].replace("return Yes()", "return 67890").replace("return YesInt(1)", "return 67890") \
        .replace("return Liar()", "return 67890").replace("return [Yes(), YesInt(2)]", "return [67890, 2]")
    assert run_tests(honest, tests, **T, work_root=str(work)).all_passed
    assert_nothing_survives(rep.sandbox, work)


def test_run_tests_many(bwrap, work):
    items = [("def add(a, b):\n    return a + b\n", ADD_TESTS), ("def add(a, b):\n    return 0\n", ADD_TESTS)]
    reports = run_tests_many(items, workers=2, **T, work_root=str(work))
    assert [r.passed for r in reports] == [4, 0]


# ---------------------------------------------------------------------------------------------
# the command line


def test_cli_sandbox_run(bwrap, tmp_path, capsys):
    from maxit.cli import main

    prog = tmp_path / "prog.py"
    prog.write_text("print('to the void')\nraise SystemExit(3)\n")
    assert main(["sandbox", "run", str(prog), "--timeout", "2", "--memory-mb", "256"]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and err == ""
    record = json.loads(out)
    assert {k: record[k] for k in ("status", "exit_code", "reason", "isolation")} == {
        "status": "failed", "exit_code": 3, "reason": "exit code 3", "isolation": "bwrap"}
    prog.write_text("while True:\n    pass\n")
    assert main(["sandbox", "run", str(prog), "--timeout", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "timeout"
    for argv in (["sandbox", "run", str(tmp_path / "missing.py")], ["sandbox", "run", str(prog), "--timeout", "-1"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith("maxit sandbox: error: "), err


HOSTILE_PROGRAMS = {
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "timeout"),
    "infinite loop": ("while True:\n    pass\n", "timeout"),
    "sleeping past the limit": ("import time\ntime.sleep(60)\n", "timeout"),
    "memory hog": ("hog = []\nwhile True:\n    hog.append(bytearray(10**7))\n", "killed"),
    "huge print": ("while True:\n    print('y' * 10000)\n", None),
    "writing outside its folder": ("open('/tmp/maxit-sandbox-escape', 'w').write('x')\n", "failed"),
    "reading the user's files": (f"print(open({str(REPO / 'README.md')!r}).read())\n", "failed"),
    "opening a socket": ("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n", "failed"),
    "killing its parent": ("import os\nos.kill(os.getppid(), 9)\nprint('still here')\n", None),
    "os._exit before reporting": ("import os\nos._exit(0)\n", "ok"),
}


@pytest.mark.parametrize("name", list(HOSTILE_PROGRAMS))
def test_cli_sandbox_run_names_the_status_of_each_hostile_program(bwrap, tmp_path, capsys, name):
    """`maxit sandbox run` reports what the rewards see (`run_program` with the same limits): one
    JSON line with the named status of each hostile case."""
    from maxit.cli import main

    source, status = HOSTILE_PROGRAMS[name]
    prog = tmp_path / "prog.py"
    prog.write_text(source)
    assert main(["sandbox", "run", str(prog), "--timeout", "1.5", "--memory-mb", "128"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["status"] in ("ok", "failed", "timeout", "killed") and record["reason"], record
    if status is not None:
        assert record["status"] == status, record
    direct = run_program(source, timeout=1.5, memory_mb=128)
    assert direct.status == record["status"], (direct, record)
    assert not Path("/tmp/maxit-sandbox-escape").exists()
