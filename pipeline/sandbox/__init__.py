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

The parts: `results` (what a run returns), `isolation` (which layers work here, probed once),
`process` (running one program: bubblewrap's command line, the launch, the pipes, the status),
`boot` (the supervisor and test harness that run inside the sandbox), `uids` (the sandbox uids
and the clean-up after a run), `verdicts` (reading tests, deciding them in the parent). This
face holds the API. Nothing here imports Dagster.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from pipeline.sandbox.isolation import ISOLATIONS, available_isolation, choose, isolation_report
from pipeline.sandbox.process import OUTPUT_CAP, check_limits, execute
from pipeline.sandbox.results import STATUSES, SandboxError, SandboxResult, SandboxUnavailable, TestCase, TestReport, TestResult
from pipeline.sandbox.uids import UID_BASE, UID_SLOTS
from pipeline.sandbox.verdicts import parse_tests, verdicts

__all__ = [
    "STATUSES",
    "ISOLATIONS",
    "OUTPUT_CAP",
    "UID_BASE",
    "UID_SLOTS",
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
    check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap)
    if not isinstance(source, str):
        raise SandboxError(f"the program must be a str of Python source, not {type(source).__name__}")
    iso = choose(isolation, allow_unisolated_network, python)
    result, _ = execute("run", source, None, iso=iso, python=python, timeout=timeout, memory_mb=memory_mb,
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
    choose(kwargs.get("isolation", "auto"), kwargs.get("allow_unisolated_network", False), kwargs.get("python"))  # refuse before starting any
    return _pool_map(lambda src: run_program(src, **kwargs), programs, workers)


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
    check_limits(timeout, memory_mb, cpu_seconds, max_processes, file_mb, max_open_files, output_cap)
    if not isinstance(code, str):
        raise SandboxError(f"the code must be a str, not {type(code).__name__}")
    iso = choose(isolation, allow_unisolated_network, python)
    result, chan = execute("tests", code, json.dumps([c.expr for c in cases]), iso=iso, python=python, timeout=timeout,
                           memory_mb=memory_mb, cpu_seconds=cpu_seconds, max_processes=max_processes, file_mb=file_mb,
                           max_open_files=max_open_files, output_cap=output_cap, work_root=work_root)
    results, load_error = verdicts(cases, chan, strict_types)
    return TestReport(tuple(results), result, load_error)


def run_tests_many(items: Iterable[tuple[str, str | Sequence]], *, workers: int | None = None, **kwargs) -> list[TestReport]:
    """`run_tests(code, tests, **kwargs)` for each (code, tests) pair, `workers` at a time."""
    items = list(items)
    for _, tests in items:
        parse_tests(tests)  # refuse bad tests before running anything
    choose(kwargs.get("isolation", "auto"), kwargs.get("allow_unisolated_network", False), kwargs.get("python"))
    return _pool_map(lambda item: run_tests(item[0], item[1], **kwargs), items, workers)
