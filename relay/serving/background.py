"""Background loops (flushers, pollers, workers): stopping one."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background loop and wait until it has stopped.  Whatever it
    ended with is not raised: a loop logs its own failures, and a shutdown
    must go on to flush what is left.  A cancellation of the caller itself
    is raised, though: swallowed, it would let a stop that was given up on
    (its time bound passed) run on unbounded."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            raise
    except Exception:
        pass
