"""The plumbing every fake shares: a Tornado app served from its own thread
and IOLoop on a free 127.0.0.1 port, so a test talks to it over a real socket."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop


def reset_connection(handler: tornado.web.RequestHandler) -> None:
    """Drop the client's connection with a TCP reset (SO_LINGER 0), as an
    upstream that dies mid-answer does."""
    stream = handler.request.connection.stream
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.close()


class ThreadedServer:
    """Subclasses define routes(); start() binds, serves and returns self."""

    backlog = 512
    port = 0
    _loop = None
    _thread = None
    _server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self) -> list:
        raise NotImplementedError

    def start(self):
        ready = threading.Event()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(self.backlog)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]

        def run():
            asyncio.set_event_loop(asyncio.new_event_loop())
            self._loop = IOLoop.current()
            self._server = HTTPServer(tornado.web.Application(self.routes()))
            self._server.add_sockets([sock])
            ready.set()
            self._loop.start()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def kill(self) -> None:
        """Die as a crashed upstream does: the port refuses, and every open
        connection (the relay's kept-alive ones too) is closed."""
        if self._loop is None:
            return

        async def shutdown():
            self._server.stop()
            for conn in list(self._server._connections):
                conn.stream.close()
            self._loop.stop()
        self._loop.add_callback(shutdown)
        self._thread.join(5)
        self._loop = None

    def stop(self) -> None:
        if self._loop is None:
            return

        def shutdown():
            self._server.stop()
            self._loop.stop()
        self._loop.add_callback(shutdown)
        self._thread.join(5)
        self._loop = None
