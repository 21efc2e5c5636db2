"""Changes to stored data that run once at start (each is idempotent).

install(app) is listed in server.INSTALLERS: it runs these before the server
takes requests.
"""
from __future__ import annotations

import asyncio
import logging

from models import netlist
from models.records import parse_rate_tiers, to_decimal
from models.secrets import mask
from models.store import DuplicateKeyError, PyMongoError, sort_by_id

log = logging.getLogger("relay.migrations")


async def hash_redemption_codes(store, vault) -> int:
    """Redemption codes were stored in plain text; now only a keyed hash
    (like API keys) and a masked hint are kept.  Returns how many changed."""
    try:
        # The old unique index on the plain code: with codes no longer
        # stored, MongoDB would see every new one as a duplicate null.
        await store.db.redemptions.drop_index("key_1")
    except PyMongoError:
        pass
    n = 0
    async for doc in store.db.redemptions.find({"key": {"$exists": True}}):
        code = doc["key"]
        await store.db.redemptions.update_one(
            {"_id": doc["_id"]},
            {"$set": {"key_hash": vault.lookup_hash(code), "key_hint": mask(code, 4)},
             "$unset": {"key": ""}})
        n += 1
    if n:
        log.info("redemption codes: %d stored as keyed hashes", n)
    return n


async def seed_usable_groups(store) -> int:
    """Groups from before "usable groups" existed get a list: every enabled
    group at the same or a higher rate.  Users keep the choice they had,
    except moving a key to a cheaper group than their own (the hole this
    closes).  Returns how many groups changed."""
    docs = await store.db.groups.find({}).to_list(10_000)
    # A group's rate is its lowest: what its rate rules can take it down to.
    rate = {d["_id"]: lowest_rate(d) for d in docs}
    n = 0
    for d in docs:
        if "usable_groups" in d:
            continue
        usable = sorted(g["_id"] for g in docs
                        if g["_id"] != d["_id"] and g.get("enabled", True)
                        and rate[g["_id"]] >= rate[d["_id"]])
        await store.db.groups.update_one({"_id": d["_id"]}, {"$set": {"usable_groups": usable}})
        n += 1
    return n


async def compile_allow_lists(store) -> int:
    """Keys saved before allow-lists were stored collapsed get their
    networks (`allow_nets`, models/netlist.py), parsed on a worker thread,
    so that loading the key is cheap.  A list over today's bounds is kept
    whole: the key goes on working.  Returns how many keys changed."""
    n = 0
    async for doc in store.db.tokens.find({"allow_nets": {"$exists": False}},
                                          {"_id": 1, "allow_ips": 1}):
        nets = await asyncio.to_thread(netlist.legacy, doc.get("allow_ips") or "")
        await store.db.tokens.update_one({"_id": doc["_id"]}, {"$set": {"allow_nets": nets}})
        if nets["n"] > netlist.MAX_NETWORKS:
            log.warning("key %s: its allow-list is %d networks (a new one may have %d)",
                        doc["_id"], nets["n"], netlist.MAX_NETWORKS)
        n += 1
    if n:
        log.info("allow-lists: %d keys compiled", n)
    return n


async def unique_identities(store) -> int:
    """Accounts from before names and e-mail addresses were unique whatever
    their case get `name_key` and `email_key`, oldest first, refusing
    nothing that worked: where two names differ only in case ("alice",
    "ALICE"), the younger's key is made unique with its id ("alice#7"), and
    it still signs in by its exact name; a younger account with the same
    address keeps it for its notifications, but signing in by that address
    reaches the older one, as it did.  Returns how many accounts changed."""
    docs = sort_by_id(await store.db.users.find(
        {"name_key": {"$exists": False}}, {"_id": 1, "username": 1, "email": 1}).to_list(None))
    for doc in docs:
        key = str(doc.get("username", "")).lower()
        try:
            await store.db.users.update_one({"_id": doc["_id"]}, {"$set": {"name_key": key}})
        except DuplicateKeyError:
            log.warning("user %s: the name %r differs only in case from an older account's; "
                        "it signs in by its exact name", doc["_id"], doc.get("username"))
            await store.db.users.update_one({"_id": doc["_id"]},
                                            {"$set": {"name_key": f"{key}#{doc['_id']}"}})
        email = str(doc.get("email") or "").lower()
        if email:
            try:
                await store.db.users.update_one({"_id": doc["_id"]},
                                                {"$set": {"email_key": email}})
            except DuplicateKeyError:
                log.warning("user %s: the e-mail address of an older account; signing in by it "
                            "reaches that account", doc["_id"])
    if docs:
        log.info("user names and e-mail addresses: %d accounts given keys", len(docs))
    return len(docs)


def lowest_rate(doc: dict):
    """The least a group's rate rule can bill at (relay/money/rates.py)."""
    rate = to_decimal(doc.get("rate", "1"))
    for f in ("input_tiers", "spend_tiers"):
        try:
            tiers = parse_rate_tiers(doc.get(f), f)
        except ValueError:
            tiers = ()
        rate *= min([1, *(x for _, x in tiers)])
    return rate


def install(app) -> None:
    async def on_start(_app) -> None:
        s = app.settings
        await hash_redemption_codes(s["store"], s["vault"])
        await compile_allow_lists(s["store"])
        await unique_identities(s["store"])
        if await seed_usable_groups(s["store"]):
            await s["catalog"].reload_groups()
    app.settings["on_start"].insert(0, on_start)
