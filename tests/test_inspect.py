"""``Redlock.inspect``: who holds a lock, read from the nodes without writing anything; owner labels.

Inspection must never change what a locking client decides, so it is checked against the
servers' own books (INFO commandstats, DBSIZE, KEYS): no write, no script, no PUBLISH, no
restart-quarantine marker, even from a Redlock that never connected and on a node that came
back empty. The verdicts follow the majority rule; a token never shows, only its digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import pytest

from redlock_async import LockLost, Redlock
from redlock_async.inspection import LockInfo, NodeInfo

from .conftest import Cluster, MakeRedlock, assert_no_library_tasks, client_connections, mark_in_service

MARKER = b"redlock:"
"""The restart quarantine's marker key (the key prefix itself)."""

READS = frozenset(
    {
        "get",
        "mget",
        "pttl",
        "time",
        "smembers",
        "hgetall",
        "info",
        "dbsize",
        "keys",
        "exists",
        "client|setname",
        "client|list",
        "client|setinfo",
        "client|id",
        "select",
        "auth",
        "hello",
        "ping",
        "command",
        "command|docs",
    }
)
"""Commands that read or only shape the connection: the only ones inspection (or this test) may send."""

WRITES = ("set", "del", "unlink", "eval", "evalsha", "script|load", "script", "publish", "pexpire", "incr", "fcall")


def command_calls(cluster: Cluster) -> list[dict[str, int]]:
    """Per node, the calls so far of every command (INFO commandstats: ``cmdstat_<name>``)."""
    counts = []
    for i in range(len(cluster)):
        stats = cluster[i].command("INFO", "commandstats")
        assert isinstance(stats, dict)
        counts.append({name.removeprefix("cmdstat_"): int(entry["calls"]) for name, entry in stats.items()})
    return counts


def keyspace(cluster: Cluster) -> list[tuple[int, list[bytes]]]:
    """Per node: DBSIZE and every key."""
    out = []
    for i in range(len(cluster)):
        size = cluster[i].command("DBSIZE")
        keys = cluster[i].command("KEYS", "*")
        assert isinstance(size, int)
        assert isinstance(keys, list)
        out.append((size, sorted(keys)))
    return out


def assert_only_reads(before: list[dict[str, int]], after: list[dict[str, int]]) -> None:
    """No write command was called between the two counts, and every command that was called reads."""
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        grown = {name for name, calls in new.items() if calls != old.get(name, 0)}
        assert grown <= READS, f"node {i}: commands other than reads were called: {sorted(grown - READS)}"
        assert {w: new.get(w, 0) for w in WRITES} == {w: old.get(w, 0) for w in WRITES}, f"node {i} was written"


def all_text(info: LockInfo) -> str:
    """Everything an inspection shows: its repr, str and every field of it and of its nodes."""
    parts = [repr(info), str(info)]
    for name in LockInfo.__dataclass_fields__:
        parts.append(repr(getattr(info, name)))
    for node in info.nodes:
        parts.extend(repr(getattr(node, name)) for name in NodeInfo.__dataclass_fields__)
    return "\n".join(parts)


def default_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@contextlib.asynccontextmanager
async def reader_of(urls: list[str], **settings: Any) -> AsyncIterator[Redlock]:
    """A Redlock that is never connected (``async with Redlock`` would connect): it only inspects."""
    reader = Redlock(urls, **settings)
    try:
        yield reader
    finally:
        await reader.aclose()


async def answered(reader: Redlock, name: str, index: int, within: float = 3.0) -> LockInfo:
    """Inspect *name* until node *index* (restarted) answers: the reader reconnects after its delay."""
    deadline = time.monotonic() + within
    while (info := await reader.inspect(name)).nodes[index].state == "unreachable":
        assert time.monotonic() < deadline, info
        await asyncio.sleep(0.02)
    return info


# -- inspection writes nothing ------------------------------------------------------------------------------


