"""A MongoDB wire-protocol forwarder on 127.0.0.1 with named faults.

A relay given `proxy.url` as its `--mongo-url` talks to the real database
server through here; every message is forwarded whole, in both directions,
and each command (OP_MSG) is read for its name and collection so that a
test can arm one of these faults for the next matching command:

    fail(command, collection)   the command ("*": any write) is not forwarded; the client gets
                                `{ok: 0, code: 1, errmsg: ...}` as the server
                                would answer a failed write
    drop(command, collection)   the command is not forwarded and the client's
                                connection is closed (a network failure)
    hold_reply(command, collection, seconds)
                                the command runs at once, its reply is held
                                back for `seconds` (a slow network: what the
                                client reads is as old as the command)

Each fault fires once; `fired` lists what fired.  Everything else passes
untouched, so the relay behind the proxy is a relay on a real database.
"""
from __future__ import annotations

import socket
import struct
import threading
import time

import bson

OP_MSG = 2013
# What "*" stands for: every command that writes.
WRITES = {"insert", "update", "delete", "findandmodify"}
_HEADER = struct.Struct("<iiii")


def _read_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        data = sock.recv(n - got)
        if not data:
            raise ConnectionError("closed")
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _read_message(sock: socket.socket) -> bytes:
    head = _read_exact(sock, 16)
    length = _HEADER.unpack(head)[0]
    return head + _read_exact(sock, length - 16)


def _command(msg: bytes) -> tuple[str, str] | None:
    """(command name, collection) of an OP_MSG, from its body section."""
    length, _rid, _to, op = _HEADER.unpack_from(msg)
    if op != OP_MSG:
        return None
    i = 20  # header, then flagBits
    while i < length:
        kind = msg[i]
        i += 1
        size = struct.unpack_from("<i", msg, i)[0]
        if kind == 0:
            body = bson.decode(msg[i:i + size])
            for name, value in body.items():
                return name.lower(), value if isinstance(value, str) else ""
            return None
        i += size
    return None


def _reply(request_id: int, doc: dict) -> bytes:
    body = b"\x00\x00\x00\x00" + b"\x00" + bson.encode(doc)
    return _HEADER.pack(16 + len(body), 0, request_id, OP_MSG) + body


class MongoProxy:
    def __init__(self, target_url: str):
        hostport = target_url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
        host, _, port = hostport.rpartition(":")
        self.target = (host or "127.0.0.1", int(port))
        self.port = 0
        self.fired: list[tuple[str, str, str]] = []
        self._faults: list[tuple[str, str, str, float]] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._conns: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    # ---- faults ---------------------------------------------------------------
    def fail(self, command: str, collection: str) -> None:
        self._arm("fail", command, collection)

    def drop(self, command: str, collection: str) -> None:
        self._arm("drop", command, collection)

    def hold_reply(self, command: str, collection: str, seconds: float) -> None:
        self._arm("hold", command, collection, seconds)

    def _arm(self, what: str, command: str, collection: str, seconds: float = 0.0) -> None:
        with self._lock:
            self._faults.append((what, command.lower(), collection, seconds))

    def _take(self, cmd: tuple[str, str] | None):
        if cmd is None:
            return None
        with self._lock:
            for f in self._faults:
                if (f[1] == cmd[0] or (f[1] == "*" and cmd[0] in WRITES)) and f[2] == cmd[1]:
                    self._faults.remove(f)
                    self.fired.append((f[0], cmd[0], cmd[1]))
                    return f
        return None

    # ---- serving --------------------------------------------------------------
    def start(self) -> "MongoProxy":
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        for c in list(self._conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, 10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._conns += [client, server]
            held: dict[int, float] = {}   # request id -> seconds to hold its reply
            threading.Thread(target=self._up, args=(client, server, held), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, held), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, held: dict) -> None:
        try:
            while True:
                msg = _read_message(client)
                fault = self._take(_command(msg))
                rid = _HEADER.unpack_from(msg)[1]
                if fault is not None and fault[0] == "fail":
                    client.sendall(_reply(rid, {"ok": 0.0, "code": 1, "codeName": "InternalError",
                                                "errmsg": "injected failure (tests/fakes/mongo_proxy.py)"}))
                    continue
                if fault is not None and fault[0] == "drop":
                    raise ConnectionError("dropped")
                if fault is not None and fault[0] == "hold":
                    held[rid] = fault[3]
                server.sendall(msg)
        except (OSError, ConnectionError):
            self._close(client, server)

    def _down(self, server: socket.socket, client: socket.socket, held: dict) -> None:
        try:
            while True:
                msg = _read_message(server)
                wait = held.pop(_HEADER.unpack_from(msg)[2], 0)
                if wait:
                    time.sleep(wait)
                client.sendall(msg)
        except (OSError, ConnectionError):
            self._close(client, server)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
