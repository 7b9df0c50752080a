"""Socket-level fault injection: a TCP proxy in front of a real redis-server that loses replies."""

from __future__ import annotations

import contextlib
import random
import socket
import threading


class ReplyDroppingProxy:
    """Forwards 127.0.0.1:<port> to a Redis; after a request containing ``match`` reaches the server,
    with probability ``p`` the server's reply is swallowed and the client's connection closed —
    the server applied the command, the client never heard of it."""

    def __init__(self, target_port: int, p: float, match: bytes = b"FCALL", seed: int = 0):
        self.target_port, self.p, self.match = target_port, p, match
        self.rng = random.Random(seed)
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            doomed = threading.Event()  # the next reply on this connection is to be lost
            threading.Thread(target=self._upstream, args=(client, server, doomed), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, doomed), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, doomed: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                if self.match in data:
                    with self._lock:
                        if self.rng.random() < self.p:
                            doomed.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)
            server.close()

    def _downstream(self, server: socket.socket, client: socket.socket, doomed: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if doomed.is_set():
                    with self._lock:
                        self.dropped += 1
                    break  # the reply is lost with the connection
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):  # shutdown first: it wakes the other pump's recv and sends FIN
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


class HoldingProxy:
    """Forwards 127.0.0.1:<port> to a Redis, holding back the next ``hold`` requests that contain
    ``match`` (e.g. the fold function's name): a request held is in flight — sent by the client, not yet
    executed — and stays so when the client dies. :meth:`release` delivers what is held."""

    def __init__(self, target_port: int, match: bytes):
        self.target_port, self.match = target_port, match
        self.hold = 0
        self.held: list[tuple[socket.socket, bytes]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the server is down: the client sees its connection closed
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.match in data:
                    with self._lock:
                        if self.hold > 0:
                            self.hold -= 1
                            self.held.append((dst, data))
                            continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:  # a connection with a request in flight stays open on the server's side
                keep = any(sock is dst for sock, _ in self.held) if upstream else False
            if not keep:
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """Deliver every held request (its reply goes nowhere when its client is gone)."""
        with self._lock:
            held, self.held = self.held, []
        for sock, data in held:
            sock.sendall(data)

    def close(self) -> None:
        self._listener.close()


class SilencingProxy:
    """Forwards 127.0.0.1:<port> to a Redis; :meth:`silence` makes every connection that has sent
    ``match`` (e.g. ``SUBSCRIBE``) go quiet both ways without closing — what a firewall or NAT that
    forgot an idle connection does: nothing arrives, nothing says so."""

    def __init__(self, target_port: int, match: bytes):
        self.target_port, self.match = target_port, match
        self.silenced = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            marked = threading.Event()  # this connection sent `match`
            threading.Thread(target=self._pump, args=(client, server, marked, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, marked, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, marked: threading.Event, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.match in data and not self.silenced.is_set():
                    marked.set()
                if marked.is_set() and self.silenced.is_set():
                    continue  # lost on the way, both ways
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def silence(self) -> None:
        """From now on the marked connections carry nothing; new ones work."""
        self.silenced.set()

    def close(self) -> None:
        self._listener.close()
