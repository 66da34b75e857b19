"""What `maxit run` shows on the console: by default only its own progress, one line per
finished round and the round table at the end; the engines' and libraries' output (vLLM and
Dagster log lines, Python warnings, C++ warnings written straight to the process's stderr) goes
to `<store>/maxit.log` (`console_to_log`), and `--verbose` prints it as well."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import IO, Iterator

import polars as pl

from pipeline.reporting.report import reward_error_lines, round_line, round_summary
from pipeline.store import BASE_ROUND
from pipeline.reporting.tracking import log_round
from pipeline.store import Tables


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024.0


@contextlib.contextmanager
def console_to_log(log_path: str | Path, verbose: bool = False) -> Iterator[tuple[IO[str], IO[str]]]:
    """Send everything this process writes to its stdout and stderr (file descriptors 1 and 2:
    Python's print, warnings and logging, and C/C++ libraries writing to them directly) to
    `log_path` (appended), and, with `verbose`, to the console's stderr too. Yields
    (stdout, stderr) streams on the console for maxit's own output. Restored on exit."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {1: os.dup(1), 2: os.dup(2)}
    console_out = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    console_err = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    log_file = open(log_path, "ab", buffering=0)
    log_file.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {' '.join(sys.argv)}\n".encode())
    tee = None
    if verbose:
        read_end, write_end = os.pipe()
        target = write_end

        def copy() -> None:
            try:
                while chunk := os.read(read_end, 65536):
                    log_file.write(chunk)
                    os.write(saved[2], chunk)
            except (OSError, ValueError):  # the console or the log was closed first
                pass
            finally:
                os.close(read_end)

        tee = threading.Thread(target=copy, name="maxit-log-tee", daemon=True)
        tee.start()
    else:
        target = log_file.fileno()
    os.dup2(target, 1)
    os.dup2(target, 2)
    if verbose:
        os.close(write_end)
    try:
        yield console_out, console_err
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[1], 1)
        os.dup2(saved[2], 2)
        if tee is not None:
            tee.join(timeout=10)  # ends when no process holds the pipe's write end any more
        for fd in saved.values():
            os.close(fd)
        console_out.close()
        console_err.close()
        log_file.close()


def announce_round(tables: Tables, r: int, done: list[int], metrics, seconds: float, t_start: float, bar, out, trackers, judged) -> None:
    """Round r is done: its line on the console (the round table is printed once, at the end) and
    its metrics to the trackers."""
    bar.set_postfix_str(f"round {r}: {seconds:.0f}s")
    summary = round_summary(tables.root, [BASE_ROUND, *done], metrics, judged)
    line = round_line(_row(summary, r), _row(summary, BASE_ROUND), metrics, seconds, time.perf_counter() - t_start, _peak_rss_mb())
    _print_lines([line, *reward_error_lines(tables.root, r, str(tables.location))], bar, out)
    if trackers:
        log_round(tables.root, r, trackers, metrics=metrics)


def _row(summary: pl.DataFrame, round_: int) -> dict | None:
    rows = summary.filter(pl.col("round") == round_)
    return rows.row(0, named=True) if rows.height else None


def _print_lines(lines: list[str], bar, file: IO[str]) -> None:
    """`lines` on the console's stdout, the progress bar (on stderr) cleared first and drawn again
    below them, so that on a terminal the two do not share a line."""
    bar.clear()
    for line in lines:
        print(line, file=file, flush=True)
    bar.refresh()
