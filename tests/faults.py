"""Socket-level fault injection: TCP proxies in front of a real redis-server that lose, hold back or
silence what passes through them."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from typing import Any


class _Proxy:
    """Forwards 127.0.0.1:<port> to a Redis, a thread per direction of each connection; a subclass
    says what a connection carries (:meth:`_connection`) and how bytes pass (:meth:`_pump`)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._sockets: list[socket.socket] = []  # every connection's two ends, closed by close()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the server is down: the client sees its connection closed
                client.close()
                continue
            self._sockets += [client, server]
            state = self._connection()
            threading.Thread(target=self._pump, args=(client, server, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, state, False), daemon=True).start()

    def _connection(self) -> Any:
        """What both directions of a new connection share."""
        return None

    def _pump(self, src: socket.socket, dst: socket.socket, state: Any, upstream: bool) -> None:
        raise NotImplementedError

    @staticmethod
    def _hang_up(*socks: socket.socket) -> None:
        for sock in socks:  # shutdown first: it wakes the other pump's recv and sends FIN
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop listening and close every connection's two ends (a pump still running sees its end
        closed and stops)."""
        self._listener.close()
        self._hang_up(*self._sockets)
        for sock in self._sockets:
            sock.close()


class ReplyDroppingProxy(_Proxy):
    """After a request containing ``match`` reaches the server, with probability ``p`` the server's
    reply is swallowed and the client's connection closed — the server applied the command, the client
    never heard of it."""

    def __init__(self, target_port: int, p: float, match: bytes = b"FCALL", seed: int = 0):
        self.p, self.match = p, match
        self.rng = random.Random(seed)
        self.dropped = 0
        self._lock = threading.Lock()
        super().__init__(target_port)

    def _connection(self) -> threading.Event:
        return threading.Event()  # the next reply on this connection is to be lost

    def _pump(self, src: socket.socket, dst: socket.socket, doomed: threading.Event, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream and self.match in data:
                    with self._lock:
                        if self.rng.random() < self.p:
                            doomed.set()
                if not upstream and doomed.is_set():
                    with self._lock:
                        self.dropped += 1
                    break  # the reply is lost with the connection
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._hang_up(src, dst)
            if not upstream:
                src.close()
                dst.close()


class HoldingProxy(_Proxy):
    """Holds back the next ``hold`` requests that contain ``match`` (e.g. the fold function's name): a
    request held is in flight — sent by the client, not yet executed — and stays so when the client
    dies. :meth:`release` delivers what is held."""

    def __init__(self, target_port: int, match: bytes):
        self.match = match
        self.hold = 0
        self.held: list[tuple[socket.socket, bytes]] = []
        self._lock = threading.Lock()
        super().__init__(target_port)

    def _pump(self, src: socket.socket, dst: socket.socket, state: None, upstream: bool) -> None:
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
                self._hang_up(src, dst)

    def release(self) -> None:
        """Deliver every held request (its reply goes nowhere when its client is gone)."""
        with self._lock:
            held, self.held = self.held, []
        for sock, data in held:
            sock.sendall(data)


class SilencingProxy(_Proxy):
    """:meth:`silence` makes every connection that has sent ``match`` (e.g. ``SUBSCRIBE``) go quiet
    both ways without closing — what a firewall or NAT that forgot an idle connection does: nothing
    arrives, nothing says so."""

    def __init__(self, target_port: int, match: bytes):
        self.match = match
        self.silenced = threading.Event()
        super().__init__(target_port)

    def _connection(self) -> threading.Event:
        return threading.Event()  # this connection sent `match`

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
            self._hang_up(src, dst)

    def silence(self) -> None:
        """From now on the marked connections carry nothing; new ones work."""
        self.silenced.set()


class SilentServer:
    """A server that accepts connections and never answers (a hung Redis): ``url`` to connect to;
    `close` stops it and closes every connection it accepted."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            while True:
                self.held.append(self._listener.accept()[0])
        except OSError:  # closed
            pass

    def close(self) -> None:
        """Stop accepting, then close what was accepted (the accepting thread has ended first)."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        self._thread.join(timeout=5)
        for connection in self.held:
            connection.close()
