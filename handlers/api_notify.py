"""/api/subscription, /api/announcement and /api/notify: notification settings,
delivery history, announcements and personal-push binding.  Thin: each
handler parses, calls the Notifier (notify/service.py) and writes."""
from __future__ import annotations

from handlers.api_fields import page_args
from handlers.base import ApiError, ApiHandler
from handlers.base import ident as parse_ident
from notify.contact import ContactError
from notify.push_binding import BindError
from notify.service import announcement_view
from notify.subscriptions import Invalid

KINDS = ("announcement", "marketing")


class NotifyHandler(ApiHandler):
    @property
    def notifier(self):
        return self.ctx["notifier"]

    async def own_subscription(self, ident) -> dict:
        user = self.require_user()
        if ident is None:
            raise ApiError(400, "id must be a subscription id (a number).", code="field_not_whole",
                           field="id")
        sub_id = parse_ident(ident)
        doc = await self.notifier.subs.get(sub_id)
        if doc is None or (doc["user_id"] != user["_id"] and not self.is_admin()):
            raise ApiError(404, f"There is no subscription {sub_id}.", code="no_such_subscription",
                           id=sub_id)
        return doc


class ChannelTypesHandler(NotifyHandler):
    async def get(self) -> None:
        self.require_user()
        self.ok(self.notifier.channel_types())


class SubscriptionsHandler(NotifyHandler):
    async def get(self) -> None:
        user = self.require_user()
        self.ok([self.notifier.subs.view(d) for d in await self.notifier.subs.list(user["_id"])])

    async def post(self) -> None:
        user = self.require_user()
        try:
            doc = await self.notifier.subs.create(user, self.body_json())
        except Invalid as exc:
            raise ApiError.of(exc, code="invalid") from None
        self.ok(self.notifier.subs.view(doc), "Subscription created.")

    async def put(self) -> None:
        user = self.require_user()
        body = self.body_json()
        doc = await self.own_subscription(body.get("id"))
        try:
            doc = await self.notifier.subs.update(user, doc, body)
        except Invalid as exc:
            raise ApiError.of(exc, code="invalid") from None
        self.ok(self.notifier.subs.view(doc), "Subscription saved.")


class SubscriptionHandler(NotifyHandler):
    async def get(self, ident: str) -> None:
        self.ok(self.notifier.subs.view(await self.own_subscription(ident)))

    async def delete(self, ident: str) -> None:
        await self.notifier.subs.delete(await self.own_subscription(ident))
        self.ok(None, "Subscription deleted.")


class SubscriptionTestHandler(NotifyHandler):
    async def post(self, ident: str) -> None:
        doc = await self.own_subscription(ident)
        try:
            result = await self.notifier.test_send(self.current_user, doc)
        except ContactError as exc:
            raise ApiError(exc.status, exc.message, retry_after=exc.retry_after,
                           code=exc.code) from None
        self.ok(result, "Test message sent." if result["ok"] else "The test message failed.")


class PreviewHandler(NotifyHandler):
    async def post(self) -> None:
        user = self.require_user()
        body = self.body_json()
        cfg = body.get("channel_config") or {}
        if not isinstance(cfg, dict):
            raise ApiError(400, "channel_config must be an object.", code="field_not_object",
                           field="channel_config")
        try:
            # The form's thresholds and keys, as the saved subscription would have them.
            targets = await self.notifier.subs.clean_targets(user, body)
            # The template renders on the template thread (notify/templates.run).
            result = await self.notifier.preview(
                user, str(body.get("channel_type") or ""), cfg,
                str(body.get("event_type") or "announcement"), targets)
        except (ValueError, Invalid) as exc:
            raise ApiError.of(exc, code="subscription_invalid") from None
        self.ok(result)


class DeliveriesHandler(NotifyHandler):
    async def get(self, ident: str) -> None:
        doc = await self.own_subscription(ident)
        p, size = page_args(self)
        self.ok(await self.notifier.deliveries({"sub_id": doc["_id"]}, p, size))


