"""Commands given as flags to server.py: each runs instead of the server
and exits (today --reset-admin-password), and the one-line refusal that
start-up and the actions share."""
from __future__ import annotations

import asyncio
import logging
import os
import sys

from models.datadir import DataDirBusy, DataDirLock
from models.seed import reset_root_password
from models.store import Store


def fail(message: str) -> None:
    """A start-up refusal: one line, exit status 1."""
    print(f"relay: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def own_command() -> str:
    """How this server was started, to repeat with another flag (e.g. `.venv/bin/python server.py`)."""
    python = os.path.relpath(sys.executable)
    return f"{sys.executable if python.startswith('..') else python} {sys.argv[0]}"


# Commands given as flags: each runs instead of the server and exits.
ACTIONS = {"reset_admin_password":
           "Give the administrator root a new password, print it once and exit; root must "
           "change it at the next sign-in (uses the same database settings as the server; "
           "works while a relay runs)."}


def reset_admin_password(config) -> None:
    """The --reset-admin-password action.  On the embedded database it takes
    the data directory's lock like a relay (so no relay starts a second
    database meanwhile); when a live relay holds it, the reset goes through
    that relay's database, named in the lock, as it would with --mongo-url."""
    url, db_name, lock = config.mongo_url, config.db_name, None
    if not url:
        lock = DataDirLock(config.data_dir)
        try:
            lock.acquire()
        except DataDirBusy as exc:
            lock = None
            url, db_name = exc.holder.get("database", ""), exc.holder.get("db_name", db_name)
            if not url:
                fail(f"{exc}, which is still starting; try again in a moment")
    try:
        asyncio.run(_reset_admin_password(url, config.data_dir, db_name))
    finally:
        if lock is not None:
            lock.release()


async def _reset_admin_password(url: str, data_dir: str, db_name: str) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    store = Store(url, data_dir, db_name, reports=False)
    await store.start()
    try:
        password = await reset_root_password(store)
    finally:
        await store.close()
    # Printed once, to the terminal only, never to the log.
    print(f"New password for the administrator 'root': {password}\n"
          "It will not be shown again; root must choose a new one at the next sign-in.",
          flush=True)
