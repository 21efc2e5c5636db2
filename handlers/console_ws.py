"""The console's websocket: live balance, key quotas, usage records and
announcements pushed to the signed-in user, and the built-in chat.

One socket per open console page, authenticated by the session cookie and
the Origin header.  Every event from the bus is checked against the
connected user before it is sent: a user never receives another user's data.
"""
from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import tornado.websocket
from tornado.ioloop import PeriodicCallback

from console import status as console_status
from console.chat import (ChatCall, ChatError, check_allowed, clean_messages, normalise_base,
                          run_chat, run_image)
from handlers.api_log import log_view
from handlers.base import session_user
from relay.serving import jsonin
from relay.money.billing import USER

log = logging.getLogger("relay.console")

TOPICS = ("balance", "token_balance", "usage", "announcement")
MAX_CHATS = 4  # concurrent chat calls per socket
RECHECK_SECONDS = 60


def own_origins(handler) -> list[str]:
    """This server as the browser reached it, first as seen here.  Behind a
    TLS-terminating proxy the browser says https where we see http, so
    both schemes of our own host count as ours."""
    host = handler.request.host
    first = handler.request.protocol
    return [f"{first}://{host}"] + [f"{p}://{host}" for p in ("http", "https") if p != first]


def self_address(config) -> str:
    """Where this process itself listens, for calls the console makes to "this server"."""
    host = config.host if config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"http://{host}:{config.port}"


