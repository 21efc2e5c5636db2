"""`python server.py` under a low limit on open files (RELAY_TEST_NOFILE,
soft and hard), so a test can run the relay out of descriptors with a few
hundred sockets instead of the 20,000 a busy relay meets."""
from __future__ import annotations

import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import server  # noqa: E402

if __name__ == "__main__":
    n = int(os.environ["RELAY_TEST_NOFILE"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    server.main()
