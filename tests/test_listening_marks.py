"""Release words only where someone may hear them (issue 36, item 2): a release of the grant queue
(``QUEUE_LEAVE``) that frees its key with no one in line publishes its word only on the nodes where the
key's listening mark is; every subscriber (a waiter of either way to wait, an election observer) sets
the mark first, on the connection its next look goes on, and keeps it while it listens. Real nodes, on both
paths of the release: the scripts (``QUEUE_LEAVE``) and, where the server has DELIFEQ and the user may run it,
``QUEUE_LEAVE_NATIVE`` (issue 38 item 7; a user denied only DELIFEQ takes the scripts on the same server)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from redlock_async import Redlock
from redlock_async._core import released_word
from redlock_async._queue import mark_key, queue_keys
from redlock_async._scripts import QUEUE_ENTER, QUEUE_LEAVE, QUEUE_LEAVE_NATIVE, Script
from redlock_async._shared import _handoff

from .conftest import Cluster, MakeRedlock, calls, eventually

SLOW_POLL = 8.0
"""A retry delay so long that only a release word explains a waiter woken: its timer fires after 4 s at
the earliest, and the waits below are longer than that, so a word never sent shows as a wake-up missing
(never as a test that merely took longer)."""


PATHS = ("native", "scripts")
"""The release's two paths: the native variant (the default user, where the server has DELIFEQ) and the
scripts (a user allowed everything but DELIFEQ; any user where the server lacks it)."""


def has_delifeq(cluster: Cluster) -> bool:
    try:
        cluster[0].command("DELIFEQ", "test:native:none", "x")  # (a key no test uses)
    except redis.ResponseError as exc:
        if "unknown command" in str(exc):
            return False
        raise
    return True


def path_urls(cluster: Cluster, path: str) -> list[str]:
    """The cluster's URLs for a client on *path* (skipped: "native" where the server lacks DELIFEQ)."""
    native = has_delifeq(cluster)
    if path == "native":
        if not native:
            pytest.skip("the server has no DELIFEQ: the scripts are its only path (the 'scripts' case)")
        return cluster.urls
    for i in range(len(cluster)):  # everything but DELIFEQ (an older server's ACL refuses the name: all)
        cluster[i].command("ACL", "SETUSER", "scripts", "on", ">pw", "~*", "&*", "+@all", *(["-delifeq"] * native))
    return [url.replace("redis://", "redis://scripts:pw@") for url in cluster.urls]


def marked(cluster: Cluster, key: bytes) -> bool:
    """*key*'s listening mark exists on every node."""
    return all(cluster[i].command("EXISTS", mark_key(key)) == 1 for i in range(len(cluster)))


def unmarked(cluster: Cluster, key: bytes) -> bool:
    """*key*'s listening mark exists on no node."""
    return not any(cluster[i].command("EXISTS", mark_key(key)) for i in range(len(cluster)))


@pytest.mark.parametrize("path", PATHS)
async def test_an_uncontended_pair_publishes_nothing(cluster: Cluster, make_redlock: MakeRedlock, path: str) -> None:
    """It published a word on every node at every release, heard by no one: ~15% of a node's work per pair."""
    redlock = await make_redlock(path_urls(cluster, path))
    lock = redlock.lock("alone")
    async with lock:
        pass
    before, native = calls(cluster, "publish"), calls(cluster, "delifeq")
    deleted = "delifeq" if path == "native" else "del"  # (the scripts' DEL; the native variant's DELIFEQ)
    for _ in range(20):
        async with lock:
            pass
    assert await eventually(lambda: calls(cluster, deleted) >= 20 * len(cluster), 5.0)  # every release ran
    assert calls(cluster, "publish") == before
    if path == "scripts":
        assert calls(cluster, "delifeq") == native
    assert unmarked(cluster, b"redlock:alone")


async def hold(redlock: Redlock, name: str) -> asyncio.Task[None]:
    """A task that holds *name* (acquired before this returns) until it is cancelled; then it releases."""
    held = asyncio.Event()

    async def run() -> None:
        async with redlock.lock(name):
            held.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(run())
    await held.wait()
    return task


