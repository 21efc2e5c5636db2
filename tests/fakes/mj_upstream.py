"""A faithful fake of a Midjourney-proxy upstream (novicezk/midjourney-proxy
and the "plus" variant's action/modal/shorten/image-seed), on a real socket.

The secret is checked in the `mj-api-secret` header (401 otherwise).  Every
submit reply is HTTP 200 {code, description, result, properties}; ids are
16 random digits.  A task moves one step per time it is read (fetch or
list-by-condition): NOT_START -> SUBMITTED -> IN_PROGRESS 50% -> SUCCESS
100% (with imageUrl and U/V buttons), unless its prompt says otherwise:

    FAIL        ends in FAILURE after the IN_PROGRESS step
    BANNED      code 24, sensitive word; no task
    QUEUE_FULL  code 23; no task
    QUEUED      code 22 (accepted, queued)

Actions (plus): customId containing Inpaint or CustomZoom answers code 21
with status MODAL, continued by submit/modal.  Every request is recorded in
`calls` (method, path, body, headers).
"""
from __future__ import annotations

import json
import random
import time

import tornado.web

from tests.fakes.media_upstream import PNG_1PX

from tests.fakes.server import ThreadedServer

STEPS = [("NOT_START", "0%"), ("SUBMITTED", "0%"), ("IN_PROGRESS", "50%"), ("SUCCESS", "100%")]


def _buttons(task_id: str) -> list[dict]:
    out = []
    for kind, label in (("upsample", "U"), ("variation", "V")):
        for i in range(1, 5):
            out.append({"customId": f"MJ::JOB::{kind}::{i}::{task_id}hash", "emoji": "",
                        "label": f"{label}{i}", "style": 2, "type": 2})
    out.append({"customId": f"MJ::Inpaint::1::{task_id}hash::SOLO", "emoji": "🖌️",
                "label": "Vary (Region)", "style": 2, "type": 2})
    return out


class _Base(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def check_xsrf_cookie(self):
        pass

    def prepare(self):
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        self.body = body
        self.fake.calls.append({"method": self.request.method, "path": self.request.path,
                                "body": body, "headers": dict(self.request.headers)})
        if self.request.headers.get("mj-api-secret") != self.fake.secret:
            self.set_status(401)
            self.finish({"code": 4, "description": "unauthorized", "result": None})

    def reply(self, code, description, result=None, **props):
        self.finish({"code": code, "description": description, "result": result,
                     "properties": props})


class SubmitHandler(_Base):
    def post(self, action):
        b = self.body or {}
        f = self.fake
        if action in ("imagine", "shorten"):
            prompt = b.get("prompt") or ""
            if not prompt:
                return self.reply(4, "prompt不能为空")
            if "BANNED" in prompt:
                return self.reply(24, "可能包含敏感词", promptEn=prompt, bannedWord="banned")
            if "QUEUE_FULL" in prompt:
                return self.reply(23, "队列已满，请稍后尝试", numberOfQueues=10)
            task = f.new_task(action.upper(), prompt, f"/{action} {prompt}")
            if "QUEUED" in prompt:
                return self.reply(22, "排队中，前面还有1个任务", task["id"], numberOfQueues=1)
            return self.reply(1, "提交成功", task["id"])
        if action == "describe":
            if not str(b.get("base64") or "").startswith("data:"):
                return self.reply(4, "base64格式错误")
            return self.reply(1, "提交成功", f.new_task("DESCRIBE", "", "/describe")["id"])
        if action == "blend":
            if not isinstance(b.get("base64Array"), list) or len(b["base64Array"]) < 2:
                return self.reply(4, "base64List参数错误")
            return self.reply(1, "提交成功", f.new_task("BLEND", "", "/blend")["id"])
        if action in ("change", "simple-change"):
            if action == "simple-change":
                tid, _, op = (b.get("content") or "").partition(" ")
                kind = {"U": "UPSCALE", "V": "VARIATION", "R": "REROLL"}.get(op[:1])
            else:
                tid, kind = b.get("taskId"), b.get("action")
                op = f"{kind[:1]}{b.get('index') or ''}" if kind else ""
            target = f.tasks.get(tid)
            if target is None:
                return self.reply(3, "关联任务不存在或已失效")
            if target["status"] != "SUCCESS":
                return self.reply(4, "关联任务状态错误")
            t = f.new_task(kind, target["prompt"], f"/up {tid} {op or kind}")
            return self.reply(1, "提交成功", t["id"])
        if action == "action":
            target = f.tasks.get(b.get("taskId"))
            if target is None:
                return self.reply(3, "关联任务不存在或已失效")
            cid = b.get("customId") or ""
            if "Inpaint" in cid or "CustomZoom" in cid:
                t = f.new_task("INPAINT", target["prompt"], "/inpaint")
                t["status"] = "MODAL"
                return self.reply(21, "窗口等待", t["id"], status="MODAL",
                                  finalPrompt=target["prompt"])
            kind = "UPSCALE" if "upsample" in cid else "VARIATION"
            return self.reply(1, "提交成功", f.new_task(kind, target["prompt"], cid)["id"])
        if action == "modal":
            t = f.tasks.get(b.get("taskId"))
            if t is None or t["status"] != "MODAL":
                return self.reply(3, "任务不存在")
            t["status"], t["step"] = "SUBMITTED", 1
            if b.get("prompt"):
                t["prompt"] = b["prompt"]
            return self.reply(1, "提交成功", t["id"])
        self.set_status(404)
        self.finish()


class FetchHandler(_Base):
    def get(self, task_id):
        t = self.fake.tasks.get(task_id)
        if t is None:
            return self.finish("null")  # what midjourney-proxy answers for an unknown id
        self.finish(self.fake.advance(t))


class ListHandler(_Base):
    def post(self):
        if self.fake.no_list:
            self.set_status(404)
            return self.finish({"error": "not found"})
        ids = (self.body or {}).get("ids") or []
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps([self.fake.advance(self.fake.tasks[i]) for i in ids
                                if i in self.fake.tasks]))


