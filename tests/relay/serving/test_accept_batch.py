"""The relay's HTTP server accepts a bounded batch of connections a turn of
the loop (relay/serving/process.py): a burst of new streams must not hold every
plain call behind a turn that accepts a hundred of them.  Against a real
listening socket."""
from __future__ import annotations

import asyncio
import socket

from tornado.web import Application

from relay.serving import process


def test_a_burst_of_connections_is_accepted_a_batch_per_turn():
    async def go():
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen(128)
        lst.setblocking(False)
        accepted = []

        class Counting(process.RelayHTTPServer):
            def handle_stream(self, stream, address):
                accepted.append(stream)

        server = Counting(Application([]))
        server.add_sockets([lst])
        clients = [socket.create_connection(lst.getsockname()) for _ in range(40)]
        turns = []
        for _ in range(50):
            await asyncio.sleep(0)
            if not turns or len(accepted) != turns[-1]:
                turns.append(len(accepted))
            if len(accepted) == 40:
                break
        server.stop()
        for c in clients:
            c.close()
        for s in accepted:
            s.close()
        return turns
    turns = asyncio.run(go())
    assert turns[-1] == 40, turns
    steps = [b - a for a, b in zip([0] + turns, turns)]
    assert max(steps) <= process.ACCEPT_BATCH < 40, turns
