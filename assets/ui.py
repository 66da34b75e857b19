"""`maxit ui`: the Dagster UI (`dagster dev`) on a store's own instance, bound to 127.0.0.1 by
default, its runs writing to that store."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from pipeline.store import UrlStore, is_url
from pipeline.store.lock import StoreLocked, command_line
from pipeline.store.lock import acquire as acquire_writer_lock

from assets.instance import PROJECT_ROOT, dagster_home


def ui(host: str = "127.0.0.1", port: int = 3000, home: str | Path | None = None, store: str | None = None, engine: str | None = None) -> int:
    """Run `dagster dev` bound to `host` on the store's instance (`dagster_home(store)`), its
    runs writing to that store, and exit cleanly on Ctrl-C or SIGTERM (dagster dev started in
    the background ignores both otherwise).

    `dagster dev` starts in the instance folder: started anywhere else it warns that a
    dagster.yaml there (the project's own, say) is not used; the code location is found by module
    and `--working-directory`, so the folder it starts in does not matter otherwise."""
    if store is not None and is_url(store):  # its working copy holds the instance; the stages write to the URL
        url = UrlStore(store)
        url.local.mkdir(parents=True, exist_ok=True)
        try:
            # reconciling deletes the working copy's tables the URL lacks: never under a live writer,
            # whose tables not yet uploaded they would be
            with acquire_writer_lock(url.local, command=command_line()):
                url.pull(reconcile=True)
        except StoreLocked as err:
            print(f"working copy not refreshed from {url.url}: {err}", flush=True)
        store_path, location = url.local, url.url
    else:
        store_path = Path(store or "runs/default").resolve()
        location = str(store_path)
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(dagster_home(store_path, home))
    env["MAXIT_STORE"] = location
    if engine:
        env["MAXIT_ENGINE"] = engine
    exe = Path(sys.executable).with_name("dagster")
    cmd = [str(exe), "dev", "--host", host, "--port", str(port), "-m", "assets.definitions", "--working-directory", str(PROJECT_ROOT)]
    print(f"Dagster UI on http://{host}:{port} (store {location}, instance {env['DAGSTER_HOME']}); Ctrl-C stops it", flush=True)
    import subprocess

    def restore_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()

    proc = subprocess.Popen(cmd, env=env, cwd=env["DAGSTER_HOME"], preexec_fn=restore_sigint)

    def forward(signum, _frame):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                forward(signal.SIGINT, None)
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
