"""A TCP proxy on loopback that a test can stall: what a slow or partitioned link to the API server looks like
to one client (its requests hang) while every other client reaches the server as usual."""

from __future__ import annotations

import select
import socket
import threading


class StallingProxy:
    """Forwards 127.0.0.1:<port> to ``target`` (host, port) byte for byte (TLS passes through); while stalled, no
    byte moves either way and new connections wait."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.stalled = threading.Event()
        self.closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(client,), name="proxy-pipe", daemon=True).start()

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        ends = {client: upstream, upstream: client}
        try:
            while not self.closed.is_set():
                if self.stalled.is_set():
                    self.closed.wait(0.05)
                    continue
                ready, _, _ = select.select(list(ends), [], [], 0.1)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    ends[sock].sendall(data)
        except OSError:
            return
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self.closed.set()
        self.server.close()