async def test_inspect_writes_nothing_even_from_a_redlock_that_never_connected(cluster: Cluster) -> None:
    """On nodes no client ever marked: inspection adds no marker, no key, no write, no script."""
    cluster.flush()  # (the fixture marks them in service)
    assert keyspace(cluster) == [(0, [])] * len(cluster)
    before = command_calls(cluster)
    async with reader_of(cluster.urls) as reader:  # never connected: inspect is its first use
        for name in ("orders:42", b"orders:42", "never-held", "orders:42"):
            info = await reader.inspect(name)
            assert info.state == "free", info
        await asyncio.gather(*(reader.inspect(f"many:{i}") for i in range(10)))
    assert keyspace(cluster) == [(0, [])] * len(cluster)  # not even the quarantine marker
    assert_only_reads(before, command_calls(cluster))
    assert_no_library_tasks()


async def test_inspect_of_held_and_free_locks_writes_nothing(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    # Its ttl is the locks': the nodes are marked in service under its quarantine (ttl + drift), which a
    # reader judging with a longer one would not trust on servers up for less than that (a fresh client
    # with 30 s leases would sit them out too: test_quarantine.py).
    holder = await make_redlock(fencing=True, ttl=30.0)
    single = holder.lock("orders:42", ttl=30.0, owner="worker-7")
    many = holder.lock_many(["a", "b", "c"], ttl=30.0, owner="batcher")
    assert await single.acquire(blocking=False)
    assert await many.acquire(blocking=False)
    try:
        space = keyspace(cluster)
        assert all(MARKER in keys for _, keys in space)  # the holder, a locking client, marked the nodes
        before = command_calls(cluster)
        async with reader_of(cluster.urls) as reader:
            for _ in range(3):
                for name in ("orders:42", "a", "b", "c", "free-one"):
                    await reader.inspect(name)
            assert (await reader.inspect("orders:42")).state == "held"
        # The holder's own Redlock inspects through its read-only connections too.
        assert (await holder.inspect("b")).owner == "batcher"
        assert_only_reads(before, command_calls(cluster))
        assert keyspace(cluster) == space
    finally:
        await single.release()
        await many.release()


async def test_inspect_gives_a_node_restarted_empty_no_marker(faulty: Cluster) -> None:
    """A marker written by inspection would vouch for the node to clients with longer leases."""
    async with Redlock(faulty.urls) as holder, holder.lock("watched", ttl=30.0, owner="keeper"):
        faulty[2].restart(keep_data=False)
        assert faulty[2].command("DBSIZE") == 0
        before = command_calls(faulty)
        async with reader_of(faulty.urls) as reader:
            for _ in range(3):
                info = await reader.inspect("watched")
                assert info.state == "held", info
                assert info.owner == "keeper"
                # It may have lost the holder's key: it confirms nothing and rules out nothing.
                assert [node.state for node in info.nodes] == ["held", "held", "quarantined", "held", "held"]
        assert faulty[2].command("GET", MARKER) is None
        assert faulty[2].command("DBSIZE") == 0
        assert_only_reads(before, command_calls(faulty))


async def test_inspect_connections_are_opened_once_and_closed_with_the_redlock(cluster: Cluster) -> None:
    base = client_connections(cluster[0])
    reader = Redlock(cluster.urls)
    assert client_connections(cluster[0]) == base  # nothing opened until the first inspect
    for _ in range(5):
        await reader.inspect("x")
    assert client_connections(cluster[0]) == base + 1  # one read-only connection, kept and reused
    await reader.aclose()
    deadline = time.monotonic() + 2.0
    while client_connections(cluster[0]) != base and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert client_connections(cluster[0]) == base
    with pytest.raises(Exception, match="closed"):
        await reader.inspect("x")


# -- verdicts -----------------------------------------------------------------------------------------------


async def test_free_lock(redlock: Redlock) -> None:
    info = await redlock.inspect("orders:42")
    assert info.state == "free"
    assert (info.owner, info.ttl, info.fencing_counter, info.holder) == (None, None, None, None)
    assert [node.state for node in info.nodes] == ["free"] * 5
    assert [node.address for node in info.nodes] == list(redlock.nodes)
    assert all(node.owner is None and node.holder is None and node.ttl is None for node in info.nodes)
    assert info.quorum == 3


async def test_held_fenced_lock_shows_owner_ttl_and_its_fencing_token(make_redlock: MakeRedlock) -> None:
    holder = await make_redlock(fencing=True)
    reader = await make_redlock()
    for round_ in range(3):  # the counter grows with each grant, and inspection follows it
        lock = holder.lock("orders:42", ttl=10.0, owner="worker-7")
        async with lock:
            info = await reader.inspect("orders:42")
            assert info.state == "held", info
            assert info.owner == "worker-7"
            assert info.ttl is not None
            assert lock.validity - 0.05 <= info.ttl <= 10.0
            assert info.ttl > 9.0
            assert info.fencing_counter == lock.fencing_token == round_ + 1
            assert info.holder is not None
            assert [node.state for node in info.nodes] == ["held"] * 5
            assert {node.holder for node in info.nodes} == {info.holder}
            assert {node.owner for node in info.nodes} == {"worker-7"}
            assert {node.fencing_counter for node in info.nodes} == {lock.fencing_token}
        released = await reader.inspect("orders:42")
        assert released.state == "free"
        assert released.owner is None
        assert released.holder is None
        assert released.ttl is None
        assert released.fencing_counter == round_ + 1  # the counter stays: the largest that answered


async def test_unfenced_lock_has_no_fencing_counter(make_redlock: MakeRedlock) -> None:
    holder = await make_redlock()
    async with holder.lock("plain", ttl=5.0) as lock:
        info = await holder.inspect("plain")
        assert info.state == "held"
        assert info.fencing_counter is None
        assert info.owner == lock.owner == default_label()


@pytest.mark.serial
async def test_unknown_when_the_silent_nodes_could_make_a_majority(faulty: Cluster) -> None:
    for i in (0, 1):  # a holder on 2 of 5, 2 nodes down: 2 + 2 could be a majority of it
        faulty[i].command("SET", "redlock:split", "c29tZXRva2Vu~someone", "PX", 60_000)
    faulty[3].kill()
    faulty[4].kill()
    # Without restart quarantine: node 3 restarted below counts at once (test_quarantine_verdicts: with it).
    async with reader_of(faulty.urls, connect_timeout=0.5, restart_quarantine=0) as reader:
        started = time.monotonic()
        info = await reader.inspect("split")
        assert time.monotonic() - started < 2.0  # two connect timeouts at most
        assert info.state == "unknown", info
        assert (info.owner, info.ttl, info.holder) == (None, None, None)
        assert [node.state for node in info.nodes] == ["held", "held", "free", "unreachable", "unreachable"]
        assert info.nodes[0].owner == "someone"
        assert all(node.error for node in info.nodes[3:])
        assert all(not node.error for node in info.nodes[:3])

        # One node down and the holder on one node: 1 + 1 cannot make a majority: free.
        faulty[3].restart()
        faulty[1].command("DEL", "redlock:split")
        info = await answered(reader, "split", 3)
        assert info.state == "free", info
        assert [node.state for node in info.nodes] == ["held", "free", "free", "free", "unreachable"]

        # Held on 3 of 5 with a node down: held, whatever the silent node says.
        for i in (1, 2):
            faulty[i].command("SET", "redlock:split", "c29tZXRva2Vu~someone", "PX", 60_000)
        info = await reader.inspect("split")
        assert info.state == "held", info
        assert info.owner == "someone"


async def test_free_with_one_node_down_and_no_holder(faulty: Cluster) -> None:
    for i in range(4):
        mark_in_service(faulty[i])  # a cluster in service (with none, the node down might hold anything)
    faulty[4].kill()
    async with reader_of(faulty.urls, connect_timeout=0.5) as reader:
        info = await reader.inspect("nothing")
        assert info.state == "free", info
        assert [node.state for node in info.nodes] == ["free"] * 4 + ["unreachable"]
        assert info.nodes[4].error
        # The inspector's connection comes back with the node (after its reconnect delay), which
        # restarted: in quarantine it rules nothing out, but no holder can make a majority with it.
        faulty[4].restart()
        info = await answered(reader, "nothing", 4)
        assert info.state == "free", info
        assert [node.state for node in info.nodes] == ["free"] * 4 + ["quarantined"]


async def test_two_holders_of_two_nodes_each_make_no_majority(faulty: Cluster) -> None:
    for i, value in ((0, "dG9rZW4x~one"), (1, "dG9rZW4x~one"), (2, "dG9rZW4y~two"), (3, "dG9rZW4y~two")):
        faulty[i].command("SET", "redlock:contested", value, "PX", 60_000)
    async with reader_of(faulty.urls, connect_timeout=0.5) as reader:
        info = await reader.inspect("contested")
        assert info.state == "free", info  # neither can reach 3 of 5: node 4 is free, and answered
        assert len({node.holder for node in info.nodes[:4]}) == 2
        faulty[4].kill()
        info = await reader.inspect("contested")
        assert info.state == "unknown", info  # node 4 could be either's third


async def test_keys_of_other_writers_are_judged_as_they_are(faulty: Cluster) -> None:
    """A value without owner label (an older client) holds but names no one; a key without
    expiry has no ttl; the shortest ttl of the majority holder's keys is the lock's."""
    for i in range(3):
        faulty[i].command("SET", "redlock:old", "cGxhaW50b2tlbg")
        faulty[i].command("SET", "redlock:timed", "dG9r~t", "PX", 30_000 - 10_000 * i)
    async with reader_of(faulty.urls) as reader:
        old = await reader.inspect("old")
        assert (old.state, old.owner, old.ttl) == ("held", None, None)
        assert old.holder is not None
        timed = await reader.inspect("timed")
        assert timed.state == "held"
        assert timed.owner == "t"
        assert timed.ttl is not None
        assert 9.0 < timed.ttl <= 10.0
        assert [node.ttl is not None and node.ttl > 9.0 for node in timed.nodes[:3]] == [True] * 3
        # The counter shown is the holder's nodes' (5), not a larger one of a node that does not hold (9),
        # once the holder's fence names it on a majority (the fencer key, as FENCE writes it).
        for i, counter in enumerate((5, 5, 5, 9, 2)):
            faulty[i].command("SET", "redlock-fence:timed", counter)
        timed = await reader.inspect("timed")
        assert timed.fencing_counter is None  # no fence named this holder: the counters are an earlier one's
        for i in range(3):
            faulty[i].command("SET", b"redlock-fence:timed\x00by", hashlib.sha1(b"dG9r~t").hexdigest())
        timed = await reader.inspect("timed")
        assert timed.fencing_counter == 5
        assert [node.fencing_counter for node in timed.nodes] == [5, 5, 5, 9, 2]
        # Free: the largest that answered.
        assert (await reader.inspect("old")).fencing_counter is None
        for i in range(3):
            faulty[i].command("DEL", "redlock:timed")
        assert (await reader.inspect("timed")).fencing_counter == 9


async def test_the_token_never_shows(make_redlock: MakeRedlock) -> None:
    holder = await make_redlock(fencing=True)
    async with holder.lock("secret", owner="worker-7") as lock, holder.lock_many(["s1", "s2"], owner="pair") as pair:
        for held, names in ((lock, ["secret"]), (pair, ["s1", "s2"])):
            assert held.token is not None
            random_part = held.token.partition("~")[0]
            assert len(random_part) >= 16
            for name in names:
                info = await holder.inspect(name)
                assert info.state == "held"
                text = all_text(info)
                assert random_part not in text
                assert held.token not in text
                assert info.holder is not None
                assert info.holder not in held.token


# -- owner labels -------------------------------------------------------------------------------------------


async def test_default_owner_is_hostname_and_pid(redlock: Redlock) -> None:
    lock = redlock.lock("defaulted")
    assert lock.owner == default_label()
    async with lock:
        assert lock.token is not None
        assert lock.token.endswith("~" + default_label())
        assert (await redlock.inspect("defaulted")).owner == default_label()


@pytest.mark.parametrize("owner", ["worker-7", "10.0.0.5:8000", "ключ ✓ 7", "a~b~c", "x" * 256, "é" * 128])
async def test_custom_owner_is_shown_as_given(redlock: Redlock, owner: str) -> None:
    lock = redlock.lock("labelled", owner=owner)
    assert lock.owner == owner
    async with lock:
        info = await redlock.inspect("labelled")
        assert info.owner == owner
        assert {node.owner for node in info.nodes} == {owner}


BAD_OWNERS: list[tuple[Any, type[Exception], str]] = [
    ("", ValueError, "owner"),
    ("\n", ValueError, "owner"),
    ("worker\n7", ValueError, "owner"),
    ("tab\there", ValueError, "owner"),
    ("\x00", ValueError, "owner"),
    ("x" * 257, ValueError, "257 bytes"),
    ("x" * 300, ValueError, "300 bytes"),
    ("é" * 129, ValueError, "258 bytes"),  # 129 characters, but 258 bytes
    ("\ud800", ValueError, "owner"),
    ("ok\udcffok", ValueError, "owner"),
    (7, TypeError, "owner must be a str"),
    (b"worker-7", TypeError, "owner must be a str"),
    (["w"], TypeError, "owner must be a str"),
]


@pytest.mark.parametrize(("owner", "error", "match"), BAD_OWNERS)
async def test_bad_owner_labels_are_refused_where_the_lock_is_made(
    redlock: Redlock, owner: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        redlock.lock("r", owner=owner)
    with pytest.raises(error, match=match):
        redlock.lock_many(["r", "s"], owner=owner)
    with pytest.raises(error, match=match):
        redlock.semaphore("r", limit=2, owner=owner)
    with pytest.raises(error, match=match):
        redlock.election("r", owner=owner)


async def test_lock_many_and_semaphore_take_an_owner(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(fencing=True)
    many = redlock.lock_many(["m:a", "m:b", "m:c"], owner="batch-9")
    assert many.owner == "batch-9"
    async with many:
        tokens = many.fencing_tokens
        assert tokens is not None
        holders = set()
        for name in ("m:a", "m:b", "m:c"):
            info = await redlock.inspect(name)
            assert info.state == "held", info
            assert info.owner == "batch-9"
            assert info.fencing_counter == tokens[name]
            holders.add(info.holder)
        assert len(holders) == 1  # one acquisition, one token, on every name
    semaphore = redlock.semaphore("pool", limit=3, owner="sem-holder")
    assert semaphore.owner == "sem-holder"
    async with semaphore:
        values = [
            cluster[i].command("GET", key)
            for i in range(len(cluster))
            for key in cluster[i].command("KEYS", "*semaphore*")  # type: ignore[attr-defined]
            if not key.endswith(b"limit")
        ]
        assert len(values) >= 3, values  # one permit, on a majority at least
        assert all(isinstance(v, bytes) and v.endswith(b"~sem-holder") for v in values), values
    default = redlock.semaphore("pool", limit=3)
    assert default.owner == default_label()


async def test_same_owner_label_does_not_make_holders_equal(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Release and extend compare the whole token: a stale holder with the same label can touch
    neither the new holder's keys nor its lease, and inspection tells the two apart by digest."""
    first = await make_redlock(fencing=True)
    second = await make_redlock(fencing=True)
    reader = await make_redlock()
    stale = first.lock("shared", ttl=10.0, owner="same", auto_extend=False)
    fresh = second.lock("shared", ttl=10.0, owner="same", auto_extend=False)
    assert await stale.acquire(blocking=False)
    assert not await fresh.acquire(blocking=False)  # the same label is not the same holder
    seen_stale = await reader.inspect("shared")
    assert (seen_stale.owner, seen_stale.state) == ("same", "held")

    for i in range(len(cluster)):  # the stale holder's keys vanish (as if expired on every node)...
        cluster[i].command("DEL", "redlock:shared")
    assert await fresh.acquire(blocking=False)  # ...and the fresh one, of the same label, takes the lock
    assert stale.held  # the stale one does not know yet
    seen_fresh = await reader.inspect("shared")
    assert (seen_fresh.owner, seen_fresh.state) == ("same", "held")
    assert seen_fresh.holder != seen_stale.holder
    assert seen_fresh.fencing_counter == fresh.fencing_token == 2

    assert fresh.token is not None
    before = [cluster[i].command("PTTL", "redlock:shared") for i in range(len(cluster))]
    with pytest.raises(LockLost):
        await stale.extend(ttl=60.0)  # refused: not its token, same label or not
    after = [cluster[i].command("PTTL", "redlock:shared") for i in range(len(cluster))]
    assert all(isinstance(b, int) and isinstance(a, int) and 0 < a <= b for a, b in zip(after, before, strict=True))
    assert [cluster[i].command("GET", "redlock:shared") for i in range(len(cluster))] == [fresh.token.encode()] * 5

    # Another stale holder of the same label releases: the fresh holder's keys stay.
    await fresh.release()
    again = first.lock("shared", ttl=10.0, owner="same", auto_extend=False)
    assert await again.acquire(blocking=False)
    for i in range(len(cluster)):
        cluster[i].command("DEL", "redlock:shared")
    assert await fresh.acquire(blocking=False)
    assert fresh.token is not None
    await again.release()
    assert [cluster[i].command("GET", "redlock:shared") for i in range(len(cluster))] == [fresh.token.encode()] * 5
    info = await reader.inspect("shared")
    assert info.state == "held"
    assert info.owner == "same"
    assert info.holder not in (seen_stale.holder, seen_fresh.holder)  # a new acquisition, a new digest
    await fresh.extend()
    assert fresh.held
    await fresh.release()
    assert (await reader.inspect("shared")).state == "free"


async def test_inspect_refuses_a_bad_name(redlock: Redlock) -> None:
    with pytest.raises(TypeError, match="lock name must be str or bytes"):
        await redlock.inspect(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await redlock.inspect(["a", "b"])  # type: ignore[arg-type]


async def test_fencing_counter_is_the_holders_token_even_with_one_node_ahead(faulty: Cluster) -> None:
    """A fence raises the counter only where it lands: an acquisition granted by a majority whose
    fence then reached node 4 alone (the others' connections dropped) failed, yet left node 4's
    counter ahead of every counted token; repeated, it can be far ahead. Simulated here by setting
    node 4's counter. The next holder's token comes from the majority that granted it (1); node 4,
    answering late, holds the same key and keeps its 100: inspection says 100."""
    faulty[4].command("SET", "redlock-fence:fenced", "100")
    async with Redlock(faulty.urls, fencing=True) as holder:
        lock = holder.lock("fenced", ttl=10.0)
        faulty[4].pause()
        try:
            assert await lock.acquire(blocking=False)  # granted by nodes 0-3, node 4 still silent
        finally:
            faulty[4].resume()
        assert lock.fencing_token == 1
        async with asyncio.timeout(3):  # node 4 runs the queued acquire late: it holds the key too
            while faulty[4].command("EXISTS", "redlock:fenced") != 1:
                await asyncio.sleep(0.01)
        info = await holder.inspect("fenced")
        assert info.state == "held"
        assert [node.holder for node in info.nodes] == [info.holder] * 5  # one holder, on every node
        assert [node.fencing_counter for node in info.nodes] == [1, 1, 1, 1, 100]
        assert info.fencing_counter == lock.fencing_token  # fails: 100
        await lock.release()


def test_a_forked_child_is_another_default_owner() -> None:
    """The label is worked out once per process: a forked child (a pre-fork server's worker) gets its own pid."""
    from redlock_async._core._names import default_owner

    parent = default_owner()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork() of a process with threads
        pid = os.fork()
    if pid == 0:  # the child: say its label, and leave at once
        os.write(write, default_owner())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    assert parent.endswith(b":%d" % os.getpid())
    assert child.endswith(b":%d" % pid), child
