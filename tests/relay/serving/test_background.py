"""Stopping a background loop inside a stop that has a time bound."""
import asyncio

from relay.serving.background import cancel_and_wait
from relay.serving.buglog import reason


async def _stubborn(started: asyncio.Event, release: asyncio.Event) -> None:
    """A loop that takes a while to stop (a write it lets finish)."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        await release.wait()
        raise


def test_a_stop_given_up_on_is_not_kept_running_by_the_loop_it_waits_for():
    async def main():
        started, release = asyncio.Event(), asyncio.Event()
        loop_task = asyncio.create_task(_stubborn(started, release))
        await started.wait()
        went_on = []

        async def stop():
            await cancel_and_wait(loop_task)
            went_on.append(True)   # the rest of a stop that is out of time

        stopper = asyncio.create_task(stop())
        await asyncio.sleep(0.01)
        stopper.cancel()           # what wait_for does when the bound passes
        await asyncio.sleep(0.01)
        release.set()
        try:
            await asyncio.wait_for(stopper, 1)
        except asyncio.CancelledError:
            pass
        assert stopper.cancelled() and not went_on
        assert loop_task.done()

    asyncio.run(main())


def test_a_loop_that_fails_or_is_cancelled_does_not_stop_the_caller():
    async def main():
        async def fails():
            raise RuntimeError("boom")

        t = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait(t)
        t2 = asyncio.create_task(asyncio.sleep(3600))
        await cancel_and_wait(t2)
        await cancel_and_wait(None)
        assert t2.cancelled()

    asyncio.run(main())


def test_an_exception_without_text_is_named_by_its_type():
    assert reason(asyncio.TimeoutError()) == "TimeoutError"
    assert reason(OSError("refused")) == "refused"