async def release(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("path", PATHS)
async def test_a_waiter_without_the_queue_is_woken_by_a_release_of_the_queue(
    cluster: Cluster, make_redlock: MakeRedlock, path: str
) -> None:
    """No one is in line (the waiter does not use the queue): only the mark it set tells the release to speak.
    A release that ignored the mark (no line: no word) leaves the waiter to its retry timer: no wake-up.
    The holder's release on either path."""
    holder = await make_redlock(path_urls(cluster, path))
    waiter = await make_redlock(queue=False, retry_delay=SLOW_POLL)
    holding = await hold(holder, "mixed")
    lock = waiter.lock("mixed")
    acquiring = asyncio.create_task(lock.acquire(timeout=60))
    assert await eventually(lambda: marked(cluster, b"redlock:mixed"), 10.0)
    for i in range(len(cluster)):
        left = cluster[i].command("PTTL", mark_key(b"redlock:mixed"))
        assert isinstance(left, int)
        assert 0 < left <= _handoff.MARK_TTL * 1000
    await asyncio.sleep(0.2)  # its look again after subscribing found the key held: it waits now
    await release(holding)
    assert await acquiring
    assert waiter.statistics().wakeups == 1  # woken by the word, not by its timer
    await lock.release()


async def test_the_mark_is_set_again_while_the_waiter_listens(
    cluster: Cluster, make_redlock: MakeRedlock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark that lives 0.5 s, set again every 0.1 s: a waiter that listened for 2 s is still heard (a mark
    set only once would have run out: the release, finding no one in line and no mark, says nothing)."""
    monkeypatch.setattr(_handoff, "MARK_TTL", 0.5)
    monkeypatch.setattr(_handoff, "MARK_EVERY", 0.1)
    holder = await make_redlock()
    waiter = await make_redlock(queue=False, retry_delay=SLOW_POLL)
    holding = await hold(holder, "kept")
    lock = waiter.lock("kept")
    acquiring = asyncio.create_task(lock.acquire(timeout=60))
    assert await eventually(lambda: marked(cluster, b"redlock:kept"), 10.0)
    await asyncio.sleep(2.0)
    await release(holding)
    assert await acquiring
    assert waiter.statistics().wakeups == 1
    await lock.release()
    # No one listens any more: the mark is not set again, and runs out.
    assert await eventually(lambda: unmarked(cluster, b"redlock:kept"), 5.0)


@pytest.mark.parametrize("script", [QUEUE_LEAVE, QUEUE_LEAVE_NATIVE], ids=["QUEUE_LEAVE", "QUEUE_LEAVE_NATIVE"])
def test_a_release_speaks_only_where_someone_may_listen_and_grants_whatever_the_mark(
    cluster: Cluster, script: Script
) -> None:
    """The script alone, on one node: no line, no mark: no word; a mark: the word; a line with no mark (a waiter
    of a version that sets none): the grant, as always; no mark named (4 keys: redlock break): the word. Both
    variants, the same (the native one where the server has DELIFEQ)."""
    if script is QUEUE_LEAVE_NATIVE and not has_delifeq(cluster):
        pytest.skip("the server has no DELIFEQ: QUEUE_LEAVE_NATIVE is never sent to it")
    node = redis.Redis.from_url(cluster.urls[0])

    def leave(node: redis.Redis, keys: tuple[bytes, ...], token: bytes) -> int:
        reply = node.eval(script.source.decode(), len(keys), *keys, token)
        assert isinstance(reply, int)
        return reply

    key = b"redlock:script"
    keys = (*queue_keys(key, b"redlock-fence:script"), mark_key(key))
    pubsub = node.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe(key)
    assert pubsub.get_message(timeout=5.0) is not None  # the confirmation

    def words() -> list[bytes]:
        node.publish(key, b"end")  # (the last word: every one before it has arrived)
        heard = []
        while (message := pubsub.get_message(timeout=5.0)) is not None and message["data"] != b"end":
            heard.append(bytes(message["data"]))
        return heard

    try:
        for mark, count, said in ((False, 5, []), (True, 5, [released_word(b"t")]), (False, 4, [released_word(b"t")])):
            if mark:
                node.set(mark_key(key), b"1", px=3000)
            assert node.set(key, b"t", nx=True, px=10_000)
            assert leave(node, keys[:count], b"t") == 1
            assert node.get(key) is None
            assert words() == said, (mark, count)
            node.delete(mark_key(key))
        # A line, no mark: the key goes to the first in line (a grant word), not freed.
        assert node.set(key, b"t", nx=True, px=10_000)
        entered = node.eval(QUEUE_ENTER.source.decode(), 4, *keys[:4], b"next", 10_000, 1, 5_000)
        assert isinstance(entered, list)
        assert entered[0] == 0  # in line
        assert leave(node, keys, b"t") == 1
        assert node.get(key) == b"next"
        said = words()
        assert len(said) == 1
        assert said[0].startswith(b"g" + released_word(b"next"))
        assert leave(node, keys, b"next") == 1
        # Another holder's key, and a key that is gone: left alone, 0, no word.
        assert node.set(key, b"other", px=10_000)
        assert leave(node, keys, b"t") == 0
        assert node.get(key) == b"other"
        node.delete(key)
        assert leave(node, keys, b"t") == 0
        assert words() == []
    finally:
        pubsub.close()
        node.delete(*keys)
        node.close()
