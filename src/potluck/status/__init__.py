"""The launcher's live status page: an HTTP server for the page, its JSON and /metrics.

``StatusServer(snapshot)`` serves ``/`` (the page), ``/api/status`` (the snapshot as JSON,
see docs/status.md) and ``/metrics`` (``render_prometheus`` of the snapshot).
"""

from potluck.status.prometheus import render_prometheus
from potluck.status.server import StatusServer

__all__ = ["StatusServer", "render_prometheus"]
