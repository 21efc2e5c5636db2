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
import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Settings:
    port: int = 3000
    host: str = "0.0.0.0"
    data_dir: str = "./data"
    # Empty means: start the embedded MongoDB-compatible server under data_dir.
    mongo_url: str = ""
    db_name: str = "relay"
    config: str = ""
    # Server secret for key encryption, key lookup hashes and cookies.  When
    # empty, one is generated once and kept in data_dir/secret.key; several
    # relay processes sharing one database must be given the same value.
    secret: str = ""
    admin_password: str = ""
    log_level: str = "info"
    # Large enough for a 20 MB image sent as base64 inside JSON.
    max_body_mb: int = 32
    connect_timeout: float = 10.0
    # Seconds to wait for the upstream's first byte (504 after that).
    first_byte_timeout: float = 120.0
    # Seconds a stream may stay silent before we give up on it.
    stream_idle_timeout: float = 120.0
    max_upstream_clients: int = 512
    retries: int = 2
    # Cost reserved for a chat call that names no max_tokens.
    default_max_tokens: int = 4096
    # Seconds within which a charged call's usage record (and so its charge)
    # is durable: in the database, or in the spill file when the database
    # is slow or away.  The loss window on kill -9 (README, "Money"); the
    # flusher writes four times per interval.
    usage_flush_interval: float = 0.5
    # Seconds without a heartbeat after which a relay is taken for dead and
    # its quota leases go back (other relays sharing the database do it).
    lease_stale_after: float = 60.0
    # Bound of <data_dir>/spill.jsonl, where usage waits when the database
    # cannot take it; at the bound billable calls are refused (503).
    spill_max_mb: int = 256
    shutdown_grace: float = 30.0
    # Quota units a process leases from an account or key at once; see
    # relay/billing.py for why leases exist.
    lease_chunk: int = 2_000_000
    cache_ttl: float = 300.0
    # Cross-process cache invalidation poll interval (seconds).
    invalidation_poll: float = 0.5
    usage_retention_days: int = 0
    secure_cookies: bool = False
    # Notifications reach webhooks, bots and push services by their users'
    # URLs; private and loopback addresses are refused unless this is on.
    allow_private_webhooks: bool = False
    # Server-wide SMTP for the e-mail channel; smtp_tls: starttls, tls or none.
    smtp_host: str = ""
    smtp_port: int = 587
    smtp_user: str = ""
    smtp_password: str = ""
    smtp_from: str = ""
    smtp_tls: str = "starttls"
    smtp_verify_cert: bool = True
    # Vendor base URLs, so that self-hosted bot APIs, proxies and tests work.
    notify_wecom_base: str = "https://qyapi.weixin.qq.com"
    notify_telegram_base: str = "https://api.telegram.org"
    notify_serverchan_base: str = "https://sctapi.ftqq.com"
    notify_wxpusher_base: str = "https://wxpusher.zjiecode.com"
    # The operator's WxPusher app (users bind their UID to it by a QR code).
    notify_wxpusher_app_token: str = ""
    # When set, the push service must call /api/notify/push/callback?token=<this>.
    notify_push_callback_token: str = ""
    # Outbox worker: poll interval, parallel sends, per-send timeout, how
    # long a claim lasts (longer than any send), first retry delay (doubling
    # up to an hour) and how long to keep retrying before a final failure.
    notify_poll_interval: float = 1.0
    notify_concurrency: int = 8
    notify_send_timeout: float = 20.0
    notify_claim_lease: float = 120.0
    notify_retry_base: float = 30.0
    notify_retry_window: float = 86400.0
    # Seconds a process trusts its cached subscriptions (writes elsewhere
    # in this process invalidate at once; other processes catch up by this).
    notify_cache_ttl: float = 10.0
    # Sent and failed outbox records are kept this long for the history view.
    notify_history_days: int = 30
    # JSON list of {"url": ..., "region": ..., "groups": [...]}.
    base_addresses: str = "[]"
    registration_enabled: bool = True
    # Midjourney tasks: seconds between polls of the upstreams for progress,
    # and how long a task may stay unfinished before it fails (and is refunded).
    mj_poll_interval: float = 5.0
    mj_task_timeout: float = 3600.0

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


def load(argv: Sequence[str] | None = None,
         environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    fields = {f.name: f for f in dataclasses.fields(Settings)}

    parser = argparse.ArgumentParser(description="AI API relay")
    for name, f in fields.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                            help=f"(default: {f.default!r})")
    args = vars(parser.parse_args(list(argv or [])))

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
    return Settings(**typed)
