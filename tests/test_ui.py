"""`maxit ui --store DIR` serves the asset graph on 127.0.0.1 on DIR's own Dagster instance
(DIR/.dagster), without Dagster's warning about a dagster.yaml in the folder it was started
from, and stops cleanly on Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import shutil
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


PROJECT = Path(__file__).resolve().parents[1]


def test_ui_serves_the_asset_graph_and_stops_on_sigint(tmp_path):
    port = free_port()
    maxit = Path(sys.executable).with_name("maxit")
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    # started from a folder holding a dagster.yaml (as the project's own folder does)
    shutil.copyfile(PROJECT / "dagster.yaml", tmp_path / "dagster.yaml")
    proc = subprocess.Popen([str(maxit), "ui", "--port", str(port), "--store", "store"], cwd=tmp_path, env=env,
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
        # the UI's resources write to the store given, and its instance is the store's
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/graphql",
            data=json.dumps({"query": "{ instance { info } }"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        info = json.loads(urllib.request.urlopen(req, timeout=10).read())["data"]["instance"]["info"]
        assert str(tmp_path / "store" / ".dagster") in info
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) is not None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = proc.stdout.read().decode()
    assert f"store {tmp_path / 'store'}" in output
    assert "will not be used" not in output, output[-3000:]
    assert (tmp_path / "store" / ".dagster" / "dagster.yaml").exists()
    assert not (tmp_path / ".dagster_home").exists()
