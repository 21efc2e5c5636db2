"""An OpenAPI 3.1 description of /api, served at /api/openapi.json.

Kept true by tests/handlers/test_openapi.py: every /api route the application
registers is described here with exactly the methods its handler answers,
and every path described here is routed.  tests/handlers/test_fuzz_api.py runs
schemathesis over every operation.
"""
from __future__ import annotations

from console import strings
from handlers.base import ApiHandler
from models.records import LIMIT_FIELDS, PRICE_COMPONENTS, TIER_COMPONENTS

INT64 = {"type": "integer", "minimum": -(2 ** 63), "maximum": 2 ** 63 - 1}
ID = {"type": "integer", "minimum": 1, "maximum": 2 ** 63 - 1}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NUM = {"type": "number"}
NAMES = {"oneOf": [{"type": "array", "items": STR}, STR]}
# The console's languages (one file each in ui/static/i18n); any case is taken.
LANGUAGE = {"type": "string", "enum": strings.available()}
DECIMAL = {"oneOf": [NUM, STR]}
# Rate limits on a key or an account (relay/money/limits.py): 0 or null = none.
LIMITS = {f: {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 10 ** 12},
                        {"type": "null"}]} for f in LIMIT_FIELDS}

# Budgets by period (relay/money/budgets.py): quota units per calendar day,
# week or month, 0 = none; the account's time zone is their calendar.  A
# call over one is refused with 429 `budget_exceeded` and Retry-After.
BUDGETS = {"budgets": {"oneOf": [{"type": "object", "additionalProperties": False,
                                  "properties": {p: {"type": "integer", "minimum": 0,
                                                     "maximum": 10 ** 15}
                                                 for p in ("day", "week", "month")}},
                                 {"type": "null"}]}}
TIMEZONE = {"timezone": {"type": "string", "maxLength": 64,
                         "description": "An IANA time zone name (UTC, Asia/Shanghai)."}}
# A group's rate rules (relay/money/rates.py): tiers by input tokens and by
# the account's spend this calendar month (credits), each multiplying the rate.
RATE_TIERS = {"type": "array", "maxItems": 8, "items": {
    "type": "object", "additionalProperties": False, "required": ["from", "factor"],
    "properties": {"from": DECIMAL, "factor": DECIMAL}}}


def obj(required: tuple = (), **props) -> dict:
    out = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


def envelope(data: dict | None = None) -> dict:
    return {"description": "The envelope: success, message, data.",
            "content": {"application/json": {"schema": obj(
                ("success", "message", "data"), success=BOOL, message=STR,
                data=data or {})}}}


FAIL = {"description": "Refused: success is false and message says why (in English).",
        "content": {"application/json": {"schema": obj(
            ("success", "message"), success={"const": False}, message=STR, data={
                "description": "The refusal's stable name, `code`, and its variable parts "
                               "by name, e.g. {\"code\": \"field_too_long\", \"field\": "
                               "\"name\", \"max\": 64}; a 429 adds retry_after."})}}}


def op(summary: str, body: dict | None = None, query: dict | None = None,
       path: dict | None = None, public: bool = False, data: dict | None = None,
       content: str = "application/json") -> dict:
    out: dict = {"summary": summary,
                 "responses": {"200": envelope(data) if content == "application/json" else
                               {"description": summary, "content": {content: {}}},
                               "4XX": FAIL}}
    params = [{"name": k, "in": "path", "required": True, "schema": v}
              for k, v in (path or {}).items()]
    params += [{"name": k, "in": "query", "required": False, "schema": v}
               for k, v in (query or {}).items()]
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": False,
                              "content": {"application/json": {"schema": body}}}
    if public:
        out["security"] = []
    return out


PAGE = {"p": INT64, "size": INT64}
LOG_FILTER = {"user_id": INT64, "token_id": INT64, "channel_id": INT64, "status": INT64,
              "model": STR, "start": NUM, "end": NUM}
