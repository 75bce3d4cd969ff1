"""``StatusService``: what ``potluck run --status-port`` runs on node 0's agent.

The board (``board.StatusBoard``), a poller that reads the workers' pulses from the
job's store into it, and the HTTP server that shows it (``server.StatusServer``). The
agent also posts what it sees itself (a worker process that exited) as events.
"""

from __future__ import annotations

from types import TracebackType

from potluck.metrics.publisher import store_client
from potluck.status.board import StatusBoard, StorePoller
from potluck.status.server import StatusServer


class StatusService:
    """Start with ``start()``; ``url`` is the page; ``close()`` stops everything."""

    def __init__(self, run_id: str, store_port: int, *, host: str = "127.0.0.1",
                 port: int = 0, store_host: str = "127.0.0.1") -> None:
        self.board = StatusBoard(run_id)
        self._poller = StorePoller(store_client(store_host, store_port), self.board, run_id)
        self._server = StatusServer(self.board.snapshot, host=host, port=port)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> StatusService:
        self._server.start()  # a port in use raises ConfigError before anything runs
        self._poller.start()
        return self

    def event(self, what: str, text: str) -> None:
        self.board.add_event(what, text)

    def close(self) -> None:
        self._poller.close()
        self._server.close()

    def __enter__(self) -> StatusService:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
