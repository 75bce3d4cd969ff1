"""The live status page's HTTP server: the page, ``/api/status`` and ``/metrics``.

``StatusServer(snapshot)`` serves from a daemon thread with the standard library's
``ThreadingHTTPServer``; every request calls ``snapshot()`` afresh. A snapshot that
raises answers 500 and is logged; the server thread keeps serving. Routes: ``/`` and
``/index.html`` (the page), ``/api/status`` (JSON), ``/metrics`` (Prometheus text).
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable, Mapping
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from potluck.errors import ConfigError
from potluck.status.prometheus import render_prometheus

log = logging.getLogger(__name__)

Snapshot = Callable[[], Mapping[str, Any]]

HTML = "text/html; charset=utf-8"
JSON = "application/json"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"


@cache
def page_html() -> bytes:
    """The status page (one self-contained HTML file shipped inside the package)."""
    return (files("potluck.status") / "page.html").read_bytes()


class StatusServer:
    """Serves the status page and its data on ``host:port`` (0: a free port)."""

    def __init__(self, snapshot: Snapshot, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(
                f"status port {port} is out of range: a TCP port is 0..65535; "
                "pick another --status-port, or 0 for a free one"
            )
        self._snapshot = snapshot
        self._host = host
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def start(self) -> StatusServer:
        """Bind and serve from a daemon thread; raises ConfigError when the port is taken."""
        if self._httpd is not None:
            return self
        if self._closed:
            raise RuntimeError("this StatusServer was closed; create a new one to serve again")
        handler = type("StatusHandler", (_Handler,), {"snapshot": staticmethod(self._snapshot)})
        try:
            httpd = ThreadingHTTPServer((self._host, self._port), handler)
        except OSError as exc:
            raise _bind_error(self._host, self._port, exc) from exc
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name=f"potluck-status-{self.port}", daemon=True)
        self._thread.start()
        log.info("status page at %s", self.url)
        return self

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port=0), once started."""
        if self._httpd is None:
            return self._port
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port/`` of the page."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/"

    def close(self) -> None:
        """Stop serving and release the port; safe to call more than once."""
        self._closed = True
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _bind_error(host: str, port: int, exc: OSError) -> ConfigError:
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"cannot serve the status page on {host}:{port}: the port is already in use; "
            "pick another --status-port, or 0 for a free one"
        )
    return ConfigError(
        f"cannot serve the status page on {host}:{port}: {exc.strerror or exc}; the address "
        "must be one of this machine's; pick another host, or another --status-port "
        "(0 for a free one)"
    )


class _Handler(BaseHTTPRequestHandler):
    """Answers one request; ``snapshot`` is set on a per-server subclass."""

    snapshot: Snapshot
    server_version = "potluck-status"

    def do_GET(self) -> None:  # the standard library calls it so
        path = urlsplit(self.path).path
        if path in ("/", "/index.html"):
            self._send(200, HTML, page_html())
        elif path == "/api/status":
            self._answer_snapshot(JSON, lambda s: json.dumps(s, allow_nan=False))
        elif path == "/metrics":
            self._answer_snapshot(PROMETHEUS, render_prometheus)
        else:
            self._send(404, TEXT, f"not found: {path} (try /, /api/status or /metrics)\n")

    def _answer_snapshot(self, content_type: str,
                         render: Callable[[Mapping[str, Any]], str]) -> None:
        try:
            body = render(type(self).snapshot())
        except Exception as exc:
            log.exception("status snapshot failed while answering %s", self.path)
            self._send(500, TEXT, f"status snapshot failed: {type(exc).__name__}: {exc}"
                       .splitlines()[0] + "\n")
            return
        self._send(200, content_type, body)

    def _send(self, code: int, content_type: str, body: str | bytes) -> None:
        data = body.encode() if isinstance(body, str) else body
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            log.debug("status client went away before the answer to %s", self.path)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)
