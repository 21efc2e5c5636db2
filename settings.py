"""One frozen Settings object.

Precedence, lowest to highest: the defaults below < a TOML config file <
RELAY_* environment variables < command-line flags.  Every field can be set
in all four places: `max_body_mb` is `max_body_mb = 40` in the file,
`RELAY_MAX_BODY_MB=40` in the environment and `--max-body-mb 40` on the
command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Settings:
    # Each field's help in `python server.py --help` is the comment block
    # right above it (describe() reads them): every field needs one.

    # TCP port the relay listens on.
    port: int = 3000
    # Address to listen on (0.0.0.0: every interface; 127.0.0.1: this machine only).
    host: str = "0.0.0.0"
    # Folder for the embedded database, the generated secret and the pid files.
    data_dir: str = "./data"
    # MongoDB URL (mongodb://...); empty starts the embedded MongoDB-compatible server under data_dir.
    mongo_url: str = ""
    # Database name inside the MongoDB server.
    db_name: str = "relay"
    # TOML file with settings (keys as below); the environment and flags override it.
    config: str = ""
    # Server secret for key encryption, key lookup hashes and cookies; empty: one is generated
    # once into data_dir/secret.key (relays sharing a database need the same value).
    secret: str = ""
    # Password for the administrator root, used only when the first start creates root (a
    # different value later is ignored with a warning: use --reset-admin-password).
    admin_password: str = ""
    # Log level: debug, info, warning or error (debug also logs every request).
    log_level: str = "info"
    # Largest request body in MB (32 fits a 20 MB image sent as base64 inside JSON).
    max_body_mb: int = 32
    # Seconds to wait for a TCP connection to an upstream (524 after that).
    connect_timeout: float = 10.0
    # Seconds to wait for the upstream's first byte (504 after that).
    first_byte_timeout: float = 120.0
    # Seconds a stream may stay silent before we give up on it.
    stream_idle_timeout: float = 120.0
    # Concurrent upstream calls per kind of work, each kind with its own
    # limit so that none queues behind another: plain calls, streams, uploads.
    max_upstream_clients: int = 2000
    # Concurrent streaming upstream calls (an open stream costs ~30 KB).
    max_upstream_streams: int = 20000
    # Concurrent uploads passed on as they arrive (audio transcription).
    max_upstream_uploads: int = 200
    # Seconds a call waits for its kind's limit before a 503 with Retry-After.
    upstream_queue_wait: float = 10.0
    # Most streams the relay puts on one HTTP/2 connection to an upstream.
    # libcurl runs every transfer of a connection whenever that connection
    # has data, so a chunk's CPU grows with this, while each connection costs
    # ~100 KB (bench/streams.py at 10,000 streams: 100 a connection, libcurl's
    # default, 38-42 s of CPU and 482 MiB; 50: 32.5 s, 494 MiB; 34: 29 s,
    # 500 MiB; 20: 27-31 s, 512 MiB).  Below 1: libcurl's 100.
    upstream_h2_streams: int = 50
    # Most new connections still connecting to one upstream address at once; the rest wait
    # their turn within connect_timeout (a connection reused from the pool never waits).
    # The window starts at 4, grows with each connection opened and halves when a connect
    # times out, so that a burst of streams to an HTTP/1.1 upstream (a socket each) does
    # not overflow its accept backlog.
    upstream_connect_window: int = 64
    # A PEM file of extra CA certificates to trust for HTTPS upstreams.
    upstream_ca_file: str = ""
    # Further channels tried after a failed upstream call (0: no retry).
    retries: int = 2
    # Output tokens reserved for a chat call that names no max_tokens, for a model whose
    # output limit is unknown (relay/money/price_catalogue.py knows the vendors').
    default_max_tokens: int = 4096
    # A stream of a model that reasons unseen (o-series, gpt-5, Gemini 2.5+, Claude with
    # thinking) whose client leaves is read on for its usage, at most this many seconds;
    # the vendor bills what it writes meanwhile, and so does the relay.
    stream_drain_seconds: float = 60.0
    # MB of such a stream read on for its usage at most (see stream_drain_seconds).
    stream_drain_mb: int = 4
    # Serve the Responses API over a WebSocket (GET /v1/responses upgraded, as Codex CLI asks
    # for it); off, the upgrade gets 426 and clients fall back to HTTP at once.
    responses_websocket: bool = True
    # Most Responses WebSockets open at once in one relay process (426 past it).
    responses_websocket_max: int = 5000
    # Seconds a conversation stays with the channel that served it while idle (sticky sessions:
    # prompt caches are per upstream account); 0 spreads every call by weight.
    sticky_session_ttl: float = 3600
    # Days a channel's refusal of a beta, body field or parameter is remembered (it is taken
    # out of later calls to that channel and model up front; the console lists and forgets it).
    compat_memory_days: float = 7
    # Hours after which a channel learnt to speak only chat completions (or only the
    # Responses API) is tried with the client's own API again.
    wire_reprobe_hours: float = 24
    # Seconds within which a charge and its usage record are durable (in the database or the
    # spill file): the loss window on kill -9 (README, "Money").
    usage_flush_interval: float = 0.5
    # Seconds without a heartbeat after which a relay is taken for dead and its quota leases
    # and concurrency slots go back (relays sharing a database must agree on it).
    lease_stale_after: float = 60.0
    # MB bound of <data_dir>/spill.jsonl, where usage waits for the database (then 503).
    spill_max_mb: int = 256
    # Seconds that running calls may take to finish after SIGTERM.
    shutdown_grace: float = 30.0
    # The most quota units a relay leases of one account or key at once ($4).  A lease is also
    # at most a quarter of what is left, split by the relays holding one (relay/money/leases.py):
    # with a large balance a relay then serves thousands of calls from memory per database
    # write, and a small one is never held by one relay while another needs it.
    lease_chunk: int = 2_000_000
    # Below this many units left ($2), while more than one relay runs on the database, a relay
    # holds nothing of a balance ahead of its calls: each call reserves from the database and
    # gives back what it did not use (one conditional update each), so every relay can spend
    # the last unit.  0: always lease.
    lease_direct_below: int = 1_000_000
    # Seconds without a call after which a relay gives a balance's lease back.  A relay short
    # of a balance recalls others' leases at once, so this only tidies; shorter costs a
    # database write each time a balance idles, longer keeps money out of people's view of
    # `quota` for nothing.
    lease_idle_release: float = 10.0
    # Seconds a call waits for other relays to give back a balance it is short of (they answer
    # within a flush tick), or for a change of the balance by an administrator, before it is
    # refused; and the longest a change waits for the relays' answers.
    lease_recall_wait: float = 1.0
    # Seconds a process trusts its cached keys, users, groups, prices and channels.
    cache_ttl: float = 300.0
    # Seconds between checks for changes made by other relay processes (one read of one small
    # document when there are none): a disabled key is refused everywhere within about this
    # plus a database round trip.
    invalidation_poll: float = 0.25
    # Days usage records are kept (0: forever); older ones are pruned a bounded batch at a time
    # and the space goes back to the file system (README, "Storage").
    usage_retention_days: int = 180
    # Days the daily rollups behind charts and totals are kept (0: forever); keep them longer
    # than the records, they are a small part of the size.
    rollup_retention_days: int = 730
    # GB the database may take on disk (0: no ceiling): the administrator is warned at 80%, and
    # at the ceiling the oldest usage records are pruned before their retention days.
    storage_max_gb: float = 0.0
    # Seconds one console report (a usage page, a chart, a chunk of an export) may take before
    # it is given up; reports read through their own connection and never hold up billing.
    report_timeout: float = 30.0
    # Days a response made with `store` (the default) is kept for
    # previous_response_id and GET /v1/responses/{id}, as OpenAI keeps them;
    # 0 keeps them until their key or owner is deleted.
    responses_retention_days: float = 30
    # Mark session cookies Secure on every request; without it they are Secure
    # when the request came over HTTPS (directly or via a trusted proxy).
    secure_cookies: bool = False
    # Reverse proxies and CDNs whose X-Real-IP, X-Forwarded-For and X-Forwarded-Proto are
    # believed (CIDRs, comma-separated; the default is this host, as uvicorn's; "none": nobody).
    trusted_proxies: str = "127.0.0.0/8, ::1"
    # Units of /api work a signed-in user (not an administrator) may use a minute, and at
    # once: a call is 1, a page of the usage log 2, a statistics chart 1 per 3 days, a CSV
    # export 60 (over it: 429 with Retry-After); 0: no limit.  Counted per relay process.
    api_rate_limit: int = 600
    # Most API keys one account may have (a new one past it is refused with 409).
    max_keys_per_user: int = 1000
    # Let notifications reach private and loopback addresses (off: refused, an SSRF guard).
    allow_private_webhooks: bool = False
    # SMTP server for the e-mail channel (empty: e-mail notifications are off).
    smtp_host: str = ""
    # SMTP server port (587 for starttls, 465 for tls).
    smtp_port: int = 587
    # SMTP user name (empty: no login).
    smtp_user: str = ""
    # SMTP password for smtp_user.
    smtp_password: str = ""
    # Sender address of notification e-mails.
    smtp_from: str = ""
    # SMTP encryption: starttls, tls or none.
    smtp_tls: str = "starttls"
    # Check the SMTP server's certificate.
    smtp_verify_cert: bool = True
    # WeCom API base URL (for a self-hosted proxy or tests).
    notify_wecom_base: str = "https://qyapi.weixin.qq.com"
    # Telegram Bot API base URL (for a self-hosted Bot API server or tests).
    notify_telegram_base: str = "https://api.telegram.org"
    # ServerChan API base URL.
    notify_serverchan_base: str = "https://sctapi.ftqq.com"
    # WxPusher API base URL.
    notify_wxpusher_base: str = "https://wxpusher.zjiecode.com"
    # The operator's WxPusher app token (users bind their UID to it by a QR code).
    notify_wxpusher_app_token: str = ""
    # When set, the push service must call /api/notify/push/callback?token=<this>.
    notify_push_callback_token: str = ""
    # Seconds between polls of the notification outbox.
    notify_poll_interval: float = 1.0
    # Notifications sent at once.
    notify_concurrency: int = 8
    # Seconds one notification send may take.
    notify_send_timeout: float = 20.0
    # Seconds a process holds a claimed notification (longer than any send).
    notify_claim_lease: float = 120.0
    # Seconds before the first retry of a failed notification (doubling up to an hour).
    notify_retry_base: float = 30.0
    # Seconds to keep retrying a notification before it fails for good.
    notify_retry_window: float = 86400.0
    # Seconds a process trusts its cached subscriptions (other processes' writes show after this).
    notify_cache_ttl: float = 10.0
    # Days sent and failed notifications are kept for the history view.
    notify_history_days: int = 30
    # Base addresses shown in the console: a JSON list of {"url", "region", "groups"}.
    base_addresses: str = "[]"
    # Let people create accounts on the sign-in page (the console setting overrides it).
    registration_enabled: bool = True
    # Seconds between polls of the upstreams for Midjourney task progress.
    mj_poll_interval: float = 5.0
    # Seconds a Midjourney task may stay unfinished before it fails and is refunded.
    mj_task_timeout: float = 3600.0
    # Serve /mj/image/{id} to anyone who has the link (off: only to a key or console session
    # of the account that made the task).
    mj_public_images: bool = False

    @property
    def max_body_bytes(self) -> int:
        return self.max_body_mb * 1024 * 1024

    def base_address_list(self) -> list[dict]:
        try:
            value = json.loads(self.base_addresses or "[]")
        except ValueError:
            return []
        return value if isinstance(value, list) else []


def _coerce(kind: Any, raw: Any) -> Any:
    if kind is bool or kind == "bool":
        if isinstance(raw, bool):
            return raw
        return str(raw).strip().lower() in ("1", "true", "yes", "on")
    if kind is int or kind == "int":
        return int(raw)
    if kind is float or kind == "float":
        return float(raw)
    if isinstance(raw, (list, dict)):
        return json.dumps(raw)
    return str(raw)


_METAVARS = {"int": "N", "float": "NUMBER", "bool": "true|false", "str": "TEXT"}
_FIELD_LINE = re.compile(r"^    (\w+): [^=]+=")


def describe() -> dict[str, str]:
    """Each field's one-line help: the comment block right above it in the
    Settings class, joined.  A field without one maps to ""."""
    out: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(Settings).splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and line.startswith("    #"):
            block.append(stripped.lstrip("#").strip())
            continue
        m = _FIELD_LINE.match(line)
        if m:
            out[m.group(1)] = " ".join(block)
        block = []
    return out


def _parser(actions: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        usage="python server.py [--SETTING VALUE ...]" + "".join(
            f" [--{a.replace('_', '-')}]" for a in actions),
        description="AI API relay.  Every setting is also RELAY_<NAME> in the environment and "
                    "a key in the --config TOML file (flags > environment > file > defaults).")
    helps = describe()
    for f in dataclasses.fields(Settings):
        text = f"{helps.get(f.name, '')} (default: {f.default!r})".replace("%", "%%")
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                            metavar=_METAVARS.get(f.type, "TEXT"), help=text)
    for name, text in actions.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, action="store_true",
                            default=False, help=text.replace("%", "%%"))
    return parser


def load(argv: Sequence[str] | None = None,
         environ: Mapping[str, str] | None = None) -> Settings:
    return parse(argv, environ)[0]


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None,
          actions: Mapping[str, str] | None = None) -> tuple[Settings, dict[str, bool]]:
    """The settings, and which of `actions` (flag name -> help; commands
    such as reset_admin_password, not settings) were given."""
    environ = os.environ if environ is None else environ
    actions = actions or {}
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    args = vars(_parser(actions).parse_args(list(argv or [])))
    chosen = {name: bool(args.pop(name)) for name in actions}

    values: dict[str, Any] = {}
    config_path = args.get("config") or environ.get("RELAY_CONFIG", "")
    if config_path:
        with open(config_path, "rb") as fh:
            values.update(tomllib.load(fh))
        values["config"] = config_path
    for name in fields:
        env = environ.get("RELAY_" + name.upper())
        if env is not None and env != "":
            values[name] = env
    for name, value in args.items():
        if value is not None:
            values[name] = value

    unknown = set(values) - set(fields)
    if unknown:
        raise SystemExit(f"unknown settings: {', '.join(sorted(unknown))}")
    typed = {k: _coerce(fields[k].type, v) for k, v in values.items()}
    return Settings(**typed), chosen