# The log is paged by time: `older`/`newer` are cursors a page's answer gives
# (handlers/api_log.py); `p` reaches the first 10,000 records only.
LOG_PAGE = {**LOG_FILTER, **PAGE, "older": STR, "newer": STR}
USER_FIELDS = dict(username=STR, password=STR, email=STR, group=STR, display_name=STR,
                   language=LANGUAGE,
                   role=INT64, status=INT64, quota=INT64, usable_groups={
                       "oneOf": [{"type": "array", "items": STR}, {"type": "null"}]}, **LIMITS)
TOKEN_FIELDS = dict(name=STR, remain_quota=INT64, unlimited_quota=BOOL, expired_time=INT64,
                    group=STR, allow_ips=NAMES, model_limits_enabled=BOOL, model_limits=NAMES,
                    billing_mode={"enum": ["per_token", "per_call"]}, status=INT64, **LIMITS,
                    **BUDGETS)
GROUP_FIELDS = dict(name=STR, rate=DECIMAL, description=STR, enabled=BOOL, usable_groups=NAMES,
                    input_tiers=RATE_TIERS, spend_tiers=RATE_TIERS)
# Every price component (models/records.PRICE_COMPONENTS) and prompt-size tiers.
PRICE_FIELDS = dict(model=STR, group=STR, **{f: DECIMAL for f in PRICE_COMPONENTS},
                    tiers={"type": "array", "items": obj(
                        ("above",), above={"type": "integer", "minimum": 0},
                        **{f: DECIMAL for f in TIER_COMPONENTS})})
CHANNEL_FIELDS = dict(name=STR, type=STR, base_url=STR, key=STR, models=NAMES, groups=NAMES,
                      priority=INT64, weight=INT64, model_mapping={"type": "object"},
                      enabled=BOOL, options={"type": "object"})
SUB_FIELDS = dict(name=STR, event_types={"type": "array", "items": STR}, channel_type=STR,
                  channel_config={"type": "object"}, user_threshold=INT64,
                  key_threshold=INT64, key_ids={"type": "array", "items": INT64},
                  enabled=BOOL)

