"""The embedded database's entry point (models/embedded.py runs this file):
nx-27017, with each insert command stored as one SQLite transaction.

Why: nx-27017 stores an `insert_many` as one autocommitted `insert_one` per
document, so every usage record is a transaction of its own, and in WAL mode
each commit writes again every page it touched (the table's, `_id`'s and the
three indexes' of models/store.py).  One transaction per command writes each
page once: bench/store.py measures the server's CPU per record.

Why it is safe:
- nx-27017 runs a command while holding its database's lock, and this takes
  the same (re-entrant) lock first, so no other command's writes fall inside;
- a command inside a client's own transaction (the connection already in
  one) is left as it is;
- a failed document (a duplicate `_id`) fails alone, as before: SQLite undoes
  the statement, not the transaction, so an unordered batch stores the rest;
- an error of the command as a whole, or of the COMMIT, rolls the batch back
  and reaches the client as an error: the relay keeps its records and sends
  them again (models/store.insert_records treats those already there as
  written).

If nx-27017 changes shape, it runs as it comes, with a warning in its log.
"""
from __future__ import annotations

import functools
import sys


def one_transaction(handle_insert):
    """handle_insert, its documents stored in one transaction."""
    from nx_27017.handler import _msg_db_name

    @functools.wraps(handle_insert)
    def wrapper(self, msg):
        db_name = _msg_db_name(msg)
        with self._lock_for(db_name):
            conn = self.get_database(db_name).db
            if conn.in_transaction:
                return handle_insert(self, msg)
            conn.execute("BEGIN")
            try:
                out = handle_insert(self, msg)
                if conn.in_transaction:  # else something inside committed it
                    conn.execute("COMMIT")
                return out
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
    wrapper.one_transaction = True
    return wrapper


def _warn(text: str) -> None:
    """A line in the server's log file (its logging is not set up yet)."""
    args = sys.argv
    path = args[args.index("--log-file") + 1] if "--log-file" in args[:-1] else ""
    try:
        with open(path, "a") as fh:
            fh.write(f"WARNING relay: {text}\n")
    except OSError:
        print(text, file=sys.stderr)


def install() -> bool:
    try:
        from nx_27017 import handler
        cls = handler.NeoSQLiteHandler
        if not hasattr(handler, "_msg_db_name") or not all(
                hasattr(cls, name) for name in ("handle_insert", "_lock_for", "get_database")):
            raise AttributeError("no _msg_db_name, or NeoSQLiteHandler lacks handle_insert, "
                                 "_lock_for or get_database")
    except (ImportError, AttributeError) as exc:
        _warn(f"nx-27017 has changed ({exc}): inserts are stored a document at a time")
        return False
    if not getattr(cls.handle_insert, "one_transaction", False):
        cls.handle_insert = one_transaction(cls.handle_insert)
    return True


def main() -> None:
    install()
    from nx_27017.nx_27017 import main as nx_main
    nx_main()


if __name__ == "__main__":
    sys.exit(main())
