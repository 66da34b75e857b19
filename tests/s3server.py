"""An S3 API on loopback for tests: moto's server mode in a thread of the test's process.

`S3Server` listens on 127.0.0.1 (a free port), speaks the S3 REST API (conditional puts
included: `If-None-Match: *`, `If-Match`), and keeps its objects in memory for as long as it runs.
Processes find it through the standard `AWS_ENDPOINT_URL` (botocore, and so s3fs, read it), with
throw-away credentials: `env()` is what a child process needs, `environ()` sets it in this
process. Every request is logged (`requests`: method and key, in arrival order), and `hook`, when
set, sees each request first and may answer it itself (a status line), which lets a test kill a
writer while its upload is in flight, before the object exists.

    with S3Server() as s3:
        s3.create_bucket("bucket")
        subprocess.run([...], env={**os.environ, **s3.env()})
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Callable, Iterator
from urllib.parse import unquote

__all__ = ["S3Server", "CREDENTIALS"]

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # never the developer's own: no config or credentials file is read
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


class S3Server:
    """moto's S3 server on 127.0.0.1, started by `start()` (or `with`) and stopped by `stop()`."""

    def __init__(self):
        self.endpoint: str | None = None
        self.requests: list[tuple[str, str]] = []
        """(method, "bucket/key") of every request, in the order they arrived."""
        self.hook: Callable[[str, str], str | None] | None = None
        """Called with (method, "bucket/key") before a request is served; a returned status line
        ("503 Slow Down") answers it instead, and the request never reaches the store."""
        self._server = None
        self._thread: threading.Thread | None = None
        self._log = threading.Lock()

    def start(self) -> "S3Server":
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        moto = DomainDispatcherApplication(create_backend_app)

        def app(environ, start_response):
            request = (environ["REQUEST_METHOD"], unquote(environ.get("PATH_INFO", "")).lstrip("/"))
            with self._log:
                self.requests.append(request)
            answer = self.hook(*request) if self.hook is not None else None
            if answer:
                start_response(answer, [("Content-Type", "text/plain"), ("Content-Length", "0")])
                return [b""]
            return moto(environ, start_response)

        self._server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3 server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=30)
            self._server = None

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """The environment a process needs to use this server as its S3."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}

    @contextlib.contextmanager
    def environ(self) -> Iterator[None]:
        """`env()` set in this process for the block (what it replaced restored after)."""
        before = {k: os.environ.get(k) for k in self.env()}
        os.environ.update(self.env())
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def client(self):
        """A boto3 S3 client of this server (for what a test checks behind the library's back)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def objects(self, bucket: str, prefix: str = "") -> dict[str, str]:
        """key -> ETag of every object under `prefix`."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                out[item["Key"]] = item["ETag"]
        return out
