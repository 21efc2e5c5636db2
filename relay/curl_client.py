"""Tornado's curl client, made to hold ten thousand transfers cheaply.

`CurlClient` is a `CurlAsyncHTTPClient`: the same libcurl multi handle
driven by the IOLoop through the same socket and timer callbacks.  What it
changes, and why:

- Curl handles are made when a transfer needs one and closed when more than
  `idle_handles` sit unused.  Tornado makes `max_clients` handles up front
  and queues every call past them in one line, so a thousand slow streams
  held up every plain call behind them.  Limits per kind of work live in
  relay/upstream.py instead.
- `start(Transfer)` sets only the options a relay call needs (Tornado sets
  some forty per call) and builds no HTTPRequest or HTTPResponse.
- Body bytes are collected inside libcurl's callback and handed on once
  libcurl returns, in one batch per transfer per socket event.  Tornado
  queues one IOLoop callback per chunk, and running our code inside
  libcurl's callback is not safe (it may re-enter the multi handle).
- Header lines are kept raw and parsed only when someone reads them.
- HTTPS transfers wait for a connection that can multiplex (HTTP/2) rather
  than each opening its own socket; that is what keeps thousands of streams
  to one vendor within the process's open-file limit.
- Fewer event-loop registrations.  Tornado removes and re-adds a socket's
  handler at every wish libcurl states, even an unchanged one.  Here a
  handler is changed in place, and the multi handle's own wake-up
  descriptors (eventfds made with it and closed with it, which libcurl asks
  us to watch while any transfer runs and to stop watching after each) stay
  registered for the client's life.  Other descriptors, such as the
  eventfd of one DNS lookup, are closed by libcurl after use and are let go
  when it says.  A socket that libcurl closed and reopened under the same
  number without telling us (Tornado's reason for re-adding) shows a new
  inode and is re-added.

`fetch()` with an HTTPRequest keeps working (handles are made on demand
there too), so this is a drop-in for the parts of Tornado's API we use.
"""
from __future__ import annotations

import logging
import os
import stat
import time
from typing import Callable

import pycurl
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httputil import HTTPHeaders
from tornado.ioloop import IOLoop

log = logging.getLogger("relay.upstream")

_PROTOCOLS = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS
# Tornado's user agent, kept so upstreams see what they always saw.
USER_AGENT = "Mozilla/5.0 (compatible; pycurl)"
_EVENTS = {pycurl.POLL_NONE: IOLoop.NONE, pycurl.POLL_IN: IOLoop.READ,
           pycurl.POLL_OUT: IOLoop.WRITE, pycurl.POLL_INOUT: IOLoop.READ | IOLoop.WRITE}


def _identity(fd: int) -> int:
    """A socket's inode; -1 for anything else, -2 for a closed descriptor."""
    try:
        st = os.fstat(fd)
    except OSError:
        return -2
    return st.st_ino if stat.S_ISSOCK(st.st_mode) else -1


def _eventfds() -> set[int]:
    """The process's open eventfds (Linux; elsewhere none are known)."""
    found = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventfd]":
                found.add(int(name))
        except (OSError, ValueError):
            pass
    return found


class Transfer:
    """One upstream call, its callbacks and what came back.

    The owner fills the request fields, may set `on_start(status, headers)`
    (once, before the first body chunk of an answer below 400) and
    `on_chunk(bytes)` (each body chunk of such an answer, outside libcurl);
    without `on_chunk` the body is collected in `body`.  `done` is a future
    that resolves to (curl error number, message), (0, "") on success.
    """

    __slots__ = ("method", "url", "header_lines", "body", "producer", "on_start", "on_chunk",
                 "connect_timeout", "low_speed_time", "max_body", "status",
                 "raw_headers", "_headers", "final", "started", "pending", "dirty", "chunks",
                 "size", "last_data", "done", "curl", "client", "ok_status", "upload_size",
                 "watch")

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
        self.low_speed_time = 120
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
        self.watch = None             # the owner's deadlines (relay/upstream.py)
        self.curl = None
        self.client = None

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


