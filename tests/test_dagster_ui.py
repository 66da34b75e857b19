"""A round table's materialization, as Dagster records it and as the UI shows it: the IO manager
(`assets.io`) gives each partition's materialization the table's row count and column schema,
read from the stored file; the instance holds them, and the UI's asset pages show them."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from html import unescape
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.config import RunSettings
from assets.definitions import make_resources
from assets.instance import dagster_home
from assets.partitions import rounds
from assets.problems import problems
from assets.resources import close_engines
from pipeline.store import table_path

PROJECT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
PROBLEMS = 6


@pytest.fixture(scope="module")
def problems_store(tmp_path_factory):
    """A store whose round 0 `problems` table was materialized through Dagster on an instance in
    the store's `.dagster/` (sqlite, so a webserver started later reads the same events)."""
    store = tmp_path_factory.mktemp("ui") / "store"
    home = dagster_home(store)  # the instance every store gets: the project's dagster.yaml (no modal)
    assert "nux:\n  enabled: false" in (home / "dagster.yaml").read_text()
    instance = dg.DagsterInstance.from_config(str(home))
    instance.add_dynamic_partitions(rounds.name, ["0"])
    try:
        result = dg.materialize([problems], partition_key="0", instance=instance,
                                resources=make_resources(str(store), "hf", RunSettings(problems=PROBLEMS)))
    finally:
        close_engines()
    assert result.success
    yield instance, store, home
    instance.dispose()


def stored_columns(store: Path) -> list[tuple[str, str]]:
    """(name, Arrow type) of each column of round 0's `problems` file, from its footer."""
    return [(f.name, str(f.type)) for f in pq.read_schema(table_path(store, 0, "problems"))]


def test_a_partitions_materialization_carries_the_tables_row_count_and_column_schema(problems_store):
    instance, store, _home = problems_store
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("problems"), asset_partitions=["0"]), limit=1).records
    assert len(records) == 1
    materialization = records[0].asset_materialization
    assert materialization.partition == "0"
    assert instance.get_latest_materialization_event(dg.AssetKey("problems")).asset_materialization.partition == "0"
    meta = materialization.metadata
    assert meta["dagster/row_count"].value == pq.read_metadata(table_path(store, 0, "problems")).num_rows == PROBLEMS
    schema = meta["dagster/column_schema"].schema
    assert isinstance(schema, dg.TableSchema)
    assert [(c.name, c.type) for c in schema.columns] == stored_columns(store)
    assert {"uid", "question", "answer", "split"} <= {c.name for c in schema.columns}
    assert meta["path"].value == str(table_path(store, 0, "problems"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PARTITION_QUERY = """{ assetOrError(assetKey: {path: ["problems"]}) { ... on Asset {
  assetMaterializations(partitions: ["0"], limit: 1) { partition metadataEntries { label
    ... on IntMetadataEntry { intValue }
    ... on TableSchemaMetadataEntry { schema { columns { name type } } } } } } } }"""
"""The partition's materialization as the UI's asset pages ask the webserver's GraphQL for it."""


def graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=20).read())


def dom_text(port: int, path: str) -> str:
    """The text of the page at `path` once headless Chromium has run its scripts (the UI is a
    React app that fetches its data over GraphQL): tags stripped, cells joined by " | "."""
    dom = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--dump-dom",
                          f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True, timeout=180).stdout
    text = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return re.sub(r"(\s*\|\s*)+", " | ", unescape(re.sub(r"<[^>]+>", " | ", text)))


