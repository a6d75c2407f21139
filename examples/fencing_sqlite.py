"""Fencing in SQL: a row remembers the largest fencing token that wrote it.

The pattern, for any SQL database::

    UPDATE accounts SET balance = :balance, fence_token = :token
     WHERE id = :id AND fence_token <= :token

A holder whose lease ran out while it was paused (GC, a blocked loop, a VM
migration) wakes up with an older token than the new holder's: its UPDATE
matches no row, and it learns so from the row count. This example plays
that timeline against 5 embedded nodes and an SQLite file:

    python examples/fencing_sqlite.py
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile

from redlock_async import Redlock
from redlock_async.testing import nodes_from_env


def write(db: sqlite3.Connection, balance: int, token: int) -> bool:
    """Apply the write only for a token not older than the last one; True when applied."""
    with db:
        cursor = db.execute(
            "UPDATE accounts SET balance = ?, fence_token = ? WHERE id = 1 AND fence_token <= ?",
            (balance, token, token),
        )
    return cursor.rowcount == 1


async def main(urls: list[str], path: str) -> list[str]:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence_token INTEGER NOT NULL)")
    with db:
        db.execute("INSERT INTO accounts VALUES (1, 100, 0)")
    log: list[str] = []
    async with Redlock(urls, node_timeout=0.01) as a, Redlock(urls, node_timeout=0.01) as b:
        slow = a.lock("accounts:1", ttl=0.3, fencing=True, auto_extend=False)
        assert await slow.acquire()
        old_token = slow.fencing_token
        assert old_token is not None
        log.append(f"A holds the lock with fencing token {old_token}, then pauses past its validity")
        await asyncio.sleep(0.4)  # A's lease runs out while it is "paused"

        async with b.lock("accounts:1", ttl=5.0, fencing=True) as fast:
            assert fast.fencing_token is not None
            applied = write(db, 150, fast.fencing_token)
            log.append(f"B holds it with token {fast.fencing_token}: balance 150 applied={applied}")

        applied = write(db, 50, old_token)  # A wakes up and writes with its old token
        log.append(f"A writes late with token {old_token}: balance 50 applied={applied}")
        await slow.release()
    balance = db.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()[0]
    log.append(f"final balance {balance}")
    db.close()
    return log


if __name__ == "__main__":
    with nodes_from_env() as urls, tempfile.TemporaryDirectory() as tmp:
        for line in asyncio.run(main(urls, os.path.join(tmp, "bank.sqlite"))):
            print(line)
