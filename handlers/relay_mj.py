"""Midjourney-proxy routes, at {base}/mj/... and at {base}/... without the
prefix, optionally after a mode: /mj-fast, /mj-relax, /mj-turbo (or /fast,
/relax, /turbo).  The key is the sk- key in `mj-api-secret` (or Bearer).
Errors are Midjourney-shaped: {code, description, result, properties}.
"""
from __future__ import annotations

import json

from handlers.relay_base import RelayHandler
from handlers.sessions import session_user
from relay.faces.openai import load_json


class _MjHandler(RelayHandler):
    family = "mj"

    @property
    def mj(self):
        return self.ctx["mj"]

    def json_body(self) -> dict:
        return load_json(self.body or b"{}")

    def reply(self, doc) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps(doc, ensure_ascii=False))


class SubmitHandler(_MjHandler):
    async def post(self, mode=None, action=None) -> None:
        auth = await self.auth()
        reply = await self.mj.submit(auth, action, mode, self.json_body(), self.request_id,
                                     self.cancel)
        self.reply(reply)


class FetchHandler(_MjHandler):
    async def get(self, mode=None, task_id=None) -> None:
        auth = await self.auth()
        self.reply(await self.mj.fetch(auth, task_id))


class ListHandler(_MjHandler):
    async def post(self, mode=None) -> None:
        auth = await self.auth()
        self.reply(await self.mj.list(auth, self.json_body()))


class SeedHandler(_MjHandler):
    async def get(self, mode=None, task_id=None) -> None:
        auth = await self.auth()
        self.reply(await self.mj.seed(auth, task_id, self.cancel))


class ImageHandler(_MjHandler):
    """The task's image, streamed from where the upstream put it, so that
    clients need no access to the upstream: only to its owner (a key of the
    account, or its console session) unless mj_public_images is set, and
    only as an image that cannot run on our origin (relay/midjourney/images.py)."""

    async def get(self, mode=None, task_id=None) -> None:
        images = self.ctx["mj_images"]
        owner = None
        if not images.public:
            if self.api_key():
                owner = (await self.auth()).user.id
            else:
                doc, _ = await session_user(self)
                owner = doc["_id"] if doc else None
        task = await images.task(task_id, owner)
        await images.send(task, self, self.cancel)
        if not self.closed:
            self.finish()


_PRE = r"(?:/(?:mj-)?(?P<mode>fast|relax|turbo))?(?:/mj)?"
_ACT = r"(?P<action>imagine|change|simple-change|describe|blend|action|modal|shorten)"

default_handlers = [
    (_PRE + r"/submit/" + _ACT + r"/?", SubmitHandler),
    (_PRE + r"/task/list-by-condition/?", ListHandler),
    (_PRE + r"/task/(?P<task_id>[^/]+)/fetch/?", FetchHandler),
    (_PRE + r"/task/(?P<task_id>[^/]+)/image-seed/?", SeedHandler),
    (_PRE + r"/image/(?P<task_id>[^/]+?)(?:\.png)?/?", ImageHandler),
]
