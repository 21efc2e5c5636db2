"""Records the relay's hot path works with, built from store documents.

Documents stay plain dicts in MongoDB; these frozen dataclasses are what the
catalog caches, so a cached value can never be mutated by accident.  Money is
an int (quota units) and prices/rates are Decimal: never floats.
"""
from __future__ import annotations

import ipaddress
import re
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from models.netlist import NetList
from models.refusal import Refusal

# 500,000 units = 1 credit = 1 USD of official price (one-api/new-api count).
QUOTA_PER_USD = 500_000
# The largest balance or amount the API accepts (2 billion USD): far from
# the 64-bit limit, so that no sum of balances can overflow it.
MAX_QUOTA = 10 ** 15

TOKEN_ENABLED, TOKEN_DISABLED, TOKEN_EXPIRED, TOKEN_EXHAUSTED = 1, 2, 3, 4
USER_ENABLED, USER_DISABLED = 1, 2
ROLE_USER, ROLE_ADMIN, ROLE_ROOT = 1, 10, 100

BILLING_MODES = ("per_token", "per_call")
# Rate limits on a key or an account; 0 or absent = none (relay/money/limits.py).
LIMIT_FIELDS = ("rpm_limit", "tpm_limit", "concurrency_limit")


def to_decimal(value: Any, name: str = "value") -> Decimal:
    if value is None or value == "":
        return Decimal(0)
    if isinstance(value, bool):
        raise Refusal(f"{name} must be a number", "field_not_number", field=name)
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise Refusal(f"{name} must be a number", "field_not_number", field=name) from None
    if not d.is_finite() or d < 0:
        raise Refusal(f"{name} must be a non-negative number", "field_negative", field=name)
    return d


def parse_networks(text: str | list | None) -> tuple:
    """Parse an allow-list: addresses or CIDR ranges, newline or comma separated.

    Raises ValueError naming the first entry that is neither.
    """
    if not text:
        return ()
    items = text if isinstance(text, list) else re.split(r"[\s,;]+", str(text))
    nets = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"not an IP address or CIDR range: {item!r}") from None
    return tuple(nets)


# Budgets by period (relay/money/budgets.py): {"day": units, "week": ..., "month": ...}.
PERIODS = ("day", "week", "month")


