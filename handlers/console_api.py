"""JSON endpoints the console needs beyond the management API: public
status, a ping for latency, daily usage for the chart, CSV export, the
models of a group, and the admin's console settings."""
from __future__ import annotations

import logging

from tornado.iostream import StreamClosedError

from console import stats
from console import status as console_status
from handlers.api_log import FIELDS, TOTALS, log_args, log_view
from handlers.base import ApiError, ApiHandler
from handlers.console_ws import own_origins
from models import queries
from models.store import PyMongoError
from relay.serving.buglog import reason

log = logging.getLogger("relay.console")


class StatusHandler(ApiHandler):
    async def get(self) -> None:
        """Public: site name, registration flag, base addresses, purchase rate."""
        data = await console_status.load(self.store, self.config)
        if not data["base_addresses"]:
            data["base_addresses"] = [{"url": own_origins(self)[0], "region": "", "groups": []}]
        self.ok(data)


class PingHandler(ApiHandler):
    """Answers anyone quickly: the console times it against each base address."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Access-Control-Allow-Origin", "*")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        return None

    def get(self) -> None:
        self.ok("pong")


class DailyHandler(ApiHandler):
    """Spend and requests per day and model, from the rollups."""
    own_only = True
    # From the rollups now (at most MAX_DAYS + 1 days' documents a model),
    # still counted as heavy: a chart is the biggest read a user can ask for
    # after an export.
    HEAVY = True

    def api_cost(self) -> int:
        return 1 + self.int_arg("days", 30, 1, stats.MAX_DAYS) // 3

    async def get(self) -> None:
        self.require_user() if self.own_only else self.require_admin()
        fields, _since, _until = log_args(self, self.own_only)
        days = self.int_arg("days", 30, 1, stats.MAX_DAYS)
        tz = self.int_arg("tz_offset", 0, -10 ** 6, 10 ** 6)
        if not -14 * 60 <= tz <= 14 * 60:
            raise ApiError(400, "tz_offset is minutes east of UTC, between -840 and 840.",
                           code="field_range", field="tz_offset", min=-840, max=840)
        self.ok(await stats.daily(self.store.reports, fields, days, tz))


class AllDailyHandler(DailyHandler):
    own_only = False


class ExportHandler(ApiHandler):
    own_only = True
    API_COST = 60  # up to MAX_EXPORT_ROWS records read and written
    HEAVY = True

    async def get(self) -> None:
        """Every matching record as CSV, written as it is read, newest first;
        refused before anything is sent (400, with the number of records)
        when there are more than one export holds."""
        self.require_user() if self.own_only else self.require_admin()
        fields, since, until = log_args(self, self.own_only)
        db = self.store.reports
        try:
            await stats.check_export(db, fields, since, until)
        except stats.ExportTooLarge as exc:
            raise ApiError(400, str(exc), code="export_too_large", records=exc.records,
                           max=stats.MAX_EXPORT_ROWS) from None
        admin = not self.own_only
        columns = ["request_id"] + [f for f in FIELDS if admin or f not in
                                    ("channel_id", "upstream_model")]
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="usage.csv"')
        flt = queries.usage_filter(fields, since, until)
        try:
            async for text in stats.export_csv(db, flt, columns, lambda d: log_view(d, admin),
                                               TOTALS):
                self.write(text)
                await self.flush()
        except StreamClosedError:
            return  # the client went away
        except PyMongoError as exc:
            # Half an export must not look like a whole one: the connection
            # is cut instead of ending the chunked body (no TOTAL row either).
            log.warning("export %s cut off: %s", self.request_id, reason(exc))
            self.request.connection.close()
            return
        self.finish()


class AllExportHandler(ExportHandler):
    own_only = False


class GroupModelsHandler(ApiHandler):
    async def get(self) -> None:
        """Models that channels serve to a group; users may ask about enabled groups."""
        user = self.require_user()
        name = self.str_arg("group", max_len=64) or user.get("group") or "default"
        group = self.ctx["catalog"].groups.get(name)
        if group is None or (not group.enabled and not self.is_admin()):
            raise ApiError(404, f"There is no group named {name!r}.", code="no_group", group=name)
        self.ok(self.ctx["catalog"].models_for_group(name))


class ConsoleOptionsHandler(ApiHandler):
    async def put(self) -> None:
        """Validate and save the console settings together (admin)."""
        self.require_admin()
        body = self.body_json()
        update: dict = {}
        if "site_name" in body:
            name = str(body["site_name"] or "").strip()
            if not name or len(name) > 64:
                raise ApiError(400, "The site name must be 1-64 characters.", code="site_name",
                               max=64)
            update["site_name"] = name
        if "registration_enabled" in body:
            if not isinstance(body["registration_enabled"], bool):
                raise ApiError(400, "registration_enabled must be true or false.",
                               code="field_not_bool", field="registration_enabled")
            update["registration_enabled"] = body["registration_enabled"]
        if "base_addresses" in body:
            try:
                update["base_addresses"] = console_status.clean_addresses(body["base_addresses"])
            except ValueError as exc:
                raise ApiError.of(exc, code="base_addresses") from None
        if "purchase_rate" in body:
            raw = body["purchase_rate"]
            if raw in (None, ""):
                update["purchase_rate"] = None
            else:
                rate = console_status.parse_rate(raw)
                if rate is None:
                    raise ApiError(400, "The purchase rate must be a positive number, e.g. 0.7.",
                                   code="field_positive", field="purchase_rate")
                update["purchase_rate"] = str(rate)
        if not update:
            raise ApiError(400, "Nothing to change.", code="nothing_to_change")
        for key, value in update.items():
            await self.store.db.options.update_one({"_id": key}, {"$set": {"value": value}},
                                                   upsert=True)
        self.ok(await console_status.load(self.store, self.config), "Saved.")


default_handlers = [
    (r"/api/status/?", StatusHandler),
    (r"/api/ping/?", PingHandler),
    (r"/api/log/self/daily/?", DailyHandler),
    (r"/api/log/daily/?", AllDailyHandler),
    (r"/api/log/self/export/?", ExportHandler),
    (r"/api/log/export/?", AllExportHandler),
    (r"/api/user/models/?", GroupModelsHandler),
    (r"/api/console/options/?", ConsoleOptionsHandler),
]
