"""Wiring: the task store, the Midjourney service and the poller, put into the
app.  Apart from tasks.py and service.py so that neither imports the other
both ways (service reads tasks' view of a task; this module needs both)."""
from __future__ import annotations

from relay.midjourney.images import Images
from relay.midjourney.service import MidjourneyService
from relay.midjourney.tasks import Poller, TaskStore


def install(app) -> None:
    """Wire the task store, the Midjourney service and the poller into the app."""
    s = app.settings
    s["mj_tasks"] = TaskStore(s["store"])
    poller = s["mj_poller"] = Poller(app)
    s["mj"] = MidjourneyService(s["mj_tasks"], s["service"], s["catalog"], s["upstream"], poller)
    s["mj_images"] = Images(s["mj_tasks"], s["catalog"], s["upstream"], s["config"])

    async def on_start(_app) -> None:
        s["mj_tasks"].db = s["store"].db
        await s["mj_tasks"].ensure_indexes()
        poller.start()

    async def on_stop(_app) -> None:
        await poller.stop()
        s["mj_images"].guarded.close()

    s["on_start"].append(on_start)
    s["on_stop"].append(on_stop)