def clicked_text(port: int, path: str, button: str, expect: list[str], tmp: Path) -> str:
    """The visible text of the page at `path` after a click on the element whose text is
    `button`, once every string of `expect` shows: headless Chromium driven over its DevTools
    protocol (on 127.0.0.1), as a user would open the page and press the button."""
    import asyncio

    import websockets

    debug = free_port()
    chrome = subprocess.Popen([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={debug}",
                               "--remote-debugging-address=127.0.0.1", f"--user-data-dir={tmp}", "about:blank"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    async def drive() -> str:
        deadline = time.time() + 120
        while True:
            try:
                pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{debug}/json/list", timeout=5).read())
                target = next(t["webSocketDebuggerUrl"] for t in pages if t.get("type") == "page")
                break
            except (OSError, StopIteration, ValueError):
                assert time.time() < deadline, "headless Chromium's DevTools endpoint did not come up within 2 minutes"
                await asyncio.sleep(1)
        async with websockets.connect(target, max_size=None) as ws:
            ids = iter(range(1, 10_000))

            async def call(method: str, **params):
                i = next(ids)
                await ws.send(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    reply = json.loads(await ws.recv())
                    if reply.get("id") == i:
                        return reply.get("result", {})

            async def text() -> str:
                result = await call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''", returnByValue=True)
                return result.get("result", {}).get("value", "")

            async def until(check, what: str) -> str:
                end = time.time() + 120
                while True:
                    seen = await text()
                    if check(seen):
                        return seen
                    assert time.time() < end, f"the page {path} did not show {what} within 2 minutes: {seen[:3000]}"
                    await asyncio.sleep(1)

            await call("Page.navigate", url=f"http://127.0.0.1:{port}{path}")
            await until(lambda seen: button in seen, repr(button))
            click = ("(() => { const hit = [...document.querySelectorAll('button, a, [role=button], span, div')]"
                     f".filter(e => e.textContent.trim() === {json.dumps(button)}); if (!hit.length) return false; hit[hit.length - 1].click(); return true; }})()")
            clicked = await call("Runtime.evaluate", expression=click, returnByValue=True)
            assert clicked.get("result", {}).get("value") is True, f"no element reads {button!r} on {path}"
            return await until(lambda seen: all(e in seen for e in expect), f"{expect} after the click on {button!r}")

    try:
        return asyncio.run(drive())
    finally:
        os.killpg(chrome.pid, signal.SIGKILL)
        chrome.wait()


@pytest.mark.slow  # starts the Dagster webserver and a browser: a minute or more
@pytest.mark.timeout(600)
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs headless Chromium at /usr/bin/chromium (the Debian package `chromium`)")
def test_the_ui_shows_the_partitions_row_count_and_columns(problems_store):
    """The webserver on the store's instance: the partition page of `problems` shows the row count
    and the column schema's entry, whose columns (each with its type) the page shows behind a
    "Show Table Schema" button, pressed here in a browser; the asset's overview page lists the latest materialization's columns with their types;
    and the GraphQL the pages read holds the partition's row count and column names."""
    _instance, store, home = problems_store
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "MAXIT_STORE": str(store), "PYTHONPATH": str(PROJECT)}
    log = home / "webserver.log"
    with open(log, "wb") as out:  # a file, not a pipe nobody reads while the test waits
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster-webserver")), "-h", "127.0.0.1", "-p", str(port), "-m", "assets.definitions",
             "--working-directory", str(PROJECT)],
            cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        entries = None
        deadline = time.time() + 300
        while entries is None and time.time() < deadline:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                mats = graphql(port, PARTITION_QUERY)["data"]["assetOrError"]["assetMaterializations"]
                entries = {e["label"]: e for e in mats[0]["metadataEntries"]} if mats else None
            except (OSError, KeyError, TypeError):
                time.sleep(2)
        assert entries is not None, "the webserver did not serve the partition's materialization within 5 minutes"
        columns = stored_columns(store)
        assert entries["dagster/row_count"]["intValue"] == PROBLEMS
        assert [(c["name"], c["type"]) for c in entries["dagster/column_schema"]["schema"]["columns"]] == columns

        partition_page = dom_text(port, "/assets/problems?view=partitions&partition=0")
        assert f"| dagster/row_count | {PROBLEMS} |" in partition_page, partition_page[:3000]
        assert "| dagster/column_schema | [Show Table Schema] |" in partition_page, partition_page[:3000]
        # the partition's own page, its schema opened as a user opens it: every column and its type
        shown = clicked_text(port, "/assets/problems?view=partitions&partition=0", "[Show Table Schema]", [n for n, _ in columns], home / "chromium")
        for name, arrow_type in columns:
            assert re.search(rf"\b{re.escape(name)}\s+{re.escape(arrow_type)}\b", shown), (name, arrow_type, shown[-3000:])

        overview = dom_text(port, "/assets/problems?view=overview")
        assert f"| Row count | {PROBLEMS} |" in overview, overview[:3000]
        assert "| Columns |" in overview and "| Column name | Type | Description |" in overview, overview[:3000]
        for name, arrow_type in columns:
            assert f"| {name} | {arrow_type} |" in overview, (name, overview[:3000])
    finally:  # the webserver and the code server it started: one process group
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
