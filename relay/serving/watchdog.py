"""A stop that cannot hang.

Every step of a shutdown has its own bound, but some waits are not ours to
bound: asyncio.run() waits for every task it cancels at the end, and a
driver's task that takes its time to unwind holds the process up with it.
An operator's `systemctl stop` (or a test) must not wait on that forever.
Armed when the stop begins, the watchdog writes every thread's stack and
every task's await point to stderr once the whole bound has passed (what
the stop was stuck on, the thing one needs to fix it), then ends the
process with exit code 1.  By then the usage records are in the database or
the spill file: the stop writes the spill file when its own, shorter,
bound passes.
"""
from __future__ import annotations

import asyncio
import faulthandler
import io
import logging
import os
import sys
import threading

log = logging.getLogger("relay")

EXIT_CODE = 1


def _awaits(coro, depth: int = 0) -> list[str]:
    """Where a coroutine waits, down through what it awaits (a task's own
    stack stops at its outermost coroutine)."""
    lines = []
    while coro is not None and depth < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        depth += 1
    return lines


def _task_stacks(loop: asyncio.AbstractEventLoop) -> str:
    out = io.StringIO()
    try:
        for task in asyncio.all_tasks(loop):
            out.write(f"task {task.get_name()} waits at:\n")
            out.write("\n".join(_awaits(task.get_coro())) + "\n")
    except Exception as exc:  # read from another thread: best effort
        out.write(f"(tasks not listed: {exc!r})\n")
    return out.getvalue()


def arm(seconds: float, loop: asyncio.AbstractEventLoop | None = None) -> threading.Thread:
    loop = loop or asyncio.get_running_loop()

    def watch() -> None:
        threading.Event().wait(seconds)
        try:
            log.critical("the stop did not end within %.1fs; its stacks follow, then exit %d",
                         seconds, EXIT_CODE)
            sys.stderr.write(_task_stacks(loop))
            sys.stderr.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            sys.stderr.flush()
        finally:
            os._exit(EXIT_CODE)

    thread = threading.Thread(target=watch, name="stop-watchdog", daemon=True)
    thread.start()
    return thread
