"""relay/convert/common.new_id: ids from os.urandom read in blocks, so no
two are alike, across a block's end and from several threads at once."""
from __future__ import annotations

import re
import threading

from relay.convert import common


def test_ids_are_distinct_across_many_blocks():
    pool = common._RandomBytes(size=40)  # a refill every three ids
    ids = [pool.hex(12) for _ in range(3000)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert re.fullmatch(r"call_[0-9a-f]{24}", common.new_id("call_"))


def test_no_bytes_are_handed_out_twice_between_threads():
    pool = common._RandomBytes(size=48)
    seen: list[str] = []

    def take():
        got = [pool.hex(12) for _ in range(2000)]
        seen.extend(got)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8000 and len(set(seen)) == 8000