def parse_budgets(raw) -> tuple:
    """{"day": units, "week": units, "month": units} -> (("day", n), ...);
    0 or absent is none.  ValueError says what is wrong."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise Refusal("budgets must be an object like {\"day\": units, \"month\": units}",
                      "budgets_not_object")
    out = []
    for k, v in raw.items():
        if k not in PERIODS:
            raise Refusal(f"budgets: unknown period {k!r} (day, week or month)",
                          "budget_period", period=str(k)[:64])
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10 ** 15:
            raise Refusal(f"budgets.{k} must be a whole number of quota units, "
                          "0 to 1,000,000,000,000,000 (0: none)", "budget_value", period=k,
                          max=10 ** 15)
        if v:
            out.append((k, v))
    return tuple(sorted(out, key=lambda x: PERIODS.index(x[0])))


def budgets_of(d: dict) -> tuple:
    try:
        return parse_budgets(d.get("budgets"))
    except ValueError:
        return ()


def limits_of(d: dict) -> tuple:
    return tuple(max(0, int(d.get(f) or 0)) for f in LIMIT_FIELDS)


def usable_groups(user_group: str, own_list, is_admin: bool, groups: dict) -> set[str]:
    """The groups a user may put keys in (new-api's "usable groups").

    An administrator: every group.  Anyone else: their own group, plus the
    user's own list when an administrator gave them one (`usable_groups` on
    the user), else the list of their user group (`usable_groups` on the
    group).  The caller checks that the group exists and is enabled.
    """
    if is_admin:
        return set(groups)
    if own_list is None:
        g = groups.get(user_group)
        own_list = g.usable_groups if g is not None else ()
    return {user_group, *own_list}


@dataclass(frozen=True)
class User:
    id: int
    username: str
    email: str
    role: int
    status: int
    group: str
    limits: tuple = (0, 0, 0)  # rpm, tpm, concurrency (LIMIT_FIELDS); 0 = none
    # None: the user group's list applies (see usable_groups()).
    usable_groups: tuple | None = None
    # Quota units the account may go below zero (an operator's choice; 0: none).
    credit_limit: int = 0
    budgets: tuple = ()      # (("day", units), ...): parse_budgets
    timezone: str = "UTC"    # budgets' and spend tiers' calendar (IANA name)

    @classmethod
    def from_doc(cls, d: dict) -> "User":
        own = d.get("usable_groups")
        return cls(id=d["_id"], username=d.get("username", ""), email=d.get("email", ""),
                   role=int(d.get("role", ROLE_USER)), status=int(d.get("status", USER_ENABLED)),
                   group=d.get("group") or "default", limits=limits_of(d),
                   usable_groups=tuple(own) if isinstance(own, list) else None,
                   credit_limit=max(int(d.get("credit_limit") or 0), 0),
                   budgets=budgets_of(d), timezone=d.get("timezone") or "UTC")

    @property
    def is_admin(self) -> bool:
        return self.role >= ROLE_ADMIN

    def usable_set(self, groups: dict) -> set[str]:
        return usable_groups(self.group, self.usable_groups, self.is_admin, groups)

    def may_use(self, group: str, groups: dict) -> bool:
        return group in self.usable_set(groups)


@dataclass(frozen=True)
class Token:
    id: int
    user_id: int
    name: str
    status: int
    group: str
    unlimited_quota: bool
    expired_time: int
    allow_ips: NetList  # empty: any address (models/netlist.py)
    model_limits_enabled: bool
    model_limits: frozenset
    billing_mode: str
    limits: tuple = (0, 0, 0)  # rpm, tpm, concurrency (LIMIT_FIELDS); 0 = none
    budgets: tuple = ()        # (("day", units), ...): parse_budgets

    @classmethod
    def from_doc(cls, d: dict) -> "Token":
        return cls(id=d["_id"], user_id=d["user_id"], name=d.get("name", ""),
                   status=int(d.get("status", TOKEN_ENABLED)), group=d.get("group") or "default",
                   unlimited_quota=bool(d.get("unlimited_quota")),
                   expired_time=int(d.get("expired_time", -1)),
                   allow_ips=NetList.of(d),
                   model_limits_enabled=bool(d.get("model_limits_enabled")),
                   model_limits=frozenset(d.get("model_limits") or ()),
                   billing_mode=d.get("billing_mode") or "per_token", limits=limits_of(d),
                   budgets=budgets_of(d))

    def expired(self, now: float | None = None) -> bool:
        return self.expired_time not in (-1, 0) and self.expired_time <= (now or time.time())

    def ip_allowed(self, ip: str) -> bool:
        return not self.allow_ips or self.allow_ips.contains(ip)

    def model_allowed(self, model: str) -> bool:
        return not self.model_limits_enabled or model in self.model_limits


@dataclass(frozen=True)
class Group:
    name: str
    rate: Decimal
    description: str
    enabled: bool
    # The other groups this group's members may put keys in.
    usable_groups: tuple = ()
    # Rate rules (relay/money/rates.py): ((from, factor), ...) by the call's
    # input tokens and by the account's spend this calendar month (units).
    input_tiers: tuple = ()
    spend_tiers: tuple = ()

    @classmethod
    def from_doc(cls, d: dict) -> "Group":
        return cls(name=d["_id"], rate=to_decimal(d.get("rate", "1")),
                   description=d.get("description", ""), enabled=bool(d.get("enabled", True)),
                   usable_groups=tuple(d.get("usable_groups") or ()),
                   input_tiers=parse_rate_tiers(d.get("input_tiers"), "input_tiers"),
                   spend_tiers=parse_rate_tiers(d.get("spend_tiers"), "spend_tiers"))


# A rate rule has at most this many tiers of each kind.
MAX_RATE_TIERS = 8
# Bounds of a tier's start: input tokens, and credits (USD) spent in a month.
RATE_TIER_MAX_FROM = {"input_tiers": 100_000_000, "spend_tiers": 1_000_000_000}


def parse_rate_tiers(raw: Any, name: str) -> tuple:
    """[{"from": 32000, "factor": "0.6"}, ...] -> ((32000, Decimal("0.6")), ...).

    `from` is input tokens (input_tiers) or credits spent this calendar
    month (spend_tiers, returned in quota units); a tier applies from
    there on and multiplies the group's rate by `factor`.  Tiers must be
    given in ascending order of `from` (each above the last, above 0),
    with factors above 0; ValueError says what is wrong."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise Refusal(f"{name} must be a list of {{from, factor}}", "rate_tiers_list",
                      field=name)
    if len(raw) > MAX_RATE_TIERS:
        raise Refusal(f"{name} may have at most {MAX_RATE_TIERS} tiers", "rate_tiers_count",
                      field=name, max=MAX_RATE_TIERS)
    out, last = [], Decimal(0)
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or set(t) - {"from", "factor"}:
            raise Refusal(f"{name}[{i}] must be an object with 'from' and 'factor' only",
                          "rate_tier_object", field=f"{name}[{i}]")
        start = to_decimal(t.get("from"), f"{name}[{i}].from")
        factor = to_decimal(t.get("factor"), f"{name}[{i}].factor")
        if name == "input_tiers" and start != start.to_integral_value():
            raise Refusal(f"{name}[{i}].from must be a whole number of input tokens",
                          "field_not_whole", field=f"{name}[{i}].from")
        if start <= last:
            raise Refusal(f"{name} must be sorted by 'from', each above the one before "
                          f"and above 0 ({name}[{i}].from is {start})", "rate_tiers_order",
                          field=name)
        if start > RATE_TIER_MAX_FROM[name] or start.as_tuple().exponent < -6:
            raise Refusal(f"{name}[{i}].from must be at most {RATE_TIER_MAX_FROM[name]:,} "
                          "with at most 6 decimals", "field_decimal", field=f"{name}[{i}].from",
                          max=RATE_TIER_MAX_FROM[name], decimals=6)
        if factor <= 0 or factor > 1000 or factor.as_tuple().exponent < -6:
            raise Refusal(f"{name}[{i}].factor must be above 0 and at most 1000, with at "
                          "most 6 decimals", "rate_tier_factor", field=f"{name}[{i}].factor")
        last = start
        out.append((int(start) if name == "input_tiers" else int(start * QUOTA_PER_USD), factor))
    return tuple(out)


