"""The IOLoop the relay serves on: Tornado's asyncio loop, with a reader
that Tornado lets go of kept registered until it is either wanted again or
fires.

Tornado stops watching a client's socket for reads after every request it
reads (the body is still in its buffer) and starts again a moment later,
when the handler begins (to notice the client leaving).  On uvloop each
stop closes the descriptor's poll handle and each start makes a new one:
about eight system calls per request for nothing (strace: a DEL, two
failing DELs, then an ADD and a DEL to probe the descriptor, a FIONBIO, a
failing DEL, the ADD).

Here a reader Tornado no longer wants "rests": it stays registered, and
wanting it again costs nothing.  If it fires while resting, it is removed
then, before Tornado sees anything, so a socket Tornado is not reading (a
client sending ahead, or a full buffer) costs one extra wake-up, never a
busy loop or an unasked-for read.  `remove_handler` removes at once, as
before, so a descriptor is never closed while registered (Tornado removes
before it closes).
"""
from __future__ import annotations

from tornado.ioloop import IOLoop
from tornado.platform.asyncio import AsyncIOMainLoop

_READ = IOLoop.READ


class RelayLoop(AsyncIOMainLoop):
    def initialize(self, **kwargs) -> None:
        self.resting: set[int] = set()
        super().initialize(**kwargs)

    def update_handler(self, fd, events: int) -> None:
        fd, _ = self.split_fd(fd)
        if events & _READ:
            self.resting.discard(fd)
        elif fd in self.readers:
            # Let go of, but left registered: Tornado's own update then
            # finds the reader there and leaves it alone.
            self.resting.add(fd)
            events |= _READ
        super().update_handler(fd, events)

    def remove_handler(self, fd) -> None:
        fd, _ = self.split_fd(fd)
        self.resting.discard(fd)
        super().remove_handler(fd)

    def _handle_events(self, fd: int, events: int) -> None:
        if events == _READ and fd in self.resting:
            self.resting.discard(fd)
            self.readers.discard(fd)
            self.selector_loop.remove_reader(fd)
            return
        super()._handle_events(fd, events)


def install() -> RelayLoop:
    """Make RelayLoop the IOLoop of the running asyncio loop (call before
    anything asks for IOLoop.current())."""
    return RelayLoop()
