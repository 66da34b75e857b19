"""The endpoint's HTTP server (`pipeline.rollout.endpoint`): loopback only, its routes
(`/ep/<key>/v1/chat/completions`, `/v1/completions`, `GET /v1/models`), each answered by the
`Endpoint` that owns the server, as JSON or as server-sent events.
"""

from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pipeline.rollout.openai_api import RequestError

__all__ = ["HOST", "EndpointServer", "EndpointHandler"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
"""The endpoint's one address: loopback, so nothing off this machine can call it."""


class EndpointServer(ThreadingHTTPServer):
    """The endpoint's threading HTTP server."""

    request_queue_size = 1024
    """Every running episode may connect at once (http.server's default backlog is 5: the rest
    would be refused)."""


class EndpointHandler(BaseHTTPRequestHandler):
    """A request to the endpoint, served by `owner` (the `Endpoint`, set on a subclass by `Endpoint.start`)."""

    owner: Any
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        log.debug("endpoint: " + format, *args)

    def _route(self) -> tuple[str | None, str]:
        """(episode key, the path after /v1/) of /ep/<key>/v1/<rest>; (None, rest) of /v1/<rest>."""
        path = self.path.split("?", 1)[0]
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "ep" and parts[2] == "v1":
            return parts[1], "/".join(parts[3:])
        if parts and parts[0] == "v1":
            return None, "/".join(parts[1:])
        return None, path

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _key, rest = self._route()
        if rest == "models":
            self._send(200, self.owner.models())
        else:
            self._send(404, RequestError(404, f"no such route: GET {self.path}", "not_found").body())

    def do_POST(self) -> None:  # noqa: N802
        key, rest = self._route()
        kinds = {"chat/completions": "chat", "completions": "completions"}
        raw = (self.headers.get("Content-Length") or "0").strip()
        if not raw.isdigit():
            # the body's end is unknown: answer and drop the connection, whose next bytes cannot be parsed
            self.close_connection = True
            calls = self.owner.episodes.get(key or "")
            if calls is not None:
                calls.fail(f"a request with a bad Content-Length header {raw[:40]!r}")
            self._send(400, RequestError(400, f"bad Content-Length header {raw[:40]!r}: a non-negative integer", "invalid_request").body())
            return
        length = int(raw)
        body = self.rfile.read(length) if length > 0 else b""
        try:
            if rest not in kinds:
                raise RequestError(404, f"no such route: POST {self.path} (the endpoint serves /v1/chat/completions and /v1/completions)", "not_found")
            if key is None:
                raise RequestError(404, "no episode key: use the client the program was given (its base URL holds the key)", "unknown_episode")
            payload = self.owner.serve(key, kinds[rest], body)
        except RequestError as err:
            self._send(err.status, err.body())
            return
        except Exception as exc:  # noqa: BLE001 - a bug here must answer, not hang the client
            log.exception("endpoint: request failed")
            calls = self.owner.episodes.get(key or "")
            if calls is not None:
                calls.fail(f"the endpoint failed on a request: {type(exc).__name__}: {exc}")
            self._send(500, RequestError(500, f"{type(exc).__name__}: {exc}", "internal_error", kind="server_error").body())
            return
        if "stream" in payload:
            self._send_stream(payload["stream"])
        else:
            self._send(200, payload)

    def _send_stream(self, chunks: list[dict]) -> None:
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