def rate_tiers_doc(tiers: tuple, name: str) -> list:
    """The stored (and API) form of parsed rate tiers: numbers as strings."""
    if name == "input_tiers":
        return [{"from": str(f), "factor": str(x)} for f, x in tiers]
    return [{"from": format((Decimal(f) / QUOTA_PER_USD).normalize(), "f"), "factor": str(x)}
            for f, x in tiers]


# Every price component, in USD: per million tokens unless named otherwise.
# An unset (zero) component falls back to its parent (see relay/money/pricing.py).
PRICE_COMPONENTS = (
    "input_price", "output_price",
    "cache_price",                 # input read from a cache
    "cache_write_price",           # input written to a cache (Anthropic: 5 minutes)
    "cache_write_1h_price",        # input written to a 1-hour cache
    "audio_input_price", "audio_output_price", "audio_cache_price",
    "image_input_price", "image_output_price", "image_cache_price",
    "reasoning_price",             # thinking tokens; unset = output price
    "call_price",                  # USD per call (per unit for call-only models)
    "unit_price",                  # USD per unit: image, second, character, action
    # USD per call of a vendor-run tool, as the upstream's answer counts them
    # (relay/money/pricing.py TOOL_PRICES).
    "web_search_price", "file_search_price", "code_execution_price",
)
# Components a tier may change (the per-token ones).
TIER_COMPONENTS = PRICE_COMPONENTS[:12]


