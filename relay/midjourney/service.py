"""The Midjourney-proxy protocol on our side: submit, fetch, list, seed, image.

A submit is one relay call through RelayService.relay() (reserve, channel,
adaptor, settle, usage record) whose model name is the price of its action:

    action                         price (model) name
    imagine / describe / blend /   mj_imagine / mj_describe / mj_blend /
    shorten                        mj_shorten
    change, simple-change U/V/R    mj_upscale / mj_variation / mj_reroll
    action (plus), by customId     mj_upscale (upsample*), mj_variation
                                   (*variation*), mj_reroll, mj_zoom
                                   (Outpaint), mj_pan (pan_*), mj_inpaint,
                                   mj_custom_zoom, else mj_action
    modal (plus)                   mj_modal (its charge joins the task's)

A mode prefix (/mj-relax, /mj-turbo, /mj-fast) prefers the price
"mj_<mode>_<action>" when one is set (e.g. mj_relax_imagine) and asks a plus
upstream for that mode, overwriting the body's accountFilter.modes; a prompt
flag (--fast, --relax, --turbo) naming another mode is a 400.  Without a
prefix, the mode the body names (one flag, or accountFilter.modes) is the
mode billed, as if it had come with the prefix (speed_mode()).  Midjourney channels must list the names they serve
among their models.  Each is billed call_price x 1 when the upstream accepts
the submit (codes 1 and 22, and 21 when a plus action waits for its modal);
a refusal costs nothing; a task that later fails is refunded (mj_tasks.py).
"""
from __future__ import annotations

import json
import re
import time

from relay import registry
from relay.adaptors.base import Call
from relay.adaptors.midjourney import EXISTED, IN_QUEUE, MjRefused
from relay.errors import RelayError, bad_request
from relay.midjourney.tasks import view

SUBMIT_ACTIONS = ("imagine", "change", "simple-change", "describe", "blend", "action", "modal",
                  "shorten")
MODES = ("fast", "relax", "turbo")
_CHANGE = {"UPSCALE": "upscale", "VARIATION": "variation", "REROLL": "reroll"}
_SIMPLE = {"U": "UPSCALE", "V": "VARIATION", "R": "REROLL"}


# A speed parameter in a prompt, as Midjourney reads them (--fast, --relax, --turbo).
_SPEED_FLAG = re.compile(r"(?<!\S)--(fast|relax|turbo)(?![\w-])", re.I)


def speed_mode(path_mode: str | None, body: dict) -> str | None:
    """The speed mode a submit runs in, which is the one it is billed at:
    the path's (/mj-relax, ...), else the one the body names, in the
    prompt's --fast/--relax/--turbo or in accountFilter.modes; None for the
    account's default (the base price).  A prompt that names another mode
    than the path, or a body that names two, is a 400 naming the field:
    the upstream would run the mode we did not bill.  accountFilter.modes
    is the relay's to set when there is a mode (the caller overwrites it)."""
    named: dict[str, str] = {}
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        for m in _SPEED_FLAG.finditer(prompt):
            named.setdefault(m.group(1).lower(), "prompt")
    if path_mode:
        other = sorted(m for m in named if m != path_mode)
        if other:
            raise bad_request(f"The prompt asks for --{other[0]}, but this is the "
                              f"/mj-{path_mode} route, which runs and bills {path_mode} mode. "
                              f"Remove the flag, or use /mj-{other[0]}.", "invalid_value",
                              "prompt")
        return path_mode
    flt = body.get("accountFilter")
    modes = flt.get("modes") if isinstance(flt, dict) else None
    if modes is not None:
        if not isinstance(modes, list) or not all(
                isinstance(m, str) and m.lower() in MODES for m in modes):
            raise bad_request(f"'accountFilter.modes' must list speed modes "
                              f"({', '.join(m.upper() for m in MODES)}).", "invalid_value",
                              "accountFilter.modes")
        for m in modes:
            named.setdefault(m.lower(), "accountFilter.modes")
    if len(named) > 1:
        field = "prompt" if "prompt" in named.values() else "accountFilter.modes"
        raise bad_request(f"The request names more than one speed mode "
                          f"({', '.join(sorted(named))}); name one, or use the route of the "
                          "mode (/mj-fast, /mj-relax, /mj-turbo).", "invalid_value", field)
    return next(iter(named), None)


def not_found(what: str = "task") -> RelayError:
    return RelayError(404, f"The {what} does not exist or is not yours.", "invalid_request_error",
                      "task_not_found")