PATHS: dict[str, dict] = {
    "/api/user/login": {"post": op("Sign in; sets the session cookie, returns csrf_token.",
                                   obj(("username", "password"), username=STR, password=STR),
                                   public=True)},
    "/api/user/logout": {"post": op("Sign out (this session, or everywhere).",
                                    obj(everywhere=BOOL), public=True)},
    "/api/user/sessions": {"get": op("The caller's signed-in sessions.")},
    "/api/user/sessions/{sid}": {"delete": op("End one of the caller's sessions.",
                                              path={"sid": {"type": "string",
                                                            "pattern": "^[A-Za-z0-9]+$"}})},
    "/api/user/register": {"post": op("Create an account (when registration is open).",
                                      obj(("username", "password"), username=STR,
                                          password=STR, email=STR, language=LANGUAGE),
                                      public=True)},
    "/api/user/self": {"get": op("The caller's account."),
                       "put": op("Change the caller's name, opt-in, language (of the console "
                                 "and of notifications), budgets by period, time zone or "
                                 "password; a new e-mail address waits for the code mailed to it.",
                                 obj(display_name=STR, email=STR, marketing_opt_in=BOOL,
                                     language=LANGUAGE, password=STR, original_password=STR,
                                     **BUDGETS, **TIMEZONE))},
    "/api/user/self/email": {"post": op("Confirm the pending e-mail address with its code.",
                                        obj(("code",), code=STR))},
    "/api/user/token": {"post": op("A new access token for Authorization: Bearer.")},
    "/api/user/topup": {"post": op("Redeem a code.", obj(("key",), key=STR))},
    "/api/user/manage": {"post": op("Enable, disable, promote or demote a user (admin).",
                                    obj(("id", "action"), id=INT64, action={
                                        "enum": ["enable", "disable", "promote", "demote"]}))},
    "/api/user/": {"get": op("Users (admin).", query={"keyword": STR, **PAGE}),
                   "post": op("Create a user (admin).", obj(**USER_FIELDS)),
                   "put": op("Change a user (admin).", obj(("id",), id=INT64, **USER_FIELDS,
                                                           **BUDGETS, **TIMEZONE))},
    "/api/user/{id}/quota": {"post": op("Add or remove balance with a reason (admin).",
                                        obj(("amount", "reason"), amount=INT64, reason=STR),
                                        path={"id": ID})},
    "/api/user/{id}/password": {"post": op(
        "A temporary password for a user, shown once; they must replace it at the next "
        "sign-in, and their sessions and access token end (admin).", path={"id": ID})},
    "/api/user/{id}": {"get": op("One user (admin).", path={"id": ID}),
                       "delete": op("Disable a user (admin).", path={"id": ID})},
    "/api/user/models": {"get": op("Models served to a group.", query={"group": STR})},
    "/api/token/search": {"get": op("Search the caller's keys.",
                                    query={"keyword": STR, "all": BOOL, **PAGE})},
    "/api/token/": {"get": op("The caller's keys (admins: all=true for everyone's).",
                              query={"all": BOOL, **PAGE}),
                    "post": op("Create a key.", obj(**TOKEN_FIELDS)),
                    "put": op("Change a key.", obj(("id",), id=INT64, **TOKEN_FIELDS),
                              query={"status_only": BOOL})},
    "/api/token/{id}": {"get": op("One key.", path={"id": ID}),
                        "delete": op("Delete a key.", path={"id": ID})},
    "/api/group/": {"get": op("Groups the caller may use (admins: all)."),
                    "post": op("Create a group (admin).", obj(("name",), **GROUP_FIELDS)),
                    "put": op("Change a group (admin).", obj(("name",), **GROUP_FIELDS))},
    "/api/group/{name}": {"delete": op("Delete a group no key uses (admin).",
                                       path={"name": STR})},
    "/api/price/": {"get": op("Model prices."),
                    "post": op("Set a model's price (admin).", obj(("model",), **PRICE_FIELDS)),
                    "put": op("Set a model's price (admin).", obj(("model",), **PRICE_FIELDS)),
                    "delete": op("Delete a price (admin).", query={"model": STR, "group": STR})},
    "/api/price/catalogue": {"get": op("Which catalogue prices models without an override "
                                       "(genai-prices), and its version.")},
    "/api/price/{model}": {"delete": op("Delete a model's price (admin).",
                                        path={"model": STR}, query={"group": STR})},
    "/api/channel/": {"get": op("Channels (admin).", query=PAGE),
                      "post": op("Create a channel (admin).", obj(**CHANNEL_FIELDS)),
                      "put": op("Change a channel (admin).", obj(("id",), id=INT64,
                                                                  **CHANNEL_FIELDS))},
    "/api/channel/{id}/test": {"post": op("Send a one-token call through a channel (admin).",
                                          obj(model=STR), path={"id": ID})},
    "/api/channel/{id}/learned": {
        "get": op("What the channel was seen to refuse: its API, betas, fields (admin).",
                  path={"id": ID}),
        "delete": op("Forget it all, or one fact by ?id= (admin).", path={"id": ID},
                     query={"id": STR})},
    "/api/channel/{id}": {"get": op("One channel (admin).", path={"id": ID}),
                          "delete": op("Delete a channel (admin).", path={"id": ID})},
    "/api/redemption/": {"get": op("Redemption codes, masked (admin).", query=PAGE),
                         "post": op("Create codes, shown once (admin).",
                                    obj(("quota",), name=STR, quota=INT64, count=INT64))},
    "/api/redemption/{id}": {"delete": op("Delete an unused code (admin).", path={"id": ID})},
    "/api/option/": {"get": op("Server options (admin)."),
                     "put": op("Set an option (admin).", obj(("key",), key=STR, value={}))},
    "/api/log/self": {"get": op("The caller's usage records, newest first, a page at a time "
                                "(older/newer cursors), and totals from the hourly rollups.",
                                query=LOG_PAGE)},
    "/api/log/": {"get": op("All usage records and totals (admin); as /api/log/self.",
                            query=LOG_PAGE)},
    "/api/log/self/cache": {"get": op("Prompt-cache health of the caller's keys.",
                                      query={**LOG_FILTER, "by": {"enum": ["key"]}})},
    "/api/log/cache": {"get": op("Prompt-cache health per key or channel (admin).",
                                 query={**LOG_FILTER, "by": {"enum": ["key", "channel"]}})},
    "/api/log/self/daily": {"get": op("The caller's spend per day and model.",
                                      query={**LOG_FILTER, "days": INT64, "tz_offset": INT64})},
    "/api/log/daily": {"get": op("Spend per day and model (admin).",
                                 query={**LOG_FILTER, "days": INT64, "tz_offset": INT64})},
    "/api/log/self/export": {"get": op("The caller's usage records as CSV, streamed, with a "
                                       "TOTAL row; more than 1,000,000 records are refused "
                                       "(400) before anything is sent.", query=LOG_FILTER,
                                       content="text/csv")},
    "/api/log/export": {"get": op("Usage records as CSV (admin); as /api/log/self/export.",
                                  query=LOG_FILTER, content="text/csv")},
    "/api/notify/channels": {"get": op("Notification channel types and their fields.")},
    "/api/notify/push/qrcode": {"get": op("A QR code to bind personal push.",
                                          query={"vendor": STR})},
    "/api/notify/push/callback": {"post": op("Called by the push service on a scan.",
                                             {"type": "object"}, query={"token": STR},
                                             public=True)},
    "/api/notify/push/binding": {"get": op("The caller's push binding.", query={"vendor": STR}),
                                 "delete": op("Unbind personal push.", query={"vendor": STR})},
    "/api/notify/deliveries": {"get": op("The caller's notification history.",
                                         query={"channel_type": STR, "status": STR, **PAGE})},
    "/api/subscription/": {"get": op("The caller's notification subscriptions."),
                           "post": op("Create a subscription.", obj(**SUB_FIELDS)),
                           "put": op("Change a subscription.", obj(("id",), id=INT64,
                                                                  **SUB_FIELDS))},
    "/api/subscription/preview": {"post": op("Render what a channel would send.",
                                             obj(channel_type=STR,
                                                 channel_config={"type": "object"},
                                                 event_type=STR))},
    "/api/subscription/{id}/test": {"post": op("Send a test message now.", path={"id": ID})},
    "/api/subscription/{id}/deliveries": {"get": op("A subscription's history.",
                                                    path={"id": ID}, query=PAGE)},
    "/api/subscription/{id}": {"get": op("One subscription.", path={"id": ID}),
                               "delete": op("Delete a subscription.", path={"id": ID})},
    "/api/announcement/": {"get": op("Announcements.", query=PAGE),
                           "post": op("Publish an announcement (admin).",
                                      obj(("title",), title=STR, content=STR,
                                          kind={"enum": ["announcement", "marketing"]}))},
    "/api/status": {"get": op("Public server status.", public=True)},
    "/api/ping": {"get": op("Answers quickly (latency checks).", public=True)},
    "/api/console/options": {"put": op("Console settings (admin).",
                                       obj(site_name=STR, registration_enabled=BOOL,
                                           base_addresses={"type": "array"},
                                           purchase_rate=DECIMAL))},
    "/api/openapi.json": {"get": op("This description.", public=True)},
}


def spec(server_url: str = "") -> dict:
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "relay management API", "version": "1",
                 "description": "new-api conventions: every reply is {success, message, data}. "
                                "Sign in for a session cookie (writes need the X-CSRF-Token "
                                "header) or use an access token (POST /api/user/token) as "
                                "Authorization: Bearer."},
        "components": {"securitySchemes": {
            "accessToken": {"type": "http", "scheme": "bearer"},
            "session": {"type": "apiKey", "in": "cookie", "name": "session"}}},
        "security": [{"accessToken": []}, {"session": []}],
        "paths": PATHS,
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc


class OpenApiHandler(ApiHandler):
    async def prepare(self) -> None:
        return None  # public, and no body

    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(spec(f"{self.request.protocol}://{self.request.host}"))


default_handlers = [(r"/api/openapi\.json", OpenApiHandler)]
