"""``CountingProxy``: a loopback TCP proxy in front of a store that counts the
connections made to it, so a test can bound how many a process opens.

``hold()`` stops forwarding: a request made meanwhile waits, as when the store's one
thread is busy, while the proxy still accepts connections (as the kernel does for a
busy store). ``release()`` lets them through. ``close()`` ends every thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class CountingProxy:
    """Forwards each connection to the store on loopback ``target_port``; counts them."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept")]
        self._threads[0].start()

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.port}"

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._flowing.set()
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # (wakes the accept)
            self._listener.close()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(10)
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    client.close()
                    return
                self.connections += 1
                store = socket.create_connection(("127.0.0.1", self._target))
                self._sockets += [client, store]
                for source, sink in ((client, store), (store, client)):
                    pump = threading.Thread(target=self._pump, args=(source, sink),
                                            name="proxy-pump")
                    self._threads.append(pump)
                    pump.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Bytes from ``source`` to ``sink``; a chunk read while held waits for release."""
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            self._flowing.wait()
            if not data or self._closed:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
