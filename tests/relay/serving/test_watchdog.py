"""The stop watchdog: a stop stuck on an await ends anyway, and says where."""
import subprocess
import sys
import time

from tests.helpers import ROOT

STUCK = """
import asyncio
from relay.serving import watchdog

async def wait_on_a_server_that_is_gone():
    await asyncio.Event().wait()

async def main():
    watchdog.arm(0.5)
    await wait_on_a_server_that_is_gone()

asyncio.run(main())
"""

FINE = """
import asyncio
from relay.serving import watchdog

async def main():
    watchdog.arm(30)

asyncio.run(main())
"""


def test_a_stuck_stop_ends_with_exit_1_and_the_await_it_was_stuck_on():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", STUCK], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1, out
    assert time.monotonic() - t0 < 25
    assert "did not end within" in out.stderr
    assert "wait_on_a_server_that_is_gone" in out.stderr     # the task's await point
    assert "Thread" in out.stderr                            # every thread's stack


def test_a_stop_that_ends_in_time_is_not_touched():
    out = subprocess.run([sys.executable, "-c", FINE], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == "", out
