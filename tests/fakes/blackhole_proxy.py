"""A recording black-hole HTTP(S) proxy on 127.0.0.1: every connection a
client makes through it is written down (its first line, e.g. `CONNECT
github.com:443`) and closed unanswered.  Point HTTP(S)_PROXY at it, with
NO_PROXY for 127.0.0.1, and a test can assert a CLI tried no other host."""
from __future__ import annotations

import socket
import threading


class BlackholeProxy:
    def __init__(self):
        self.attempts: list[str] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                first = conn.recv(4096).split(b"\r\n", 1)[0]
            except OSError:
                first = b""
            self.attempts.append(first.decode(errors="replace") or "(connection, no request)")
            conn.close()

    def env(self) -> dict:
        env = {}
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[name] = env[name.lower()] = self.url
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        return env

    def stop(self) -> None:
        self._stop = True
        self._sock.close()
