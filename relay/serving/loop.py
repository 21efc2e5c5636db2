"""The IOLoop the relay serves on: Tornado's asyncio loop, with the sockets
Tornado watches (its clients' and the listening ones) in an epoll of our
own, which the asyncio loop watches as one descriptor.

Why not the asyncio loop's own readers and writers:
- memory: on uvloop each watched socket is a poll handle and a callback
  handle, about 1.3 KB of every open stream by tracemalloc (2,000 streams);
  here it is an epoll entry, in the kernel.  The relay's RSS at 10,000
  streams fell by 5 MiB (bench/README.md);
- system calls: Tornado stops watching a client's socket for reads after
  every request it reads (the body is still in its buffer) and starts again
  a moment later, when the handler begins (to notice the client leaving).
  On uvloop each stop closes the poll handle and each start makes a new one:
  about eight system calls per request for nothing.

What Tornado sees is what any asyncio loop gives it: a socket is reported
readable or writable only for what Tornado wants; an error or a hang-up
wakes what it wants, as a selector does; IOLoop.ERROR is never reported.
A reader Tornado lets go of "rests": it stays registered, and wanting it
again costs nothing.  If it fires while resting it is taken out then,
before Tornado sees anything, so a socket Tornado is not reading (a client
sending ahead, or a full buffer) costs one extra wake-up, never a busy loop
or an unasked-for read.  `remove_handler` takes a socket out at once (Tornado
removes before it closes).  One turn of the asyncio loop takes at most
`_BATCH` ready sockets; more stay ready for the next turn, after the loop's
other work.

Descriptors given as numbers (the upstream client's own epoll, pipes) go to
the asyncio loop as before, and so does everything where there is no epoll.
"""
from __future__ import annotations

import logging
import select
import socket

from tornado.ioloop import IOLoop
from tornado.platform.asyncio import AsyncIOMainLoop

log = logging.getLogger("tornado.application")

_READ, _WRITE = IOLoop.READ, IOLoop.WRITE
_EPOLL = hasattr(select, "epoll")
_IN = select.EPOLLIN if _EPOLL else 0
_OUT = select.EPOLLOUT if _EPOLL else 0
_TROUBLE = (select.EPOLLERR | select.EPOLLHUP) if _EPOLL else 0
_BATCH = 256


class RelayLoop(AsyncIOMainLoop):
    def initialize(self, **kwargs) -> None:
        super().initialize(**kwargs)
        self.wants: dict[int, int] = {}   # our socket -> READ/WRITE Tornado wants now
        self.masks: dict[int, int] = {}   # our socket -> its mask in the epoll, if in it
        self._ep = select.epoll() if _EPOLL else None
        if self._ep is not None:
            self.selector_loop.add_reader(self._ep.fileno(), self._on_ready)

    def close(self, all_fds: bool = False) -> None:
        ep = self._ep
        if ep is not None:
            self.selector_loop.remove_reader(ep.fileno())
        super().close(all_fds)  # every handler through remove_handler, ours too
        if ep is not None:
            self._ep = None
            ep.close()

    def add_handler(self, fd, handler, events: int) -> None:
        fd, fileobj = self.split_fd(fd)
        if self._ep is None or not isinstance(fileobj, socket.socket):
            return super().add_handler(fileobj, handler, events)
        if fd in self.handlers:
            raise ValueError("fd %s added twice" % fd)
        self.handlers[fd] = (fileobj, handler)
        self._want(fd, events)

    def update_handler(self, fd, events: int) -> None:
        fd, _ = self.split_fd(fd)
        if fd in self.wants:
            self._want(fd, events)
        else:
            super().update_handler(fd, events)

    def remove_handler(self, fd) -> None:
        fd, _ = self.split_fd(fd)
        if fd not in self.wants:
            return super().remove_handler(fd)
        del self.wants[fd]
        self.handlers.pop(fd, None)
        if self.masks.pop(fd, None) is not None:
            self._unregister(fd)

    def _want(self, fd: int, events: int) -> None:
        want = events & (_READ | _WRITE)
        self.wants[fd] = want
        mask = (_IN if want & _READ else 0) | (_OUT if want & _WRITE else 0)
        have = self.masks.get(fd)
        if have is not None and have & _IN:
            mask |= _IN  # a reader let go of rests
        if have == mask:
            return
        if mask == 0:  # nothing wanted: asyncio would not watch it either
            if have is not None:
                del self.masks[fd]
                self._unregister(fd)
            return
        epoll_set(self._ep, fd, mask, have is not None)
        self.masks[fd] = mask

    def _unregister(self, fd: int) -> None:
        try:
            self._ep.unregister(fd)
        except (OSError, ValueError):
            pass  # closed already: the kernel took it out

    def _on_ready(self) -> None:
        ep = self._ep
        if ep is None:
            return
        wants, handlers = self.wants, self.handlers
        for fd, ev in ep.poll(0, _BATCH):
            want = wants.get(fd, 0)
            events = (_READ if ev & _IN else 0) | (_WRITE if ev & _OUT else 0)
            if ev & _TROUBLE:
                events |= want
            events &= want
            if not events:
                self._let_go(fd, want)
                continue
            fileobj, handler = handlers[fd]  # wanted, so ours and in there
            try:
                handler(fileobj, events)
            except Exception:  # as the asyncio loop would: logged, the others still served
                log.error("Exception in I/O handler for fd %s", fd, exc_info=True)

    def _let_go(self, fd: int, want: int) -> None:
        """Ready for nothing Tornado wants (a resting reader): watched from
        now on only for what it does want, if anything."""
        mask = _OUT if want & _WRITE else 0
        if fd in self.masks and mask:
            self.masks[fd] = mask
            try:
                self._ep.modify(fd, mask)
                return
            except OSError:
                pass  # closed meanwhile
        self.masks.pop(fd, None)
        self._unregister(fd)


def epoll_set(ep, fd: int, mask: int, known: bool) -> None:
    """Watch fd in ep for mask; `known`: we registered it before.  The
    kernel's view wins where ours is out of date: a socket closed while
    registered was taken out of the epoll then (a new socket under the same
    number is registered afresh), and one still there is modified."""
    try:
        if known:
            ep.modify(fd, mask)
        else:
            ep.register(fd, mask)
    except FileExistsError:
        ep.modify(fd, mask)
    except FileNotFoundError:
        ep.register(fd, mask)


def install() -> RelayLoop:
    """Make RelayLoop the IOLoop of the running asyncio loop (call before
    anything asks for IOLoop.current())."""
    return RelayLoop()
