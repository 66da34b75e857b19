"""`maxit ui` serves the asset graph on 127.0.0.1 and stops cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_asset_graph_and_stops_on_sigint(tmp_path):
    port = free_port()
    maxit = Path(sys.executable).with_name("maxit")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([str(maxit), "ui", "--port", str(port), "--store", str(tmp_path / "store")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        body = None
        deadline = time.time() + 180
        while time.time() < deadline and body is None:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/graphql",
                    data=json.dumps({"query": "{ assetNodes { assetKey { path } } }"}).encode(),
                    headers={"Content-Type": "application/json"},
                )
                body = json.loads(urllib.request.urlopen(req, timeout=10).read())
            except OSError:
                time.sleep(1)
        assert body is not None, "the UI did not answer within 3 minutes"
        keys = {n["assetKey"]["path"][0] for n in body["data"]["assetNodes"]}
        assert keys == {"problems", "rollouts", "advantages", "training_view", "policy", "evaluation"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (tmp_path / "home" / "dagster.yaml").exists()
