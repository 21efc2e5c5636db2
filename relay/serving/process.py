"""What the relay sets up in its own process before it serves: open-file
limit, garbage collector, allocator, and the HTTP server's socket options.
Each is measured in bench/streams.py (bench/README.md has the figures)."""
from __future__ import annotations

import collections
import ctypes
import errno
import gc
import logging
import os
import time

from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop

log = logging.getLogger("relay")


# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
# Blocks from this size come from mappings of their own while the relay is
# lean (below); otherwise from this one, so that a coding agent's 100 KB
# body, its parse and its copies are served from the heap.
MMAP_LEAN = 16 * 1024
MMAP_THRESHOLD = 4 * 1024 * 1024
# Free memory at the heap's top kept for the next call rather than given
# back to the kernel (and faulted in again, page by page, at once).
TRIM_THRESHOLD = 64 * 1024 * 1024
TOP_PAD = 4 * 1024 * 1024
# glibc's own, for a lean relay: what is freed goes back to the kernel.
TRIM_LEAN = TOP_PAD_LEAN = 128 * 1024
# Lean from this many open upstream transfers, and back below half of it.
LEAN_FROM = 1_000
# Tornado reads a client's socket into a fresh buffer of this size each
# time, and a body in pieces of it: a 100 KB body in two turns, not twelve.
READ_CHUNK = 64 * 1024


class Allocator:
    """glibc's allocator, set for the load the relay carries.

    Two costs pull apart.  A block from a mapping of its own is mapped,
    faulted in page by page and unmapped again each time: a coding agent's
    call makes a dozen such blocks of 100-250 KB (the body read, its parse,
    the bytes sent on), and a tenth of the relay's CPU went to page faults
    and munmap with a 16 KB threshold (perf, bench/agents.py).  But libcurl
    gives every transfer a 16 KB send buffer (the least
    CURLOPT_UPLOAD_BUFFERSIZE allows), zeroed by calloc
    and kept until the transfer ends, though a request fills only the
    first few hundred bytes of it.  From the heap all four pages are
    written by the zeroing and stay resident for the whole stream; from a
    fresh mapping the kernel's zero pages stand in and only the page
    written is resident: 22.7 -> 17.1 KB per transfer for libcurl alone,
    and 500 -> 477 MiB at 9,900 streams (bench/streams.py --http1).

    So the relay runs with big blocks on the heap and free memory kept at
    its top, and turns lean (16 KB blocks mapped when the heap has no free
    room for them, what is freed given back) from LEAN_FROM open
    transfers, where memory is what runs out, until they fall below half
    of that.  Blocks keep the kind they were made with (glibc marks each),
    so switching is safe at any time.  Not glibc (musl, macOS): nothing is
    changed."""

    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None)  # the process itself: libc is loaded
            self._mallopt, self._trim = libc.mallopt, libc.malloc_trim
        except (OSError, AttributeError):
            self._mallopt = self._trim = None
        self.lean: bool | None = None

    def start(self) -> bool:
        """Heap settings for a relay that is not lean; False if not glibc."""
        return self._set(False)

    def follow(self, open_transfers: int) -> None:
        """Called as transfers start: switch at the thresholds only."""
        if self.lean:
            if open_transfers < LEAN_FROM // 2:
                self._set(False)
        elif open_transfers >= LEAN_FROM and self.lean is not None:
            self._set(True)

    def _set(self, lean: bool) -> bool:
        if self._mallopt is None:
            return False
        self.lean = lean
        mallopt = self._mallopt
        ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_LEAN if lean else MMAP_THRESHOLD)
                  and mallopt(_M_TRIM_THRESHOLD, TRIM_LEAN if lean else TRIM_THRESHOLD)
                  and mallopt(_M_TOP_PAD, TOP_PAD_LEAN if lean else TOP_PAD))
        if lean:
            # What the heap kept for calls goes back now: glibc maps a
            # block only when no free heap memory can hold it.
            self._trim(0)
        return ok


allocator = Allocator()


# Connections accepted in one turn of the loop.  Tornado takes up to 128:
# with a burst of new streams arriving, each costs a few hundred
# microseconds (its objects, its first read), and turns of 20-30 ms made
# every plain call in the loop wait (bench/streams.py); the rest wait in
# the kernel's queue for the next turn.
ACCEPT_BATCH = 16


class RelayHTTPServer(HTTPServer):
    """Keeps TCP_NODELAY on for the whole life of each client connection,
    and accepts at most ACCEPT_BATCH connections a turn.

    Tornado turns TCP_NODELAY on at the end of every response and off again
    before the next one: two system calls per request.  A relay wants every
    streamed chunk sent at once anyway, so we set it once per connection.
    """

    def add_sockets(self, sockets) -> None:
        for sock in sockets:
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = add_accept_handler(sock, self._handle_connection)

    def handle_stream(self, stream, address) -> None:
        stream.set_nodelay(True)
        stream.set_nodelay = _keep_nodelay
        _small_queues(stream)
        super().handle_stream(stream, address)