class SeedHandler(_Base):
    def get(self, task_id):
        t = self.fake.tasks.get(task_id)
        if t is None or t["status"] != "SUCCESS":
            return self.reply(4, "任务未完成")
        self.reply(1, "success", str(int(task_id) % 4294967291))


class ImageFileHandler(tornado.web.RequestHandler):
    def initialize(self, fake):
        self.fake = fake

    def get(self, task_id):
        self.set_header("Content-Type", self.fake.image_type)
        self.finish(self.fake.image_body)


class FakeMidjourney(ThreadedServer):
    def __init__(self, secret: str = "mj-upstream-secret"):
        self.secret = secret
        self.tasks: dict[str, dict] = {}
        self.calls: list[dict] = []
        self.no_list = False
        # What a finished task's image is: where (None: this fake's own
        # /attachments/{id}.png) and, when served here, as what.
        self.image_url: str | None = None
        self.image_type = "image/png"
        self.image_body = PNG_1PX

    def new_task(self, action, prompt, description) -> dict:
        tid = str(random.randint(10 ** 15, 10 ** 16 - 1))
        t = {"id": tid, "action": action, "prompt": prompt, "promptEn": prompt,
             "description": description, "state": None, "submitTime": int(time.time() * 1000),
             "startTime": None, "finishTime": None, "imageUrl": None, "status": "NOT_START",
             "progress": "0%", "failReason": None, "properties": {"finalPrompt": prompt},
             "buttons": [], "step": 0}
        self.tasks[tid] = t
        return t

    def advance(self, t: dict) -> dict:
        """One step forward per read; returns the task as the proxy shows it."""
        if t["status"] not in ("SUCCESS", "FAILURE", "MODAL"):
            t["step"] = min(t["step"] + 1, len(STEPS) - 1)
            status, progress = STEPS[t["step"]]
            if status == "SUCCESS" and "FAIL" in (t["prompt"] or ""):
                t.update(status="FAILURE", progress="50%", failReason="[Invalid parameter] fake",
                         finishTime=int(time.time() * 1000))
            else:
                t.update(status=status, progress=progress)
                if status == "IN_PROGRESS":
                    t["startTime"] = int(time.time() * 1000)
                if status == "SUCCESS":
                    t.update(finishTime=int(time.time() * 1000), buttons=_buttons(t["id"]),
                             imageUrl=self.image_url or f"{self.url}/attachments/{t['id']}.png")
        return {k: v for k, v in t.items() if k != "step"}

    def reads(self, path_part: str) -> int:
        return sum(1 for c in self.calls if path_part in c["path"])

    def routes(self):
        kw = {"fake": self}
        p = r"(?:/mj)?"
        return [(p + r"/submit/([a-z-]+)", SubmitHandler, kw),
                (p + r"/task/list-by-condition", ListHandler, kw),
                (p + r"/task/(\d+)/fetch", FetchHandler, kw),
                (p + r"/task/(\d+)/image-seed", SeedHandler, kw),
                (r"/attachments/(\d+)\.png", ImageFileHandler, kw)]