def custom_id_kind(custom_id: str) -> str:
    cid = custom_id.lower()
    for needle, kind in (("upsample", "upscale"), ("variation", "variation"),
                         ("reroll", "reroll"), ("outpaint", "zoom"), ("customzoom", "custom_zoom"),
                         ("pan_", "pan"), ("inpaint", "inpaint")):
        if needle in cid:
            return kind
    return "action"


def _need_str(body: dict, name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value.strip():
        raise bad_request(f"'{name}' must be a non-empty string.", "invalid_value", name)
    return value


def _data_url(value, name: str) -> None:
    if not isinstance(value, str) or not re.match(r"^data:[\w.+-]+/[\w.+-]+;base64,", value):
        raise bad_request(f"'{name}' must be an image as a data URL "
                          "(data:image/png;base64,...).", "invalid_value", name)


class MidjourneyService:
    def __init__(self, tasks, service, catalog, upstream, poller):
        self.tasks = tasks
        self.service = service
        self.catalog = catalog
        self.upstream = upstream
        self.poller = poller

    # ---- submit ---------------------------------------------------------------
    async def submit(self, auth, path_action: str, mode: str | None, body: dict,
                     request_id: str, cancel) -> dict:
        """Relay one submit; returns the reply {code, description, result,
        properties} with our task id.  Raises RelayError for our own refusals
        (bad input, key, quota, related task not found)."""
        body = dict(body)
        # The upstream would call a client's hook itself, with its own task
        # ids and bypassing us: not supported, so not passed on.
        body.pop("notifyHook", None)
        kind, ref = await self._check(auth, path_action, body)
        mode = speed_mode(mode, body)
        model = self._model(kind, mode, auth.group)
        if mode and path_action not in ("modal",):
            # The mode billed is the mode sent: whatever the client put here.
            flt = body.get("accountFilter") if isinstance(body.get("accountFilter"), dict) else {}
            body["accountFilter"] = dict(flt, modes=[mode.upper()])
        call = Call(request_id=request_id, endpoint="mj_submit", face="mj", model=model,
                    body=body, extra={"units": 1, "mj_path": path_action})
        if ref is not None:
            call.extra["channel_id"] = ref["channel_id"]
        out = await self.service.relay(call, auth, None, None, cancel)
        if out.error is not None:
            if isinstance(out.error, MjRefused):
                return await self._refusal(out.error.reply, auth, out.channel)
            raise out.error
        reply = out.body
        props = reply.get("properties") if isinstance(reply.get("properties"), dict) else {}
        status = ("MODAL" if reply.get("code") == EXISTED else
                  "NOT_START" if reply.get("code") == IN_QUEUE else "SUBMITTED")
        upstream_id = str(reply["result"])
        if path_action == "modal" and ref is not None and upstream_id == ref["upstream_id"]:
            await self.tasks.add_charge(ref["_id"], out.charged, status)
            task_id = ref["_id"]
        else:
            doc = await self.tasks.create(self._task_doc(auth, call, out, upstream_id, status,
                                                         kind, body, ref))
            task_id = doc["_id"]
        self.poller.wake()
        return {"code": reply.get("code"), "description": reply.get("description") or "Submitted",
                "result": task_id, "properties": props}

    async def _check(self, auth, path_action: str, body: dict):
        """Validate a submit body; map related task ids to the upstream's.
        Returns (price kind, related task or None)."""
        ref = None
        if path_action == "imagine":
            _need_str(body, "prompt")
            return "imagine", None
        if path_action == "shorten":
            _need_str(body, "prompt")
            return "shorten", None
        if path_action == "describe":
            _data_url(body.get("base64"), "base64")
            return "describe", None
        if path_action == "blend":
            arr = body.get("base64Array")
            if not isinstance(arr, list) or not 2 <= len(arr) <= 5:
                raise bad_request("'base64Array' must hold 2 to 5 images.", "invalid_value",
                                  "base64Array")
            for item in arr:
                _data_url(item, "base64Array")
            return "blend", None
        if path_action == "simple-change":
            content = _need_str(body, "content")
            m = re.fullmatch(r"\s*(\S+)\s+([UV])([1-4])\s*|\s*(\S+)\s+(R)\s*", content)
            if not m:
                raise bad_request("'content' must be '<taskId> U1'..'U4', 'V1'..'V4' or 'R'.",
                                  "invalid_value", "content")
            tid = m.group(1) or m.group(4)
            ref = await self._related(auth, tid)
            letter = m.group(2) or "R"
            body["content"] = f"{ref['upstream_id']} {letter}{m.group(3) or ''}"
            return _CHANGE[_SIMPLE[letter]], ref
        # change, action, modal: they name a task of the caller's
        ref = await self._related(auth, _need_str(body, "taskId"))
        body["taskId"] = ref["upstream_id"]
        if path_action == "change":
            action = str(body.get("action") or "").upper()
            if action not in _CHANGE:
                raise bad_request("'action' must be UPSCALE, VARIATION or REROLL.",
                                  "invalid_value", "action")
            if action != "REROLL":
                idx = body.get("index")
                if not isinstance(idx, int) or isinstance(idx, bool) or not 1 <= idx <= 4:
                    raise bad_request("'index' must be 1 to 4.", "invalid_value", "index")
            return _CHANGE[action], ref
        if path_action == "action":
            return custom_id_kind(_need_str(body, "customId")), ref
        return "modal", ref

    async def _related(self, auth, task_id: str) -> dict:
        ref = await self.tasks.owned(task_id, auth.user.id)
        if ref is None:
            raise not_found("related task")
        return ref

    def _model(self, kind: str, mode: str | None, group: str) -> str:
        if mode:
            name = f"mj_{mode}_{kind}"
            if self.catalog.price(name, group) is not None:
                return name
        return f"mj_{kind}"

    def _task_doc(self, auth, call, out, upstream_id, status, kind, body, ref) -> dict:
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else (
            ref.get("prompt") if ref else "")
        now = time.time()
        return {
            "upstream_id": upstream_id, "channel_id": out.channel.id,
            "user_id": auth.user.id, "username": auth.user.username,
            "token_id": auth.token.id, "token_name": auth.token.name, "group": auth.group,
            "billing_mode": auth.token.billing_mode, "client_ip": auth.client_ip,
            "request_id": call.request_id, "model": call.model, "charged": out.charged,
            "refunded": False, "done": False, "next_poll": now, "created_at": now,
            "action": kind.upper() if kind in ("imagine", "describe", "blend", "shorten",
                                               "upscale", "variation", "reroll", "zoom", "pan")
            else "ACTION",
            "status": status, "prompt": prompt or "", "promptEn": "", "description": "",
            "state": body.get("state") if isinstance(body.get("state"), str) else None,
            "submitTime": int(now * 1000), "startTime": 0, "finishTime": 0, "progress": "0%",
            "imageUrl": "", "failReason": "", "properties": {}, "buttons": [],
            "related": ref["_id"] if ref else None,
        }

    async def _refusal(self, reply: dict, auth, channel) -> dict:
        """An upstream refusal, passed on; a task id in it becomes ours or none."""
        out = {"code": reply.get("code"), "description": reply.get("description") or "",
               "result": None,
               "properties": reply.get("properties") if isinstance(reply.get("properties"), dict)
               else {}}
        if reply.get("result") and channel is not None:
            mine = await self.tasks.by_upstream(channel.id, str(reply["result"]), auth.user.id)
            out["result"] = mine["_id"] if mine else None
        return out

    # ---- reading ----------------------------------------------------------------
    async def fetch(self, auth, task_id: str) -> dict:
        doc = await self.tasks.owned(task_id, auth.user.id)
        if doc is None:
            raise not_found()
        return view(doc)

    async def list(self, auth, body: dict) -> list[dict]:
        ids = body.get("ids")
        if ids is None:
            return []
        if not isinstance(ids, list):
            raise bad_request("'ids' must be an array of task ids.", "invalid_value", "ids")
        return [view(d) for d in await self.tasks.owned_many(ids, auth.user.id)]

    async def seed(self, auth, task_id: str, cancel) -> dict:
        """The image seed, asked of the upstream (plus variant); not billed."""
        doc = await self.tasks.owned(task_id, auth.user.id)
        if doc is None:
            raise not_found()
        channel = next((c for c in self.catalog.channels if c.id == doc["channel_id"]), None)
        if channel is None:
            raise RelayError(503, "The channel that ran this task is gone.", "service_unavailable",
                             "channel_gone")
        adaptor = registry.adaptor_for(channel.type)
        req = adaptor.fetch_request(channel, doc["upstream_id"], "image-seed")
        resp = await self.upstream.send(req.method, req.url, req.headers, None, cancel=cancel)
        if resp.error is not None:
            raise resp.error
        if resp.status >= 400:
            raise adaptor.error(resp.status, resp.body)
        try:
            reply = json.loads(resp.body)
        except ValueError:
            raise RelayError(502, "The upstream sent a seed we could not read.", "upstream_error",
                             "bad_upstream") from None
        return reply if isinstance(reply, dict) else {"code": 1, "description": "",
                                                      "result": reply}

    async def image_url(self, task_id: str) -> str:
        """Where the task's image is (for /mj/image/{id}), or 404."""
        doc = await self.tasks.get(task_id) if isinstance(task_id, str) else None
        if doc is None or not doc.get("imageUrl"):
            raise not_found("image")
        return doc["imageUrl"]