class ConsoleSocket(tornado.websocket.WebSocketHandler):
    @property
    def ctx(self) -> dict:
        return self.application.settings

    @property
    def max_message_size(self) -> int:
        # A conversation may carry an image of up to 20 MB as base64.
        return self.ctx["config"].max_body_bytes

    @property
    def ping_interval(self) -> float:
        # Keeps idle sockets alive through proxies and finds dead peers.
        return 25.0

    async def get(self, *args, **kwargs):
        self.user, self.session = await session_user(self)
        if self.user is None:
            self.set_status(401)
            self.finish("Not signed in.")
            return
        self.uid = self.user["_id"]
        status = await console_status.load(self.ctx["store"], self.ctx["config"])
        configured = [a["url"] for a in status["base_addresses"]]
        self.bases = own_origins(self) + configured
        # Our own origin comes from the Host header, which the caller chooses:
        # calls to it go to our own listener, never to whatever host it names.
        self.own = {o.lower() for o in own_origins(self)} - {c.lower().rstrip("/") for c in configured}
        self.origins = {console_status.origin_of(u) for u in self.bases}
        self.unsubscribe: list = []
        self.chats: dict[str, ChatCall] = {}
        await super().get(*args, **kwargs)

    def check_origin(self, origin: str) -> bool:
        """Same host, or one of the configured base addresses (the console
        may be opened through any of them)."""
        origin = origin.lower().rstrip("/")
        host = urlsplit(origin).netloc
        return host == self.request.host.lower() or origin in self.origins

    async def open(self, *args, **kwargs) -> None:
        bus = self.ctx["bus"]
        for topic in TOPICS:
            self.unsubscribe.append(bus.subscribe(topic, self.on_event))
        self.recheck = PeriodicCallback(self.revalidate, RECHECK_SECONDS * 1000)
        self.recheck.start()
        quota, used = await self.ctx["billing"].balance(USER, self.uid)
        self.send({"type": "hello", "user_id": self.uid, "quota": quota, "used_quota": used})

    # ---- pushes -------------------------------------------------------------
    def on_event(self, topic: str, data: dict) -> None:
        """Forward one bus event if, and only if, it is this user's."""
        if topic == "announcement":
            if data.get("kind") == "marketing":
                asyncio.get_running_loop().create_task(self.send_marketing(data))
            else:
                self.send({"type": "announcement", **_announcement(data)})
            return
        if data.get("user_id") != self.uid:
            return
        if topic == "balance":
            self.send({"type": "balance", "quota": data.get("quota"),
                       "used_quota": data.get("used_quota")})
        elif topic == "token_balance":
            self.send({"type": "token_balance", "token_id": data.get("token_id"),
                       "remain_quota": data.get("remain_quota"),
                       "used_quota": data.get("used_quota")})
        elif topic == "usage":
            record = data.get("record") or {}
            if record.get("user_id") != self.uid:
                return
            try:
                view = log_view({"_id": record.get("_id", ""), **record}, admin=False)
            except Exception:
                return
            self.send({"type": "usage", "record": view})

    async def send_marketing(self, data: dict) -> None:
        doc = await self.ctx["store"].db.users.find_one({"_id": self.uid},
                                                       {"marketing_opt_in": 1})
        if doc and doc.get("marketing_opt_in"):
            self.send({"type": "announcement", **_announcement(data)})

    def send(self, msg: dict) -> None:
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        try:
            self.write_message(json.dumps(msg, ensure_ascii=False, default=str))
        except tornado.websocket.WebSocketClosedError:
            pass

    async def revalidate(self) -> None:
        """A session that was signed out, or a user disabled, loses the socket."""
        user, _ = await session_user(self)
        if user is None or user["_id"] != self.uid:
            self.close(4401, "Session ended.")

    # ---- the browser's messages --------------------------------------------
    async def on_message(self, message) -> None:
        try:
            msg = jsonin.parse(message, "The message")
        except jsonin.BadInput as exc:
            return self.send({"type": "error", "message": exc.message})
        if not isinstance(msg, dict):
            return self.send({"type": "error", "message": "Messages are JSON objects."})
        kind = msg.get("type")
        if kind == "ping":
            return self.send({"type": "pong"})
        if kind == "chat_stop":
            call = self.chats.get(str(msg.get("id")))
            if call is not None:
                call.cancel.cancelled = True
            return
        if kind in ("chat", "image"):
            return await self.start_chat(kind, msg)
        self.send({"type": "error", "message": f"Unknown message type {kind!r}."})

    async def start_chat(self, kind: str, msg: dict) -> None:
        cid = str(msg.get("id") or "")[:64]
        try:
            if not cid:
                raise ChatError("Each chat request needs an id.")
            user, _ = await session_user(self)
            if user is None or user["_id"] != self.uid:
                self.close(4401, "Session ended.")
                return
            if user.get("must_change_password"):
                raise ChatError("Choose a new password on the Account page first.", "forbidden")
            if cid in self.chats:
                raise ChatError("A reply with this id is still running.", "busy")
            if len(self.chats) >= MAX_CHATS:
                raise ChatError("Too many replies at once; wait for one to finish.", "busy")
            call = await self.build_call(kind, cid, msg)
        except ChatError as exc:
            return self.send({"type": "chat_error", "id": cid, "code": exc.code,
                              "message": exc.message})
        self.chats[cid] = call
        asyncio.get_running_loop().create_task(self.run_call(call))

    async def build_call(self, kind: str, cid: str, msg: dict) -> ChatCall:
        root, mode = normalise_base(msg.get("base"), kind)
        check_allowed(root, self.bases)
        if root.lower() in self.own:
            root = self_address(self.ctx["config"])
        key = await self.key_for(msg)
        model = str(msg.get("model") or "").strip()
        if not model:
            raise ChatError("Choose a model.", "bad_model")
        call = ChatCall(id=cid, root=root, mode=mode, key=key, model=model, kind=kind)
        if kind == "chat":
            call.messages = clean_messages(msg.get("messages"))
        else:
            call.prompt = str(msg.get("prompt") or "").strip()
            if not call.prompt:
                raise ChatError("Describe the image to generate.")
        return call

    async def key_for(self, msg: dict) -> str:
        """The user's own key by id (looked up server-side), or a key typed in."""
        if msg.get("key_id") not in (None, ""):
            try:
                ident = int(msg["key_id"])
            except (TypeError, ValueError):
                raise ChatError("key_id must be a number.", "bad_key") from None
            doc = await self.ctx["store"].db.tokens.find_one({"_id": ident, "user_id": self.uid})
            if doc is None:
                raise ChatError(f"You have no key with id {ident}.", "bad_key")
            return self.ctx["vault"].decrypt(doc.get("key_enc", ""))
        key = str(msg.get("key") or "").strip()
        if not key.startswith("sk-"):
            raise ChatError("Choose one of your keys, or paste a key starting with sk-.", "bad_key")
        return key

    async def run_call(self, call: ChatCall) -> None:
        try:
            if call.kind == "chat":
                await run_chat(self.ctx["upstream"], call, self.send)
            else:
                await run_image(self.ctx["upstream"], call, self.send)
        except ChatError as exc:
            self.send({"type": "chat_error", "id": call.id, "code": exc.code,
                       "message": exc.message})
        except Exception:
            log.exception("console chat %s failed", call.id)
            self.send({"type": "chat_error", "id": call.id, "code": "internal",
                       "message": "The chat failed on the server."})
        finally:
            self.chats.pop(call.id, None)

    def on_close(self) -> None:
        for unsub in getattr(self, "unsubscribe", []):
            unsub()
        if getattr(self, "recheck", None) is not None:
            self.recheck.stop()
        for call in getattr(self, "chats", {}).values():
            call.cancel.cancelled = True


def _announcement(data: dict) -> dict:
    return {"id": data.get("id"), "title": str(data.get("title") or ""),
            "content": str(data.get("content") or ""), "kind": data.get("kind") or "announcement"}


default_handlers = [
    (r"/console/ws", ConsoleSocket),
]
