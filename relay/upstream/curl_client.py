"""Tornado's curl client, made to hold ten thousand transfers cheaply.

`CurlClient` is a `CurlAsyncHTTPClient`: the same libcurl multi handle
driven by the IOLoop through the same socket and timer callbacks.  What it
changes, and why:

- Curl handles are made when a transfer needs one and closed when more than
  `idle_handles` sit unused.  Tornado makes `max_clients` handles up front
  and queues every call past them in one line, so a thousand slow streams
  held up every plain call behind them.  Limits per kind of work live in
  relay/upstream/gate.py instead.
- `start(Transfer)` sets only the options a relay call needs (Tornado sets
  some forty per call) and builds no HTTPRequest or HTTPResponse.
- Body bytes are collected inside libcurl's callback and handed on once
  libcurl returns, in one batch per transfer per socket event.  Tornado
  queues one IOLoop callback per chunk, and running our code inside
  libcurl's callback is not safe (it may re-enter the multi handle).
- Header lines are kept raw and parsed only when someone reads them.
- HTTPS transfers wait for a connection that can multiplex (HTTP/2) rather
  than each opening its own socket; that is what keeps thousands of streams
  to one vendor within the process's open-file limit.  But at most
  `h2_streams` share a connection (libcurl's default is 100, vendors allow
  100 to 256): when a connection has data, libcurl marks every transfer on
  it dirty and runs each, and each that finds nothing for itself reads the
  socket again (EAGAIN) through OpenSSL.  At 100 streams a connection that
  was 58 failed recv() calls for every chunk delivered at 10,000 streams
  (37 at 50), and libcurl 40% of the relay's CPU (perf); settings.py has
  the trade-off.
- libcurl's sockets are watched in an epoll of our own, which the event
  loop watches as one descriptor for the client's life.  Tornado adds a
  socket's handler to the loop when libcurl wants it watched and removes it
  when it does not, at least once a call; on uvloop each add makes a poll
  handle and each remove closes it (about eight system calls a call).
  Here a socket libcurl stops watching rests in our epoll, so wanting it
  again is one epoll_ctl.  That is safe only in an epoll nobody else uses:
  libcurl closes resting sockets without a word (an idle connection
  dropped from its cache), and the kernel takes a closed descriptor out of
  an epoll by itself, so a number given to someone else is never watched
  for them by mistake, and one libcurl reuses is registered afresh (the
  kernel's ENOENT says so).  A resting socket that fires (the upstream
  closed it) is let go at once.  One turn of the loop takes at most
  `_BATCH` ready sockets, then the loop's other work runs; with a
  `turn_budget` (relay/upstream/client.py's client for streams), at most that
  much time once `budget_from` transfers are open, so that thousands of
  streams' chunks leave each loop turn short for the plain calls and new
  requests waiting behind them.
- A transfer added runs at once (its request goes out in `start`), not
  on the next loop turn when libcurl's zero timeout fires: one turn fewer
  for every call, and a turn lasts milliseconds when thousands of streams
  are open.

- A plain-HTTP transfer for which no idle pooled connection is known
  (`_idle`, counted from transfers that ended on a kept-alive connection
  and those that reused one) asks for a fresh connection: libcurl would
  otherwise look through every connection to the address, each busy with a
  stream, before opening one (0.7 ms a new stream with 4,000 open).

`fetch()` with an HTTPRequest keeps working (handles are made on demand
there too), so this is a drop-in for the parts of Tornado's API we use.
"""
from __future__ import annotations

import logging
import select
import time

import pycurl
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.ioloop import IOLoop

from relay.serving import process
from relay.serving.loop import epoll_set
from relay.serving.redact import redact_uri
from relay.upstream.transfer import Transfer

log = logging.getLogger("relay.upstream")

_PROTOCOLS = pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS
# Tornado's user agent, kept so upstreams see what they always saw.
USER_AGENT = "Mozilla/5.0 (compatible; pycurl)"
_EPOLL = hasattr(select, "epoll")  # Linux; elsewhere Tornado's registrations
_MASKS = {pycurl.POLL_NONE: 0, pycurl.POLL_IN: select.EPOLLIN, pycurl.POLL_OUT: select.EPOLLOUT,
          pycurl.POLL_INOUT: select.EPOLLIN | select.EPOLLOUT} if _EPOLL else {}
# Reported whatever was asked: they mean "act now" for whatever libcurl wants.
_TROUBLE = (select.EPOLLERR | select.EPOLLHUP) if _EPOLL else 0
_BATCH = 256
# libcurl's upload buffer: the least it allows, and its own default (see start()).
_UPLOAD_BUFFER, _UPLOAD_BUFFER_BIG = 16 * 1024, 64 * 1024


