"""Processes a test marks by an environment variable: found, killed, waited for (the tests of
overlapped rounds and of the lifeline check that no process of a run outlives it)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def marked(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment holds `mark`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if mark.encode() not in (d / "environ").read_bytes():
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmd:  # a zombie has none
            out.append((int(d.name), cmd))
    return out


def kill_marked(mark: str) -> None:
    for pid, _ in marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_until(condition, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()