class _Queue(list):
    """The deque operations Tornado's IOStream uses, on a list.

    An empty deque holds a 64-slot block from the start: two per client
    connection (pending writes and their futures) were 1.5 KB of every open
    stream, while an empty list is 56 bytes.  They hold the writes not yet
    on the wire, which the relay's back-pressure (MAX_PENDING in
    relay/attempts.py) keeps few, so popping a list's head stays cheap.
    """

    __slots__ = ()

    def popleft(self):
        return self.pop(0)


def _small_queues(stream) -> None:
    # Only where Tornado's attributes are what we expect: another version
    # keeps its own deques and just costs the memory.
    if type(getattr(stream, "_write_futures", None)) is collections.deque \
            and not stream._write_futures:
        stream._write_futures = _Queue()
    buf = getattr(stream, "_write_buffer", None)
    if type(getattr(buf, "_buffers", None)) is collections.deque and not buf._buffers:
        buf._buffers = _Queue()


def _keep_nodelay(value: bool) -> None:
    return None


def add_accept_handler(sock, callback, batch: int = ACCEPT_BATCH):
    """Tornado's netutil.add_accept_handler, taking at most `batch`
    connections a turn: the listening socket stays readable while more
    wait, so the loop comes back to it after its other work.  Returns the
    callable that stops accepting."""
    io_loop = IOLoop.current()
    removed = [False]
    keep_spare_descriptor()

    def accept_handler(fd, events: int) -> None:
        for _ in range(batch):
            if removed[0]:
                return
            try:
                connection, address = sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:  # closed while in the queue
                continue
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                # Out of descriptors: the socket stays readable, and a loop
                # that leaves it so spins.  Turn one away, with the spare.
                if not _refuse_one(sock):
                    pause()
                return
            callback(connection, address)

    def pause() -> None:
        if not removed[0]:
            io_loop.remove_handler(sock)
            io_loop.call_later(ACCEPT_PAUSE, resume)

    def resume() -> None:
        if not removed[0]:
            io_loop.add_handler(sock, accept_handler, IOLoop.READ)

    def remove_handler() -> None:
        io_loop.remove_handler(sock)
        removed[0] = True

    io_loop.add_handler(sock, accept_handler, IOLoop.READ)
    return remove_handler


# Out of descriptors: what a connection we cannot serve is told, and how
# long accepting pauses when not even the spare descriptor is left.
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s")
_REFUSAL_BODY = (b'{"error": {"message": "The relay has no file descriptor left for another '
                 b'connection; retry shortly.", "type": "server_error", "code": "relay_overloaded"}}')
ACCEPT_PAUSE = 0.1
_spare: list = []
_warned = [0.0]


def keep_spare_descriptor() -> None:
    """Hold one descriptor in reserve (the classic remedy for EMFILE at
    accept): given up to accept, answer and close one connection."""
    if not _spare:
        try:
            _spare.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass


def _refuse_one(sock) -> bool:
    """Accept one waiting connection with the spare descriptor, tell it 503
    and close it.  False when there was no spare to do it with."""
    if not _spare:
        keep_spare_descriptor()
        if not _spare:
            return False
    os.close(_spare.pop())
    try:
        conn, _ = sock.accept()
    except OSError:
        conn = None
    if conn is not None:
        try:
            conn.setblocking(False)
            conn.send(_REFUSAL % (len(_REFUSAL_BODY), _REFUSAL_BODY))
        except OSError:
            pass
        conn.close()
    keep_spare_descriptor()
    now = time.monotonic()
    if now - _warned[0] > 60:
        _warned[0] = now
        log.warning("out of file descriptors (limit %s): new connections are answered 503; "
                    "raise the limit (LimitNOFILE, ulimit -n): an HTTP/1.1 stream holds two",
                    _nofile())
    return True


def out_of_descriptors() -> bool:
    """Whether this process has no descriptor left to open (a cheap probe,
    made only after something failed to open one)."""
    try:
        os.close(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    return False


def _nofile() -> int:
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 0


def raise_open_file_limit() -> int:
    """Lift the soft limit on open files to the hard one and return it.

    Every open stream holds two descriptors (our client's socket and the
    upstream's, one per HTTP/1.1 stream), so the usual soft limit of 1,024
    would cap the relay at a few hundred streams."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 0


def tune_gc() -> None:
    """Keep the cyclic collector from pausing the loop in proportion to the
    open streams.

    A finished call is freed by reference counting (relay/upstream/client.py
    breaks its one cycle), so the collector's full passes find almost
    nothing, yet each walks every live object: with 10,000 open streams
    that is a million objects and a pause of a good part of a second,
    taken again each time the live set grew by a quarter.  So: the objects
    made at start are frozen out of its sight, full passes run on a timer
    (see serve()) instead of by growth, and the middle generation is
    collected every other young collection: while streams open, nearly
    everything survives, and a middle generation ten batches deep (the
    default) took 181 ms to walk at 10,000 streams."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(5_000, 2, 1_000_000)
