"""Billing's background loops stop when cancelled, even when the cancel
lands just as one of their database calls completes.  On Python 3.11,
asyncio.wait_for returns the call's result then and the cancel is lost: the
loop ran on, and a relay's shutdown (and asyncio.run's own clean-up) waited
for it for ever (seen under load as relays that logged "stopped" and never
exited, and money tests that hung).  Real billing on the real database
server; the race is made on purpose with a flush hook the test completes."""
import asyncio
import uuid

from models.store import Store
from relay.money.billing import Billing


def test_a_cancel_landing_as_a_database_call_ends_stops_the_flush_loop(mongo_url, tmp_path):
    async def go():
        store = Store(mongo_url, db_name="cl_" + uuid.uuid4().hex[:8])
        await store.start()
        b = Billing(store, process_id="A", data_dir=str(tmp_path / "A"))
        await b.start_up([])
        pending: list[asyncio.Future] = []

        async def hook():   # a database call that answers when the test says
            f = asyncio.get_running_loop().create_future()
            pending.append(f)
            return await f
        b.after_flush.append(hook)
        b.start()
        loop_task = b._flusher
        while not pending:
            await asyncio.sleep(0.01)
        pending[-1].set_result(None)
        await asyncio.sleep(0)      # the call has ended; wait_for has not yet woken
        loop_task.cancel()
        await asyncio.wait({loop_task}, timeout=5)
        stopped = loop_task.done()
        b.after_flush.clear()       # so that a loop that ran on can be stopped after all
        for f in pending:
            if not f.done():
                f.set_result(None)
        while not loop_task.done():
            loop_task.cancel()
            await asyncio.wait({loop_task}, timeout=1)
        b._flusher = None
        await b.stop()
        await store.close()
        assert stopped, "the flush loop went on after it was cancelled"
    asyncio.run(go())
