"""Isolation: which layers this machine offers ("bwrap", "netns", "none"), probed once per
process by running a small program in each, and the choice of a run's layer (`choose`: the
strongest available, or the one asked for, never none without `allow_unisolated_network`)."""

from __future__ import annotations

import functools
import os
import shutil

from pipeline.sandbox.process import execute, interpreter
from pipeline.sandbox.results import SandboxError, SandboxUnavailable
from pipeline.sandbox.uids import UID_BASE, UID_SLOTS

__all__ = ["ISOLATIONS", "available_isolation", "choose", "isolation_report"]

ISOLATIONS = ("bwrap", "netns", "none")

_PROBE = "import json, socket, traceback, os\nprint('ok' if os.getuid() != 0 or os.geteuid() != 0 else 'root')\n"


@functools.lru_cache(maxsize=None)
def _probe(kind: str, python: str | None = None) -> str | None:
    """None when isolation `kind` works here (a program runs in it, unprivileged, and imports
    from the standard library), else why not, on one line."""
    if kind == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap: not installed (apt-get install bubblewrap)"
    res, _ = execute("run", _PROBE, None, iso=kind, python=python, timeout=30, memory_mb=256, cpu_seconds=None,
                     max_processes=32, file_mb=1, max_open_files=64, output_cap=4096, work_root=None)
    if res.status == "ok" and res.stdout.strip() == "ok":
        return None
    lines = [l.strip() for l in res.stderr.splitlines() if l.strip()]
    why = lines[-1] if lines else res.reason
    if kind == "bwrap":
        return f"bwrap: cannot create its sandbox here ({why})"[:300]
    exe = interpreter(python)[0]
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
        "python": interpreter(python)[0],
    }


def choose(isolation: str, allow_unisolated_network: bool, python: str | None = None) -> str:
    """The isolation a run gets: "auto" is the strongest available; a named one must work here
    (else `SandboxUnavailable` saying why); "none" only with `allow_unisolated_network`."""
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
