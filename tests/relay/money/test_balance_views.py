"""A balance shown to people is the same whenever it is read: a document
read while a flush or a lease is between the database and this process's
memory counts each charge once.  CI caught the key's `used_quota` shown one
call too high (test_base_variants, 2026-11-25): the flusher had applied a
batch in the database and not yet taken it off the spend it holds in
memory.  Against the real database server."""
import asyncio
import uuid

from models.store import Store
from relay.money.billing import Billing
from relay.money.leases import TOKEN, USER

QUOTA = 10_000_000


def run(coro):
    return asyncio.run(coro)


async def _setup(mongo_url, tmp_path, retain: float = 5.0):
    store = Store(mongo_url, db_name="bv_" + uuid.uuid4().hex[:8])
    await store.start()
    await store.db.users.insert_one({"_id": 1, "quota": QUOTA, "used_quota": 0})
    await store.db.tokens.insert_one({"_id": 1, "user_id": 1, "quota": QUOTA, "used_quota": 0})
    b = Billing(store, process_id="p1", lease_chunk=10_000, data_dir=str(tmp_path))
    b.retain_applied = retain
    await b.register()
    return store, b


async def _charge(b: Billing, amount: int) -> None:
    rid = uuid.uuid4().hex
    res = await b.reserve(rid, 1, 1, True, amount)
    await b.settle(res, amount, {"_id": rid, "user_id": 1, "token_id": 1})


async def _docs(store) -> dict:
    return {USER: await store.db.users.find_one({"_id": 1}),
            TOKEN: await store.db.tokens.find_one({"_id": 1})}


def test_a_document_read_mid_flush_counts_each_charge_once(mongo_url, tmp_path):
    async def go():
        store, b = await _setup(mongo_url, tmp_path)
        await _charge(b, 1500)
        await _charge(b, 700)
        want = (QUOTA - 2200, 2200)
        old = await _docs(store)
        seen = []
        bulk = b._bulk
        kinds = {"users": USER, "tokens": TOKEN}

        async def spied(coll, ops, *rest):
            out = await bulk(coll, ops, *rest)
            # The batch is in the database; this process has not yet taken
            # it off what it holds in memory.
            if coll in kinds:
                doc = await store.db[coll].find_one({"_id": 1})
                seen.append((coll, b.view_from_doc(kinds[coll], doc),
                             await b.balance(kinds[coll], 1)))
            return out
        b._bulk = spied
        await b.flush()
        assert seen and all(v == want and bal == want for _, v, bal in seen), seen
        # A document read before the flush, looked at after it.
        for kind in (USER, TOKEN):
            assert b.view_from_doc(kind, old[kind]) == want, kind
            assert b.live_view(kind, 1) == want, kind
            assert await b.balance(kind, 1) == want, kind
        await b.stop()
        await store.close()
    run(go())


class _After:
    """A database whose users collection reads the account back right after
    each find_one_and_update: the moment a lease is in the database and not
    yet in this process's memory."""

    def __init__(self, db, seen: list, b: Billing):
        self.db, self.seen, self.b = db, seen, b

    def __getattr__(self, name):
        return getattr(self.db, name)

    def __getitem__(self, name):
        coll = self.db[name]
        if name != "users":
            return coll
        outer = self

        class Coll:
            def __getattr__(self, attr):
                return getattr(coll, attr)

            async def find_one_and_update(self, *a, **kw):
                doc = await coll.find_one_and_update(*a, **kw)
                fresh = await coll.find_one({"_id": 1})
                outer.seen.append(outer.b.view_from_doc(USER, fresh))
                return doc
        return Coll()


def test_a_document_read_mid_lease_counts_the_lease_once(mongo_url, tmp_path):
    async def go():
        store, b = await _setup(mongo_url, tmp_path)
        await _charge(b, 300)
        want = (QUOTA - 300, 300)
        seen = []
        real = b.store
        b.store = type("S", (), {"db": _After(store.db, seen, b)})()
        await b._lease(b._get(USER, 1), 50_000)
        b.store = real
        assert seen == [want], seen
        await b.stop()
        await store.close()
    run(go())


def test_views_agree_after_the_retained_charges_are_let_go(mongo_url, tmp_path):
    async def go():
        store, b = await _setup(mongo_url, tmp_path, retain=0.05)
        for n in range(5):
            await _charge(b, 100 + n)
        want = (QUOTA - 510, 510)
        ancient = await _docs(store)
        await b.flush()
        await asyncio.sleep(0.1)
        await _charge(b, 90)   # a charge after the others were let go
        want = (want[0] - 90, want[1] + 90)
        await b.flush()        # lets go of the first five
        docs = await _docs(store)
        for kind in (USER, TOKEN):
            assert b._bal[(kind, 1)].shown.runs["p1"].floor > 0, "nothing was let go"
            # Read before the five were applied, and they are no longer
            # known one by one: the last kept document answers instead.
            assert b.view_from_doc(kind, ancient[kind]) == want, kind
            assert b.live_view(kind, 1) == want, kind
            assert b.view_from_doc(kind, docs[kind]) == want, kind
            assert await b.balance(kind, 1) == want, kind
        await b.flush(release_all=True)
        docs = await _docs(store)
        for kind in (USER, TOKEN):
            assert b.view_from_doc(kind, docs[kind]) == want, kind
            assert await b.balance(kind, 1) == want, kind
            # Given back at shutdown, the document keeps no mark of this process.
            assert "p1" not in (docs[kind].get("leases") or {}), docs[kind]
            assert "p1" not in (docs[kind].get("applied") or {}), docs[kind]
        await b.stop()
        await store.close()
    run(go())