def parse_tiers(raw: Any) -> tuple:
    """[{"above": 200000, "input_price": 2.5, ...}, ...] -> ((200000, {name: Decimal}), ...),
    sorted by threshold.  A tier applies to a call whose prompt has MORE
    than `above` tokens, and then to all of its tokens (the vendors' rule)."""
    if not raw:
        return ()
    if not isinstance(raw, list):
        raise Refusal("tiers must be a list of {above, <component>: price}", "field_not_list",
                      field="tiers")
    tiers = []
    for t in raw:
        if not isinstance(t, dict):
            raise Refusal("each tier must be an object", "field_not_object", field="tiers[]")
        above = t.get("above")
        if isinstance(above, bool) or not isinstance(above, int) or above < 0:
            raise Refusal("a tier's 'above' must be a whole number of prompt tokens",
                          "tier_above")
        unknown = set(t) - {"above", *TIER_COMPONENTS}
        if unknown:
            raise Refusal(f"a tier cannot set {sorted(unknown)[0]!r}", "tier_unknown",
                          name=str(sorted(unknown)[0])[:64])
        prices = {k: to_decimal(t[k], k) for k in TIER_COMPONENTS if k in t}
        tiers.append((above, prices))
    tiers.sort(key=lambda x: x[0])
    if len({a for a, _ in tiers}) != len(tiers):
        raise Refusal("two tiers start at the same prompt size", "tiers_same_start")
    return tuple(tiers)


def tiers_doc(tiers: tuple) -> list:
    """The stored (and API) form of parsed tiers: prices as strings."""
    return [{"above": a, **{k: str(v) for k, v in p.items()}} for a, p in tiers]


@dataclass(frozen=True)
class Price:
    """Every price component of one model (see PRICE_COMPONENTS), its
    prompt-size tiers, and where it came from: "override" (an
    administrator's row) or "catalogue" (genai-prices, `ref` names the entry)."""
    model: str
    group: str
    input_price: Decimal = Decimal(0)
    output_price: Decimal = Decimal(0)
    cache_price: Decimal = Decimal(0)
    call_price: Decimal = Decimal(0)
    cache_write_price: Decimal = Decimal(0)
    cache_write_1h_price: Decimal = Decimal(0)
    audio_input_price: Decimal = Decimal(0)
    audio_output_price: Decimal = Decimal(0)
    audio_cache_price: Decimal = Decimal(0)
    image_input_price: Decimal = Decimal(0)
    image_output_price: Decimal = Decimal(0)
    image_cache_price: Decimal = Decimal(0)
    reasoning_price: Decimal = Decimal(0)
    unit_price: Decimal = Decimal(0)
    web_search_price: Decimal = Decimal(0)
    file_search_price: Decimal = Decimal(0)
    code_execution_price: Decimal = Decimal(0)
    tiers: tuple = ()
    source: str = "override"
    ref: str = ""

    @classmethod
    def from_doc(cls, d: dict) -> "Price":
        return cls(model=d["model"], group=d.get("group") or "",
                   **{f: to_decimal(d.get(f), f) for f in PRICE_COMPONENTS},
                   tiers=parse_tiers(d.get("tiers")))

    def at(self, prompt_tokens: int) -> "Price":
        """The prices that apply to a call with this many prompt tokens."""
        applied: dict = {}
        for above, prices in self.tiers:
            if prompt_tokens > above:
                applied.update(prices)
        return replace(self, **applied, tiers=()) if applied else self

    def components(self) -> dict:
        return {f: getattr(self, f) for f in PRICE_COMPONENTS}


@dataclass(frozen=True)
class Channel:
    id: int
    name: str
    type: str
    base_url: str
    key: str  # decrypted; never leaves the process
    models: tuple
    groups: tuple
    priority: int
    weight: int
    model_mapping: dict = field(hash=False, compare=False)
    enabled: bool = True
    # Extra per-channel options, e.g. {"system_role": "developer"} for
    # reasoning models that reject the system role, or Azure's api_version.
    options: dict = field(default_factory=dict, hash=False, compare=False)

    def upstream_model(self, model: str) -> str:
        return self.model_mapping.get(model, model)
