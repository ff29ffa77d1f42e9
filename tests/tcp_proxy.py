"""A TCP proxy of the tests' own between the bridge and the service, which a test can cut
(new connections are reset and open ones are closed), slow down, or make reset every
connection, at chosen moments; `heal` restores it."""

import socket
import struct
import threading
import time


class TcpProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.mode = "pass"  # pass | cut | reset
        self.delay = 0.0  # seconds added before each chunk is forwarded
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        """The service is unreachable: open connections close, new ones are reset."""
        self.mode = "cut"
        with self.lock:
            for conn in self.connections:
                _reset(conn)
            self.connections.clear()

    def reset_all(self) -> None:
        """Every connection is reset as soon as a request arrives on it."""
        self.mode = "reset"

    def slow(self, seconds: float) -> None:
        self.delay = seconds

    def heal(self) -> None:
        self.mode, self.delay = "pass", 0.0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.mode == "cut":
                self.refused += 1
                _reset(client)
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _reset(client)
            return
        with self.lock:
            self.connections += [client, upstream]
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream, requests_side=True)

    def _pipe(self, source: socket.socket, sink: socket.socket, requests_side: bool = False) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if requests_side and self.mode != "pass":
                    self.refused += 1
                    break
                if self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except OSError:
            pass
        _reset(source)
        _reset(sink)

    def stop(self) -> None:
        self.listener.close()
        self.cut()


def _reset(conn: socket.socket) -> None:
    """Close with an RST, as a dropped link or a restarted load balancer does."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # shutdown acts at once, even while another thread is blocked reading this socket
        # (close alone would wait for that read to end).
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()