class AllDeliveriesHandler(NotifyHandler):
    """The caller's whole history, optionally for one channel type or status."""

    async def get(self) -> None:
        user = self.require_user()
        p, size = page_args(self)
        flt: dict = {"user_id": user["_id"]}
        ctype = self.get_argument("channel_type", "")
        if ctype:
            flt["channel_type"] = ctype
        status = self.get_argument("status", "")
        if status:
            if status not in ("pending", "sent", "failed"):
                raise ApiError(400, "status must be pending, sent or failed.", code="field_choice",
                               field="status", choices="pending, sent, failed")
            flt["status"] = {"$in": ["pending", "sending"]} if status == "pending" else status
        self.ok(await self.notifier.deliveries(flt, p, size))


class AnnouncementsHandler(NotifyHandler):
    async def get(self) -> None:
        self.require_user()
        p, size = page_args(self)
        marketing = self.is_admin() or bool(self.current_user.get("marketing_opt_in"))
        self.ok(await self.notifier.announcements(p, size, marketing))

    async def post(self) -> None:
        admin = self.require_admin()
        body = self.body_json()
        title = str(body.get("title") or "").strip()
        content = str(body.get("content") or "").strip()
        kind = body.get("kind") or "announcement"
        if not title:
            raise ApiError(400, "An announcement needs a title.", code="field_required",
                           field="title")
        if len(title) > 200 or len(content) > 20_000:
            raise ApiError(400, "The title (200) or content (20,000 characters) is too long.",
                           code="announcement_too_long", title_max=200, content_max=20_000)
        if kind not in KINDS:
            raise ApiError(400, f"kind must be one of: {', '.join(KINDS)}.", code="field_choice",
                           field="kind", choices=", ".join(KINDS))
        ann = await self.notifier.announce(admin, title, content, kind)
        self.ok(announcement_view(ann), "Published.")


class PushQrcodeHandler(NotifyHandler):
    async def get(self) -> None:
        user = self.require_user()
        try:
            self.ok(await self.notifier.binding.qrcode(user["_id"],
                                                       self.get_argument("vendor", "wxpusher")))
        except BindError as exc:
            raise ApiError.of(exc, code="push_bind") from None


class PushCallbackHandler(NotifyHandler):
    """Called by the push service, not by a signed-in user."""

    async def post(self) -> None:
        body = self.body_json()
        try:
            result = await self.notifier.binding.callback(body, self.get_argument("token", ""))
        except BindError as exc:
            raise ApiError.of(exc, code="push_bind") from None
        self.ok({"uid": result["uid"]}, "Bound.")


class PushBindingHandler(NotifyHandler):
    async def get(self) -> None:
        user = self.require_user()
        vendor = self.get_argument("vendor", "wxpusher")
        self.ok({"vendor": vendor, "uid": await self.notifier.binding.binding(user["_id"], vendor)})

    async def delete(self) -> None:
        user = self.require_user()
        await self.notifier.binding.unbind(user["_id"], self.get_argument("vendor", "wxpusher"))
        self.ok({"uid": None}, "Unbound.")


default_handlers = [
    (r"/api/notify/channels/?", ChannelTypesHandler),
    (r"/api/notify/push/qrcode/?", PushQrcodeHandler),
    (r"/api/notify/push/callback/?", PushCallbackHandler),
    (r"/api/notify/push/binding/?", PushBindingHandler),
    (r"/api/notify/deliveries/?", AllDeliveriesHandler),
    (r"/api/subscription/?", SubscriptionsHandler),
    (r"/api/subscription/preview/?", PreviewHandler),
    (r"/api/subscription/(\d+)/test/?", SubscriptionTestHandler),
    (r"/api/subscription/(\d+)/deliveries/?", DeliveriesHandler),
    (r"/api/subscription/(\d+)/?", SubscriptionHandler),
    (r"/api/announcement/?", AnnouncementsHandler),
]
