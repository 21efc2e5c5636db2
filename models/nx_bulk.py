"""The billing flusher's bulk updates on the embedded server, run on the
rows themselves (models/nx_server.py installs them; tests/models/
test_nx_server.py and the fidelity suite pin them)."""
from __future__ import annotations

# nx-27017 spends 120-300 us of Python on each update of a bulk write (the
# filter and the update translated to SQL again for every one), which at a
# few thousand keys and rollup documents a second is more than a core.  The
# billing flusher sends few shapes (relay/money/flusher.py): these run here
# on the row itself, with MongoDB's meaning; any other bulk update, or any
# value of another type, goes to nx-27017 as it comes.  The fidelity suite
# (tests/models/test_store_fidelity.py) runs these shapes through the wire.
#   filter: {_id: int or str, <path>: {$lt: number} | {$exists: bool} | number}
#   update: {$inc: {<path>: int}, $set / $setOnInsert: {<path>: int or str},
#            $max: {<path>: number}}, with or without upsert
_NUM = (int, float)


def _scalar(v, types=(int, str)) -> bool:
    return isinstance(v, types) and not isinstance(v, bool)


def _simple_filter(q) -> bool:
    if not isinstance(q, dict) or not _scalar(q.get("_id")):
        return False
    for k, v in q.items():
        if k == "_id":
            continue
        if k.startswith("$") or not k:
            return False
        if isinstance(v, dict):
            if len(v) != 1:
                return False
            (op, arg), = v.items()
            if not ((op == "$lt" and _scalar(arg, _NUM)) or
                    (op == "$exists" and isinstance(arg, bool))):
                return False
        elif not _scalar(v, _NUM):
            return False
    return True


def _simple_update(u) -> bool:
    if not isinstance(u, dict) or not u:
        return False
    kinds = {"$inc": (int,), "$set": (int, str), "$setOnInsert": (int, str), "$max": _NUM}
    paths = set()
    for op, fields in u.items():
        if op not in kinds or not isinstance(fields, dict) or not fields:
            return False
        for path, v in fields.items():
            if (not path or path.startswith("$") or "_id" == path.split(".")[0]
                    or not _scalar(v, kinds[op]) or path in paths):
                return False
            paths.add(path)
    return True


def simple_bulk_update(msg):
    """(collection, updates, ordered) when every update of this `update`
    command is one of the shapes above; None otherwise."""
    body, updates = None, []
    for kind, doc in msg.get("sections") or ():
        if kind == "body" and isinstance(doc, dict):
            body = doc
        elif kind == "payload" and isinstance(doc, dict):
            updates += list(doc.get("updates") or ())
    if not isinstance(body, dict) or not isinstance(body.get("update"), str):
        return None
    updates += list(body.get("updates") or ())
    if body.get("lsid") is not None and body.get("txnNumber") is not None:
        return None  # a client's transaction: nx-27017's own path
    for up in updates:
        if (not isinstance(up, dict) or set(up) - {"q", "u", "upsert", "multi"} or up.get("multi")
                or not _simple_filter(up.get("q")) or not _simple_update(up.get("u"))):
            return None
    return body["update"], updates, bool(body.get("ordered", True))


def _get(doc: dict, path: str):
    cur = doc
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _put(doc: dict, path: str, value) -> None:
    parts = path.split(".")
    cur = doc
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            if nxt is not None:
                raise ValueError(f"cannot create field {part!r} in a non-object")
            nxt = cur[part] = {}
        cur = nxt
    cur[parts[-1]] = value


def _matches(doc: dict, q: dict) -> bool:
    for path, cond in q.items():
        if path == "_id":
            continue
        there, value = _get(doc, path)
        if isinstance(cond, dict):
            (op, arg), = cond.items()
            if op == "$exists":
                if there != arg:
                    return False
            elif not (there and _scalar(value, _NUM) and value < arg):
                return False
        elif not (there and _scalar(value, _NUM) and value == cond):
            return False
    return True


def _apply(doc: dict, u: dict, inserting: bool) -> bool:
    """Apply update `u` to `doc`; whether anything changed."""
    changed = False

    def put(path, value):
        nonlocal changed
        there, old = _get(doc, path)
        if not there or old != value or type(old) is not type(value):
            _put(doc, path, value)
            changed = True
    for path, v in (u.get("$setOnInsert") or {}).items() if inserting else ():
        put(path, v)
    for path, v in (u.get("$set") or {}).items():
        put(path, v)
    for path, v in (u.get("$inc") or {}).items():
        there, old = _get(doc, path)
        if there and not _scalar(old, _NUM):
            raise ValueError(f"cannot $inc the non-number {path!r}")
        put(path, (old if there else 0) + v)
    for path, v in (u.get("$max") or {}).items():
        there, old = _get(doc, path)
        if not there or (_scalar(old, _NUM) and old < v):
            put(path, v)
    return changed


def fast_bulk_update(conn, coll: str, updates: list, ordered: bool) -> dict:
    """Run updates of the simple shapes on `coll`'s rows (the caller holds
    the database's lock and a transaction); nx-27017's answer for them."""
    import json
    import sqlite3
    table = '"' + coll.replace('"', '""') + '"'
    matched = modified = 0
    upserted, errors = [], []
    for i, up in enumerate(updates):
        q, u = up["q"], up["u"]
        try:
            row = conn.execute(f"SELECT id, data FROM {table} WHERE _id = ? LIMIT 1",
                               (q["_id"],)).fetchone()
            if row is not None:
                doc = json.loads(row[1])
                if not _matches(doc, q):
                    row = None
            if row is not None:
                matched += 1
                if _apply(doc, u, False):
                    conn.execute(f"UPDATE {table} SET data = ? WHERE id = ?",
                                 (json.dumps(doc), row[0]))
                    modified += 1
            elif up.get("upsert"):
                doc = {"_id": q["_id"]}
                for path, cond in q.items():
                    if path != "_id" and not isinstance(cond, dict):
                        _put(doc, path, cond)
                _apply(doc, u, True)
                conn.execute(f"INSERT INTO {table} (data, _id) VALUES (?, ?)",
                             (json.dumps(doc), q["_id"]))
                upserted.append({"index": i, "_id": q["_id"]})
        except sqlite3.IntegrityError as exc:
            errors.append({"index": i, "code": 11000, "errmsg": str(exc)})
        except ValueError as exc:
            errors.append({"index": i, "code": 14, "errmsg": str(exc)})
        if errors and ordered:
            break
    out: dict = {"ok": 1, "n": matched + len(upserted), "nModified": modified}
    if upserted:
        out["upserted"] = upserted
    if errors:
        out["writeErrors"] = errors
    return out


