"""relay/serving/process.py: the process-level settings the server applies at start.

The write queues swapped into Tornado's IOStream are checked on a real
socket pair: pending writes larger than the kernel's buffer, many small
ones, futures resolved in order, and the bytes arriving intact."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import platform
import socket
import subprocess
import sys

import pytest
from tornado.iostream import IOStream, StreamClosedError

from relay.serving import process


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


# Run in a process of its own: glibc maps a block only when no free heap
# memory can hold it, so what other tests left freed in this one's heap
# would decide the answer.
_ALLOCATOR_SCRIPT = """
import ctypes, json
from relay.serving import process

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
BIG = 3 * 1024 * 1024  # below MMAP_THRESHOLD, past the free room a lean heap keeps

def mapped(size):
    # the IS_MMAPPED bit of the chunk's size word, just before the pointer
    p = libc.malloc(size)
    assert p
    ctypes.memset(p, 7, size)  # the block is usable whichever it is
    out = bool(ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value & 2)
    libc.free(p)
    return out

a = process.Allocator()
seen = {"started": a.start(), "body": mapped(100_000), "parse": mapped(250_000),
        "big": mapped(BIG)}
a.follow(process.LEAN_FROM - 1)
seen["below"] = (a.lean, mapped(BIG))
a.follow(process.LEAN_FROM)
seen["lean"] = (a.lean, mapped(BIG))
a.follow(process.LEAN_FROM // 2)
seen["half"] = (a.lean, mapped(BIG))
a.follow(process.LEAN_FROM // 2 - 1)
seen["back"] = (a.lean, mapped(BIG))
print(json.dumps(seen))
"""


@pytest.mark.skipif(not _glibc(), reason="mallopt is glibc's")
def test_big_blocks_come_from_the_heap_until_the_relay_turns_lean():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", _ALLOCATOR_SCRIPT], cwd=root, timeout=60,
                         capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["started"] is True
    # An agent's body, its parse, and a bigger block: all from the heap.
    assert not seen["body"] and not seen["parse"] and not seen["big"]
    assert seen["below"] == [False, False]
    assert seen["lean"] == [True, True]  # mapped, and given back when freed
    assert seen["half"] == [True, True]  # back only below half: no flapping at the line
    assert seen["back"] == [False, False]


def test_a_body_is_read_in_pieces_that_stay_on_the_heap():
    assert process.READ_CHUNK >= 64 * 1024  # a 100 KB body in two reads
    assert process.READ_CHUNK < process.MMAP_THRESHOLD


async def _pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return IOStream(a), IOStream(b)


def test_small_queues_replace_the_deques_of_a_fresh_stream():
    async def go():
        w, r = await _pair()
        assert type(w._write_futures) is collections.deque
        process._small_queues(w)
        assert type(w._write_futures) is process._Queue
        assert type(w._write_buffer._buffers) is process._Queue
        w.close()
        r.close()
    asyncio.run(go())


def test_a_stream_with_small_queues_delivers_every_byte_in_order():
    async def go():
        w, r = await _pair()
        process._small_queues(w)
        big = bytes(range(256)) * 4096          # 1 MB: far past the socket buffer
        pieces = [b"%06d;" % i for i in range(3000)]
        futures = [w.write(big)] + [w.write(p) for p in pieces] + [w.write(big[:70_000])]
        expected = big + b"".join(pieces) + big[:70_000]
        got = await asyncio.wait_for(r.read_bytes(len(expected)), 30)
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert got == expected
        assert not w._write_futures and not w._write_buffer._buffers
        w.close()
        r.close()
    asyncio.run(go())


def test_closing_with_writes_pending_fails_their_futures():
    async def go():
        w, r = await _pair()
        process._small_queues(w)
        fut = w.write(b"x" * 2_000_000)
        w.close()
        with pytest.raises(StreamClosedError):
            await asyncio.wait_for(fut, 10)
        r.close()
    asyncio.run(go())


def test_a_stream_already_used_keeps_its_own_queues():
    class Odd:
        _write_futures = collections.deque([1])
    odd = Odd()
    process._small_queues(odd)  # not empty, no write buffer: left alone
    assert type(odd._write_futures) is collections.deque


def test_the_handlers_clear_is_tornados_but_for_the_date():
    # handlers/base.Base.clear() repeats Tornado's (to format Date once a
    # second): a Tornado that sets more in clear() must be noticed here.
    import email.utils
    from unittest import mock

    import tornado.web
    from tornado import httputil

    from handlers.base import Base

    class Ours(Base):
        def set_default_headers(self):
            pass

    class Theirs(tornado.web.RequestHandler):
        pass

    app = tornado.web.Application()
    made = []
    for cls in (Ours, Theirs):
        conn = mock.Mock()
        request = httputil.HTTPServerRequest(method="GET", uri="/", connection=conn)
        made.append(cls(app, request))
    ours, theirs = made
    assert set(vars(ours)) == set(vars(theirs))
    a, b = dict(ours._headers.get_all()), dict(theirs._headers.get_all())
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k != "Date"} == {k: v for k, v in b.items() if k != "Date"}
    assert abs(email.utils.parsedate_to_datetime(a["Date"]).timestamp()
               - email.utils.parsedate_to_datetime(b["Date"]).timestamp()) <= 2
    assert (ours._status_code, ours._reason, ours._write_buffer) == \
        (theirs._status_code, theirs._reason, theirs._write_buffer)


def test_request_ids_never_repeat_not_even_across_a_fork():
    # The id is the usage record's _id: a repeat would be a lost record.
    import os
    import re

    from handlers.base import new_request_id

    ids = [new_request_id() for _ in range(20_000)]  # several refills of the pool
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", i) for i in ids)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what it draws next, to the parent
        os.write(w, " ".join(new_request_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(w)
    child = set(os.read(r, 100_000).decode().split())
    os.waitpid(pid, 0)
    os.close(r)
    mine = {new_request_id() for _ in range(50)}
    assert len(child) == 50 and not child & mine