class CurlClient(CurlAsyncHTTPClient):
    def initialize(self, max_clients: int = 0, defaults=None, max_body_size: int = 104857600,
                   idle_handles: int = 64, max_connects: int = 1024, ca_file: str = "",
                   h2_streams: int = 50, turn_budget: float = 0.0,
                   budget_from: int = 0) -> None:
        self.turn_budget = turn_budget
        self.budget_from = budget_from
        self.idle_handles = idle_handles
        self.max_connects = max_connects
        # Plain-HTTP addresses: how many idle connections libcurl's pool
        # holds for each, as far as we can tell (see start()).
        self._idle: dict[str, int] = {}
        self._idle_total = 0
        self.ca_file = ca_file
        self._dirty: list[Transfer] = []
        self.active = 0
        # No handles up front: CurlAsyncHTTPClient.initialize makes
        # max_clients of them.
        super().initialize(max_clients=0, defaults=defaults, max_body_size=max_body_size)
        # The connection cache: libcurl's default grows with the handles
        # added (4 each), which after a burst of streams would keep
        # thousands of idle sockets open.
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connects)
        # Streams per HTTP/2 connection, below what the upstream allows: see
        # the module's docstring.
        self._multi.setopt(pycurl.M_MAX_CONCURRENT_STREAMS, h2_streams)
        self._wanted: dict[int, int] = {}      # fd -> epoll mask libcurl wants now
        self._registered: dict[int, int] = {}  # fd -> mask last given to our epoll
        self._ep = select.epoll() if _EPOLL else None
        if self._ep is not None:
            self.io_loop.add_handler(self._ep.fileno(), self._on_ready, IOLoop.READ)
        # With a turn budget, sockets libcurl wants to write to (a connect
        # under way, a request going out) wait in an epoll of their own,
        # served whole each turn: in the budgeted one they queued behind
        # thousands of streams' chunks, and a connect the kernel had made
        # long before timed out in libcurl (524) before the loop got to it.
        self._ep_out = select.epoll() if self._ep is not None and turn_budget else None
        if self._ep_out is not None:
            self.io_loop.add_handler(self._ep_out.fileno(), self._on_ready_out, IOLoop.READ)

    def close(self) -> None:
        self._curls = self._free_list
        for name in ("_ep", "_ep_out"):
            ep = getattr(self, name)
            setattr(self, name, None)
            if ep is not None:
                self.io_loop.remove_handler(ep.fileno())
                ep.close()
        self._wanted.clear()
        self._registered.clear()
        super().close()

    # ---- sockets --------------------------------------------------------------
    def _handle_socket(self, event: int, fd: int, multi, data) -> None:
        ep = self._ep
        if ep is None:  # no epoll (not Linux): Tornado's registrations
            super()._handle_socket(event, fd, multi, data)
            return
        wanted = self._wanted
        if event == pycurl.POLL_REMOVE:
            # It rests in our epoll, where wanting it again costs one call;
            # but a writable socket would fire at once, so that one goes.
            wanted.pop(fd, None)
            if self._registered.get(fd, 0) & select.EPOLLOUT:
                self._let_go(fd)
            return
        mask = _MASKS[event]
        if wanted.get(fd) == mask:
            return
        wanted[fd] = mask
        registered = self._registered
        out = self._ep_out
        if out is not None:
            before = registered.get(fd)
            if mask & select.EPOLLOUT:
                ep = out
            if before is not None and (before & select.EPOLLOUT) != (mask & select.EPOLLOUT):
                self._let_go(fd)  # it moves to the other epoll
        # (closed by libcurl while resting: the kernel took it out then)
        epoll_set(ep, fd, mask, fd in registered)
        registered[fd] = mask

    def _on_ready(self, fd: int, events: int) -> None:
        # At most _BATCH sockets (or turn_budget seconds) a turn: what is
        # still ready keeps the level-triggered epoll readable, and the loop
        # comes back to it after its other callbacks.
        # The budget only from `budget_from` open transfers: below that a
        # whole batch is short anyway, and turns cut short cost a tenth more
        # CPU a stream under load (bench/ab.py --stream, twenty streams).
        if not self.turn_budget or self.active < self.budget_from:
            for fd, mask in self._ep.poll(0, _BATCH):
                self._serve(fd, mask)
            self._finish_pending_requests()
            return
        # One socket at a time: a socket the kernel reported is served, so
        # the level-triggered epoll (which puts what it reports at the back
        # of its queue) takes every ready socket in turn.
        end = time.monotonic() + self.turn_budget
        poll = self._ep.poll
        while True:
            ready = poll(0, 1)
            if not ready:
                return
            self._serve(*ready[0])
            # Its chunks are handed on before the clock is read, so that the
            # budget counts them too.
            self._finish_pending_requests()
            if time.monotonic() >= end:
                return

    def _serve(self, fd: int, mask: int) -> None:
        want = self._wanted.get(fd)
        if want is None:
            # Ready while libcurl is not watching it (an idle connection
            # the upstream closed, libcurl's own wake-up): let go, or the
            # level-triggered epoll repeats it every turn.
            self._let_go(fd)
            return
        if mask & _TROUBLE:
            mask |= want
        action = 0
        if mask & select.EPOLLIN:
            action |= pycurl.CSELECT_IN
        if mask & select.EPOLLOUT:
            action |= pycurl.CSELECT_OUT
        self._act(fd, action)

    def _act(self, fd: int, action: int) -> None:
        while True:
            try:
                ret, _ = self._multi.socket_action(fd, action)
            except pycurl.error as e:
                ret = e.args[0] if isinstance(e.args[0], int) else 0
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                return

    def _let_go(self, fd: int) -> None:
        mask = self._registered.pop(fd, 0)
        try:
            (self._ep_out if mask & select.EPOLLOUT and self._ep_out is not None
             else self._ep).unregister(fd)
        except OSError:
            pass

    def _on_ready_out(self, _fd: int, _events: int) -> None:
        for fd, mask in self._ep_out.poll(0, _BATCH):
            self._serve(fd, mask)
        self._finish_pending_requests()

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
        setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(1000 * t.connect_timeout)))
        setopt(pycurl.NOSIGNAL, 1)
        if t.pacer is not None:
            # New connections are paced (relay/upstream/pacer.py): one
            # Python call for a connection opened, one for each transfer.
            setopt(pycurl.OPENSOCKETFUNCTION, t._open)
            setopt(pycurl.PREREQFUNCTION, t._prereq)
            if t.url[:5] == "http:" and self._idle.get(t.origin.key, 0) <= 0:
                # No idle connection to reuse: say so, or libcurl looks
                # through every connection to the address for one, all busy
                # with a stream each over HTTP/1.1: 0.7 ms a call with 4,000
                # open, 2.7 ms with 6,000, on the loop (libcurl 8.23).
                # (Not over HTTPS: an HTTP/2 connection takes new streams.)
                setopt(pycurl.FRESH_CONNECT, 1)
        if t.url[:6] == "https:":
            setopt(pycurl.PIPEWAIT, 1)
            if self.ca_file:
                setopt(pycurl.CAINFO, self.ca_file)
        # No LOW_SPEED_*: relay/upstream/client.py watches for silence itself.
        method = t.method
        if t.producer is None:
            # libcurl keeps an upload buffer for the transfer's life and sends
            # even a body handed over whole through it, a buffer-full a turn
            # of the loop.  The least it allows halves what an open stream
            # costs; a body past it (an agent's 100 KB) gets the default, or
            # takes a turn per 16 KB (test_curl_sockets.py).
            small = t.body is None or len(t.body) <= _UPLOAD_BUFFER
            setopt(pycurl.UPLOAD_BUFFERSIZE, _UPLOAD_BUFFER if small else _UPLOAD_BUFFER_BIG)
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
        if t.pacer is None:
            t.header_lines = None  # libcurl has its own copy now (else: once connected)
        curl.xfer = t
        self.active += 1
        process.allocator.follow(self.active)
        self._multi.add_handle(curl)
        self._kick()

    def _kick(self) -> None:
        """Run libcurl now for a transfer just added (the module's
        docstring): safe, as start() is never called from inside libcurl.
        What that run read or finished (this transfer may be whole already,
        from a fast upstream on a kept-alive connection) is handed on from
        the loop, as always, not inside start(): its caller has not even
        begun to wait, and a stream's owner finds its chunks flushed before
        it hears the transfer ended."""
        if self._timeout is not None:
            self.io_loop.remove_timeout(self._timeout)
            self._timeout = None
        while True:
            try:
                ret, _ = self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
            except pycurl.error as e:
                ret = e.args[0] if isinstance(e.args[0], int) else 0
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                break
        self.io_loop.asyncio_loop.call_soon(self._finish_pending_requests)
        timeout = self._multi.timeout()
        if timeout >= 0:
            self._set_timeout(timeout)

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
        if t.slot:
            # (error 28 before the connection was ready: the connect timed out)
            t.let_go(timed_out=t.dropped or (curl_error == pycurl.E_OPERATION_TIMEDOUT
                                             and not t.connected))
        if (not curl_error and t.origin is not None and t.url[:5] == "http:"
                and self.active + self._idle_total < self.max_connects
                and (t.header("connection") or "").lower() != "close"):
            # Its connection went back to the pool (past max_connects
            # connections libcurl closes an idle one instead).
            self._idle[t.origin.key] = self._idle.get(t.origin.key, 0) + 1
            self._idle_total += 1
        self._multi.remove_handle(curl)
        if t.dirty:
            self._deliver(t)
        self._give_back(curl)
        if not t.done.done():
            t.done.set_result((curl_error or 0, curl_message or ""))

    def connected(self, t: Transfer) -> None:
        """A transfer has its connection (Transfer._prereq): a pooled one
        if it opened no socket, and none was idle if it had to open one."""
        key = t.origin.key
        idle = self._idle.get(key, 0)
        if not idle or t.url[:5] != "http:":
            return
        if t.opened:
            self._idle_total -= idle  # what we thought was idle had gone
            del self._idle[key]
        else:
            self._idle[key] = idle - 1
            self._idle_total -= 1

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
            log.exception("streaming callback failed for %s", redact_uri(t.url))
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
