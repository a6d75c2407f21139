"""A rolling upgrade from the layout before one-slot keys (issue 39 item 2): clients of both versions on the
same nodes never hold beside each other.

- A lock, its line and waits: the lock key's name is unchanged, so both versions set the same key (only
  the line moved: a waiter of one version is served by the other's releases through the release word).
- A semaphore: its slots moved, and its widest-limit key kept its name. This version writes
  ``"<limit> layout-2"`` there, which a client of the layout before cannot read as a number: its every
  script fails before it writes anything. A bare number there (written by a client of the layout before,
  whose permits may be held in slots this version does not read) makes this version refuse with a
  RedlockError that says what to do. The scripts of the layout before run here verbatim
  (``tests/_scripts_v1.py``).
"""

from __future__ import annotations

import pytest
import redis

from redlock_async import RedlockError

from . import _scripts_v1 as v1
from .conftest import Cluster, MakeRedlock, keys_everywhere

V1_BASE = b"redlock:\x00semaphore\x00pool"
V1_LIMIT = V1_BASE + b"\x00limit"


def v1_acquire(node: object, token: bytes, slot: int, limit: int) -> object:
    """The layout before's ACQUIRE_PERMIT of *slot* (a semaphore's first try, and every try without the queue)."""
    keys = (V1_BASE + b"\x00%d" % slot, V1_LIMIT)
    return node.command("EVAL", v1.ACQUIRE_PERMIT, 2, *keys, token, 10_000, limit, V1_BASE + b"\x00")  # type: ignore[attr-defined]


def v1_enter(node: object, token: bytes, limit: int) -> object:
    """The layout before's PERMIT_ENTER (a semaphore's wait in line)."""
    keys = (V1_BASE, V1_BASE + b"\x00queue", V1_BASE + b"\x00waits", V1_LIMIT)
    return node.command("EVAL", v1.PERMIT_ENTER, 4, *keys, token, 10_000, 1, 5_000, limit, V1_BASE + b"\x00", -1)  # type: ignore[attr-defined]


@pytest.mark.parametrize("queue", [True, False])
async def test_a_semaphore_in_use_by_the_layout_before_is_refused_in_words(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    for i in range(len(cluster)):
        assert v1_acquire(cluster[i], b"1:old", 0, 1) == 1  # an old client holds the only permit
    before = keys_everywhere(cluster)
    redlock = await make_redlock(queue=queue, retry_delay=0.05)
    sem = redlock.semaphore("pool", limit=1)
    for timeout in (None, 2.0):
        with pytest.raises(RedlockError, match=r"'pool' is in use by clients of redlock-async before the one-slot"):
            await (sem.acquire(blocking=False) if timeout is None else sem.acquire(timeout=timeout))
        assert not sem.held
    assert keys_everywhere(cluster) == before  # nothing written beside the old permit
    async with redlock.lock("pool"):  # a lock of the same name is another thing (as it was)
        pass


@pytest.mark.parametrize("queue", [True, False])
async def test_a_client_of_the_layout_before_cannot_take_a_permit_beside_ours(
    cluster: Cluster, make_redlock: MakeRedlock, queue: bool
) -> None:
    redlock = await make_redlock(queue=queue)
    async with redlock.semaphore("pool", limit=1):
        written = keys_everywhere(cluster)
        for i in range(len(cluster)):
            assert cluster[i].command("GET", V1_LIMIT) == b"1 layout-2"
            with pytest.raises(redis.ResponseError, match=r"attempt to compare"):
                v1_acquire(cluster[i], b"1:old", 0, 1)
            with pytest.raises(redis.ResponseError, match=r"bad argument"):
                v1_enter(cluster[i], b"1:old", 1)
        assert keys_everywhere(cluster) == written  # the old scripts failed before writing anything
