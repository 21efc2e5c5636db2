"""A black-hole HTTP(S) proxy on 127.0.0.1 that records every attempt.

Point a client's proxy variables here (`env()`: HTTP(S)_PROXY and ALL_PROXY,
with NO_PROXY=127.0.0.1,localhost) and any request it makes to another host
arrives here instead:
a CONNECT host:port (HTTPS) or an absolute-URL request (HTTP).  Each is
recorded in `attempts` (its request line) and refused with 403; nothing is
forwarded anywhere.  A test asserts `attempts == []`.
"""
from __future__ import annotations

import socket
import threading


class BlackHoleProxy:
    def __init__(self):
        self.attempts: list[str] = []
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "BlackHoleProxy":
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by stop()
                return
            threading.Thread(target=self._refuse, args=(conn,), daemon=True).start()

    def _refuse(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n" not in data and len(data) < 8192:
                    got = conn.recv(4096)
                    if not got:
                        break
                    data += got
            except OSError:
                pass
            self.attempts.append(data.split(b"\r\n", 1)[0].decode(errors="replace")
                                 or "(connection without a request)")
            try:
                conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            except OSError:
                pass

    def env(self) -> dict:
        """The environment variables that send a client's other traffic here."""
        env = {}
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = self.url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        return env

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