class CurlClient(CurlAsyncHTTPClient):
    def initialize(self, max_clients: int = 0, defaults=None, max_body_size: int = 104857600,
                   idle_handles: int = 64, max_connects: int = 1024, ca_file: str = "") -> None:
        self.idle_handles = idle_handles
        self.ca_file = ca_file
        self._dirty: list[Transfer] = []
        self.active = 0
        self._ids: dict[int, int] = {}  # fd -> _identity() when its handler was added
        self._unwatched: set[int] = set()  # kept fds libcurl is not watching now
        self._kept: frozenset[int] = frozenset()
        # No handles up front: CurlAsyncHTTPClient.initialize makes
        # max_clients of them.  The eventfds that appear while it makes the
        # multi handle are the handle's own, open until it is closed.
        before = _eventfds()
        super().initialize(max_clients=0, defaults=defaults, max_body_size=max_body_size)
        self._kept = frozenset(_eventfds() - before)
        # The connection cache: libcurl's default grows with the handles
        # added (4 each), which after a burst of streams would keep
        # thousands of idle sockets open.
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connects)

    def close(self) -> None:
        self._curls = self._free_list
        for fd in list(self._fds):
            self._drop(fd)
        super().close()

    # ---- sockets --------------------------------------------------------------
    def _handle_socket(self, event: int, fd: int, multi, data) -> None:
        fds = self._fds
        have = fds.get(fd)
        kept = fd in self._kept
        if event == pycurl.POLL_REMOVE:
            if have is not None:
                if kept:
                    self._unwatched.add(fd)
                else:
                    self._drop(fd)
            return
        self._unwatched.discard(fd)
        want = _EVENTS[event]
        if have is not None and not kept and _identity(fd) != self._ids.get(fd):
            # Closed and reopened under the same number: the kernel took the
            # old socket out of epoll by itself.
            self._drop(fd)
            have = None
        if have is None:
            self.io_loop.add_handler(fd, self._handle_events, want)
            self._ids[fd] = _identity(fd)
        elif have != want:
            self.io_loop.update_handler(fd, want)
        else:
            return
        fds[fd] = want

    def _drop(self, fd: int) -> None:
        self.io_loop.remove_handler(fd)
        del self._fds[fd]
        self._ids.pop(fd, None)
        self._unwatched.discard(fd)

    def _handle_events(self, fd: int, events: int) -> None:
        if fd in self._unwatched:
            # A kept descriptor became ready while libcurl was not watching
            # it: libcurl would ignore the event and the loop, level-
            # triggered, would repeat it.  Let go; the next wish re-adds it.
            self._drop(fd)
            return
        super()._handle_events(fd, events)

    # ---- handles made on demand, idle ones freed -----------------------------
    def _take(self) -> pycurl.Curl:
        return self._free_list.pop() if self._free_list else pycurl.Curl()

    def _give_back(self, curl: pycurl.Curl) -> None:
        if len(self._free_list) < self.idle_handles:
            curl.reset()
            self._free_list.append(curl)
        else:
            curl.close()

    def _process_queue(self) -> None:
        # Tornado's fetch(): a handle for every queued request.
        while len(self._free_list) < len(self._requests):
            self._free_list.append(pycurl.Curl())
        super()._process_queue()

    # ---- our transfers -------------------------------------------------------
    def start(self, t: Transfer) -> None:
        curl = self._take()
        t.curl = curl
        t.client = self
        t.done = self.io_loop.asyncio_loop.create_future()
        setopt = curl.setopt
        setopt(pycurl.URL, t.url)
        setopt(pycurl.HTTPHEADER, t.header_lines)
        setopt(pycurl.HEADERFUNCTION, t._header)
        setopt(pycurl.WRITEFUNCTION, t._write)
        setopt(pycurl.PROTOCOLS, _PROTOCOLS)
        setopt(pycurl.USERAGENT, USER_AGENT)
        setopt(pycurl.ACCEPT_ENCODING, "gzip,deflate")
        setopt(pycurl.CONNECTTIMEOUT_MS, int(1000 * t.connect_timeout))
        setopt(pycurl.NOSIGNAL, 1)
        if t.url[:6] == "https:":
            setopt(pycurl.PIPEWAIT, 1)
            if self.ca_file:
                setopt(pycurl.CAINFO, self.ca_file)
        # Under a byte a second for low_speed_time ends a silent stream (a
        # transfer we paused is exempt).
        setopt(pycurl.LOW_SPEED_LIMIT, 1)
        setopt(pycurl.LOW_SPEED_TIME, t.low_speed_time)
        method = t.method
        if t.producer is None:
            # libcurl keeps an upload buffer per transfer, 64 KB by default,
            # though a body we hand over whole never passes through it: the
            # smallest it allows halves what an open stream costs us.
            setopt(pycurl.UPLOAD_BUFFERSIZE, 16384)
        if t.producer is not None:
            setopt(pycurl.POST, 1)
            setopt(pycurl.READFUNCTION, t.producer)
            setopt(pycurl.POSTFIELDSIZE_LARGE, t.upload_size)
            if method != "POST":
                setopt(pycurl.CUSTOMREQUEST, method)
        elif t.body is not None and method != "GET":
            setopt(pycurl.POSTFIELDSIZE, len(t.body))
            setopt(pycurl.POSTFIELDS, t.body)
            if method != "POST":
                setopt(pycurl.CUSTOMREQUEST, method)
        elif method == "HEAD":
            setopt(pycurl.NOBODY, 1)
        elif method != "GET":
            setopt(pycurl.CUSTOMREQUEST, method)
        t.header_lines = None  # libcurl has its own copy now
        curl.xfer = t
        self.active += 1
        self._multi.add_handle(curl)
        self._set_timeout(0)

    def _finish(self, curl, curl_error=None, curl_message=None) -> None:
        t = getattr(curl, "xfer", None)
        if t is None:  # a request that came through fetch()
            super()._finish(curl, curl_error, curl_message)
            if len(self._free_list) > self.idle_handles:
                self._free_list.pop().close()
            return
        curl.xfer = None
        t.curl = None
        self.active -= 1
        self._multi.remove_handle(curl)
        if t.dirty:
            self._deliver(t)
        self._give_back(curl)
        if not t.done.done():
            t.done.set_result((curl_error or 0, curl_message or ""))

    def abort(self, t: Transfer) -> None:
        """Stop a transfer now (our client left); it ends with error 42."""
        curl = t.curl
        if curl is not None and getattr(curl, "xfer", None) is t:
            t.dirty = False
            t.pending = []
            self._finish(curl, pycurl.E_ABORTED_BY_CALLBACK, "aborted")

    def _deliver(self, t: Transfer) -> None:
        try:
            t.deliver()
        except Exception:
            log.exception("streaming callback failed for %s", t.url)
            self.io_loop.add_callback(self.abort, t)

    def _finish_pending_requests(self) -> None:
        # Called by Tornado after every socket_action: hand on what this
        # round of libcurl reads delivered, then finish completed transfers.
        if self._dirty:
            dirty, self._dirty = self._dirty, []
            for t in dirty:
                if t.dirty:
                    self._deliver(t)
        super()._finish_pending_requests()
