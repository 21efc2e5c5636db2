"""One upstream call as relay/upstream/curl_client.py runs it: the request, the
owner's callbacks, and what came back.

libcurl's callbacks only record here (`_header`, `_write`); the owner's
callbacks run outside libcurl, from `begin` and `deliver`, because running
our code inside libcurl's callback may re-enter the multi handle.
"""
from __future__ import annotations

import socket
import time
from typing import Callable

import pycurl
from tornado.httputil import HTTPHeaders

SYN_SENT = 2  # tcp_info's state of a socket whose SYN has no answer yet (Linux)


class Transfer:
    """One upstream call, its callbacks and what came back.

    The owner fills the request fields, may set `on_start(status, headers)`
    (once, before the first body chunk of an answer below 400) and
    `on_chunk(bytes)` (each body chunk of such an answer, outside libcurl);
    without `on_chunk` the body is collected in `body`.  `done` is a future
    that resolves to (curl error number, message), (0, "") on success.
    """

    __slots__ = ("method", "url", "header_lines", "body", "producer", "on_start", "on_chunk",
                 "connect_timeout", "max_body", "status",
                 "raw_headers", "_headers", "final", "started", "pending", "dirty", "chunks",
                 "size", "last_data", "done", "curl", "client", "ok_status", "upload_size",
                 "watch", "origin", "pacer", "slot", "paced", "connected", "opened", "sock",
                 "dropped", "drops")

    def __init__(self, method: str, url: str, header_lines: list, body: bytes | None = None):
        self.method = method
        self.url = url
        self.header_lines = header_lines
        self.body = body
        self.producer = None          # a callable for READFUNCTION (streamed upload)
        self.upload_size = -1         # its length, -1 when sent chunked
        self.on_start: Callable | None = None
        self.on_chunk: Callable | None = None
        self.connect_timeout = 10.0
        self.max_body = 512 * 1024 * 1024
        self.status = 0
        self.raw_headers: list = []
        self._headers: HTTPHeaders | None = None
        self.final = False
        self.started = False
        self.ok_status = False
        self.pending: list = []
        self.dirty = False
        self.chunks: list = []
        self.size = 0
        self.last_data = 0.0
        self.done = None
        self.watch = None             # the owner's deadlines (relay/upstream/client.py)
        self.curl = None
        self.client = None
        # Connect pacing (relay/upstream/pacer.py): the upstream address,
        # whether this transfer holds a place in its window, was refused one
        # (it waits, then starts again), has its connection, and when it
        # opened a socket.
        self.origin = None
        self.pacer = None
        self.slot = False
        self.paced = False
        self.connected = False
        self.opened = 0.0
        self.sock = None      # our copy of the socket it is connecting (libcurl has a dup)
        self.dropped = False  # given up: its SYN went unanswered
        self.drops = 0        # how often, for this call

    def release(self) -> None:
        """Forget the owner's callbacks once the transfer is over."""
        self.watch = self.on_chunk = self.on_start = self.producer = None

    @property
    def headers(self) -> HTTPHeaders:
        if self._headers is None:
            h = HTTPHeaders()
            for line in self.raw_headers:
                try:
                    h.parse_line(line)
                except Exception:
                    pass
            self._headers = h
        return self._headers

    def header(self, name: str, default: str | None = None) -> str | None:
        """One header's value without parsing them all (the first, if repeated)."""
        if self._headers is not None:
            return self._headers.get(name, default)
        prefix = name.lower() + ":"
        n = len(prefix)
        for line in self.raw_headers:
            if line[:n].lower() == prefix:
                return line[n:].strip()
        return default

    # ---- libcurl's callbacks (they only record) -----------------------------
    def _header(self, raw: bytes) -> None:
        if raw[:5] == b"HTTP/":
            self.raw_headers = []
            self._headers = None
            self.final = False
            try:
                self.status = int(raw.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = 502
        elif raw.strip():
            self.raw_headers.append(raw.decode("latin1").rstrip("\r\n"))
        elif self.status >= 200:
            self.final = True
            self.ok_status = self.status < 400

    def _write(self, chunk: bytes):
        if not self.last_data:
            self.last_data = time.monotonic()
        self.size += len(chunk)
        if self.size > self.max_body:
            return 0  # libcurl fails the transfer (CURLE_WRITE_ERROR)
        if self.on_chunk is None or not self.ok_status:
            self.chunks.append(chunk)
            return None
        self.pending.append(chunk)
        if not self.dirty:
            self.dirty = True
            self.client._dirty.append(self)
        return None

    def _open(self, purpose, address):
        """OPENSOCKETFUNCTION: libcurl opens a new connection (a pooled
        one is reused without this).  Refused while the address's window
        is full: libcurl then fails the transfer with "could not connect"
        having sent nothing, and the owner waits for a place and starts it
        again."""
        if not self.slot:
            if self.pacer is None or not self.pacer.take(self.origin):
                self.paced = True
                return pycurl.SOCKET_BAD
            self.slot = True
        if not self.opened:
            self.opened = time.monotonic()
        sock = socket.socket(address.family, address.socktype, address.protocol)
        if self.sock is not None:  # libcurl tries another address
            self.sock.close()
        self.sock = sock
        self.origin.dialing.add(self)
        return sock

    def _prereq(self, *_):
        """PREREQFUNCTION: the connection is ready (new or reused), the
        request not yet sent."""
        self.connected = True
        self.header_lines = None  # not started again: libcurl has its copy
        if self.client is not None:
            self.client.connected(self)
        if self.slot:
            self._hang_up()
            self.pacer.release(self.origin, time.monotonic() - self.opened if self.opened else None)
        return pycurl.PREREQFUNC_OK

    def let_go(self, timed_out: bool) -> None:
        """The transfer ended still holding a place in the window."""
        if self.slot:
            self._hang_up()
            self.pacer.release(self.origin, timed_out=timed_out)

    def _hang_up(self) -> None:
        self.slot = False
        if self.sock is not None:
            self.origin.dialing.discard(self)
            self.sock.close()
            self.sock = None

    def tcp_state(self) -> int:
        """The state of the socket being connected, as the kernel sees it
        (0 when unknown): a connect that completed but that the loop has not
        got to yet is ESTABLISHED, one whose SYN has no answer SYN_SENT."""
        try:
            return self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except (AttributeError, OSError):
            return 0

    def if_established(self) -> None:
        """Give back the place in the window once the kernel has made the
        connection, before libcurl gets to it."""
        if self.slot and self.sock is not None and self.tcp_state() not in (0, SYN_SENT):
            self._hang_up()
            self.pacer.release(self.origin, time.monotonic() - self.opened)

    def again(self) -> None:
        """Ready to start once more after a connect that sent nothing."""
        self.paced = self.connected = self.dropped = False
        self.opened = 0.0
        self.status = 0
        self.raw_headers = []
        self._headers = None
        self.final = self.started = self.ok_status = False

    # ---- outside libcurl ----------------------------------------------------
    def begin(self) -> None:
        """Tell the owner the answer started (once headers are complete)."""
        if not self.started and self.final:
            self.started = True
            if not self.last_data:
                self.last_data = time.monotonic()
            if self.on_start is not None and self.ok_status:
                self.on_start(self.status, self.headers)

    def deliver(self) -> None:
        self.dirty = False
        self.begin()
        chunks, self.pending = self.pending, []
        for chunk in chunks:
            self.on_chunk(chunk)
