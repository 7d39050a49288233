"""A small TCP proxy for the tests that can cut every connection through it at once, with a
reset, as a flaky network or a failover would; it also keeps the first bytes each client sent
(``openings``), which tell a TLS handshake from a plaintext command."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class ChaosProxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        self.cuts = 0
        self.closed = False
        self.chunks = 0  # forwarded so far, either way: lets a test cut by traffic, not time
        self.openings: list[bytes] = []  # each connection's first chunk from its client
        self.traffic = threading.Condition()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self.lock:
                self.sockets.update((client, upstream))
            for a, b, first in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(a, b, first), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, keep_first: bool = False) -> None:
        try:
            while data := src.recv(65536):
                if keep_first:
                    with self.lock:
                        self.openings.append(data)
                    keep_first = False
                dst.sendall(data)
                with self.traffic:
                    self.chunks += 1
                    self.traffic.notify_all()
        except OSError:
            pass
        finally:
            self._drop(src)
            self._drop(dst)

    def _drop(self, s: socket.socket) -> None:
        with self.lock:
            self.sockets.discard(s)
        with contextlib.suppress(OSError):
            # linger 0: close with a reset, mid-command, like a dead link
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            # close() alone would not wake the pump blocked in recv() on this socket
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()

    def wait_traffic(self, chunks: int, timeout: float) -> bool:
        """Wait until ``chunks`` more chunks have gone through; False on timeout."""
        with self.traffic:
            goal = self.chunks + chunks
            return self.traffic.wait_for(lambda: self.chunks >= goal, timeout)

    def cut(self) -> int:
        with self.lock:
            victims = list(self.sockets)
        for s in victims:
            self._drop(s)
        self.cuts += 1
        return len(victims)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut()
