"""What the console shows everyone: site name, registration, base addresses
and the purchase rate.  Admin-set options (the `options` collection) win
over the process settings."""
from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from urllib.parse import urlsplit

DEFAULT_SITE_NAME = "Relay"


def _parse_addresses(value) -> list[dict]:
    if isinstance(value, str):
        try:
            value = json.loads(value or "[]")
        except ValueError:
            return []
    out = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, dict):
            continue
        url = str(item.get("url") or "").strip().rstrip("/")
        if not valid_base(url):
            continue
        out.append({"url": url, "region": str(item.get("region") or ""),
                    "groups": [str(g) for g in item.get("groups") or []]})
    return out


def valid_base(url: str) -> bool:
    """An http(s) origin, optionally with a path; no credentials, query or fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname)
            and not parts.username and not parts.password and not parts.query
            and not parts.fragment)


def clean_addresses(value) -> list[dict]:
    """Validate an admin's base address list; raises ValueError naming the bad entry."""
    if isinstance(value, str):
        try:
            value = json.loads(value or "[]")
        except ValueError:
            raise ValueError("base_addresses must be a JSON list.") from None
    if not isinstance(value, list):
        raise ValueError("base_addresses must be a list of {url, region}.")
    for item in value:
        url = item.get("url") if isinstance(item, dict) else item
        if not valid_base(str(url or "").strip().rstrip("/")):
            raise ValueError(f"Not an http(s) base address: {url!r}.")
    return _parse_addresses(value)


def parse_rate(value) -> Decimal | None:
    try:
        d = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    return d if d.is_finite() and d > 0 else None


async def load(store, config) -> dict:
    """The public status; base_addresses may be empty (the caller adds its own origin)."""
    docs = await store.db.options.find({}).to_list(100)
    opts = {d["_id"]: d.get("value") for d in docs}
    reg = opts.get("registration_enabled")
    rate = parse_rate(opts.get("purchase_rate")) if opts.get("purchase_rate") not in (None, "") \
        else None
    addresses = _parse_addresses(opts["base_addresses"]) if "base_addresses" in opts \
        else _parse_addresses(config.base_address_list())
    return {
        "site_name": str(opts.get("site_name") or DEFAULT_SITE_NAME),
        "registration_enabled": config.registration_enabled if reg is None else bool(reg),
        "base_addresses": addresses,
        "purchase_rate": float(rate) if rate is not None else None,
        # 1 credit = 1 USD of official price, so the rate is the fraction paid.
        "discount_percent": round(float((1 - rate) * 100), 1) if rate is not None else None,
    }


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()
