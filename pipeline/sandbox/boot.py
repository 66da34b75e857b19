"""The code that runs inside the sandbox (`BOOT`): a supervisor that drops to the sandbox uid,
sets the limits and the network namespace, forks the program and reports its exact wait status
and CPU time on a pipe the program cannot write to; and, for `run_tests`, the harness that runs
the candidate's code and writes each test expression's value (plain types only) to the results
channel. It is Python source, started as `python -S -B -c BOOT ARGS...` with its working folder
as the current directory (`pipeline.sandbox.process`); it starts as root when maxit runs as root.
"""

__all__ = ["BOOT"]

BOOT = r'''
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
