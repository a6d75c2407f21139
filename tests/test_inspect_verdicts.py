"""Verdicts users read from inspection (``Redlock.inspect``, ``Election.leader`` / ``observe``, ``redlock
status``) in the windows where they could be wrong: during a fenced grant (between its SET and its
fence), beside a node in restart quarantine, with every node down; and for every primitive that uses a
name (a semaphore's permits, lock_many).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time

from redlock_async import Redlock
from redlock_async._core._names import rw_writer_key
from redlock_async.cli import EXIT_HELD, EXIT_UNKNOWN
from redlock_async.inspection import LockInfo
from redlock_async.testing import LocalNodes

from .conftest import Cluster, MakeRedlock, dead_urls

PY = sys.executable
SLOW = 2.0
"""retry_delay of the observers: their own pace of looks is 2 s, so a faster sight was pushed."""


async def redlock_status(urls: list[str], name: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "status", name, "--nodes", ",".join(urls),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    assert not err, err.decode()
    return process.returncode, out.decode()


# -- terms: never an earlier leader's ---------------------------------------------------------------------


async def test_observe_started_with_the_campaign_yields_the_leaders_own_term(make_redlock: MakeRedlock) -> None:
    """Issue 26.1: an observe() started in the same loop turn as campaign() looked between the grant's
    SET and its fence, and yielded the new leader with the previous term: (2, 1), (3, 2), ... (7, 6),
    from the same Redlock and from another."""
    leading = await make_redlock()
    other = await make_redlock()
    for watching, name in ((leading, "same"), (other, "other")):
        pairs = []
        for _ in range(7):
            observing = watching.election(name).observe()
            first = asyncio.ensure_future(anext(observing))  # its first look goes out with the grant
            try:
                async with leading.election(name, owner="L").campaign() as term:
                    async with asyncio.timeout(2):
                        info = await first
                    pairs.append((term, info.fencing_counter))
                    assert (info.state, info.owner) == ("held", "L")
            finally:
                await observing.aclose()
        assert pairs == [(term, term) for term, _ in pairs], (name, pairs)
        assert [term for term, _ in pairs] == list(range(1, 8))


async def test_leader_asked_during_the_grant_shows_the_leaders_own_term(make_redlock: MakeRedlock) -> None:
    leading = await make_redlock()
    other = await make_redlock()
    await other.inspect("warm")  # its inspector's connections are open: its looks land during the grant
    held = 0
    for _ in range(10):
        asked = asyncio.ensure_future(other.election("asked").leader())
        async with leading.election("asked").campaign() as term:
            info = await asked
            if info.state == "held":
                held += 1
                assert info.fencing_counter == term, (info, term)
            assert (await other.election("asked").leader()).fencing_counter == term
    assert held  # the looks did land on a grant under way (all 10 of 10 in practice)


async def test_a_holder_between_its_grant_and_its_fence_shows_no_term(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """The window, laid by hand: the next holder's key is set on every node (a grant's first step),
    while every counter is still the earlier holder's (1). Its term is not 1: none is shown until
    its fence names it on a majority of the nodes (FENCE writes counter and fencer in one step)."""
    holder = await make_redlock(fencing=True)
    reader = await make_redlock()
    async with holder.lock("window", owner="first") as lock:
        assert lock.fencing_token == 1
        first = await reader.inspect("window")
        assert first.fencing_counter == 1
    token = b"bmV4dHRva2VuMDAwMDAwMDAwMDAw~second"
    for i in range(len(cluster)):
        cluster[i].command("SET", "redlock:window", token, "PX", 30_000)
    info = await reader.inspect("window")
    assert (info.state, info.owner) == ("held", "second")
    assert info.fencing_counter is None, info  # before: 1, the first holder's token
    assert [node.fencing_counter for node in info.nodes] == [1] * 5
    fencer = hashlib.sha1(token).hexdigest()
    for i in range(2):  # its fence on two nodes: not yet a majority
        cluster[i].command("SET", "redlock-fence:window", 2)
        cluster[i].command("SET", b"redlock-fence:window\x00by", fencer)
        assert (await reader.inspect("window")).fencing_counter is None
    cluster[2].command("SET", "redlock-fence:window", 2)
    cluster[2].command("SET", b"redlock-fence:window\x00by", fencer)
    info = await reader.inspect("window")
    assert info.fencing_counter == 2
    assert [node.fenced_by for node in info.nodes] == [info.holder] * 3 + [first.holder] * 2
    for i in range(len(cluster)):
        cluster[i].command("DEL", "redlock:window")


async def test_observe_hears_an_announcement_said_before_its_subscription(cluster: Cluster) -> None:
    """Its first look finds no leader; a leader announces itself before the observer's subscription
    is in place (its subscriber connections are new): once the nodes confirm the subscription, the
    observer looks again, instead of waiting for its next look (2 s)."""
    async with Redlock(cluster.urls) as leading:
        for i in range(5):
            watching = Redlock(cluster.urls, retry_delay=SLOW)
            try:
                election = watching.election(f"early-{i}")
                assert (await election.leader()).state == "free"  # the reader is connected; the listener is not
                observing = election.observe()
                first = asyncio.ensure_future(anext(observing))
                for _ in range(2):
                    await asyncio.sleep(0)  # its first look is out
                try:
                    started = time.monotonic()
                    async with leading.election(f"early-{i}", owner="early").campaign() as term:
                        async with asyncio.timeout(SLOW + 1):
                            info = await first
                        assert time.monotonic() - started < SLOW / 2  # before: 2.0 s every time
                        assert (info.owner, info.fencing_counter) == ("early", term)
                finally:
                    await observing.aclose()
            finally:
                await watching.aclose()


# -- every primitive of a name ------------------------------------------------------------------------------


async def test_inspect_and_status_show_the_permits_of_a_semaphore(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    """Issue 26.2: with every permit of semaphore NAME held, inspect() said free and status exited 0."""
    holders = [await make_redlock() for _ in range(3)]
    permits = [redlock.semaphore("pool", limit=3, ttl=20.0, owner=f"worker-{i}") for i, redlock in enumerate(holders)]
    reader = await make_redlock()
    before = await reader.inspect("pool")
    for permit in permits:
        assert await permit.acquire(blocking=False)
    try:
        info = await reader.inspect("pool")
        assert info.state == "held", info  # before: free
        assert (before.state, before.limit, before.permits) == ("free", None, ())  # no semaphore of that name yet
        assert (info.owner, info.holder, info.fencing_counter) == (None, None, None)  # the lock of that name is free
        assert [node.state for node in info.nodes] == ["free"] * 5
        assert info.limit == 3
        assert [permit.state for permit in info.permits] == ["held"] * 3
        assert sorted(permit.owner or "" for permit in info.permits) == ["worker-0", "worker-1", "worker-2"]
        assert all(permit.ttl is not None and 19.0 < permit.ttl <= 20.0 for permit in info.permits)
        assert len({permit.holder for permit in info.permits}) == 3
        code, out = await redlock_status(cluster.urls, "pool")
        assert code == EXIT_HELD, out
        assert "semaphore pool: 3 of 3 permits held (full)" in out
        for i in range(3):
            assert f"({f'worker-{i}'}) on 5 of 5 nodes" in out, out
        assert "verdict: held (permits of semaphore pool)" in out

        await permits[0].release()
        info = await reader.inspect("pool")
        assert info.state == "held"
        assert sorted(permit.owner or "" for permit in info.permits) == ["worker-1", "worker-2"]
        code, out = await redlock_status(cluster.urls, "pool")
        assert code == EXIT_HELD
        assert "semaphore pool: 2 of 3 permits held\n" in out
    finally:
        for permit in permits:
            if permit.held:
                await permit.release()
    info = await reader.inspect("pool")
    assert (info.state, info.limit, info.permits) == ("free", 3, ())
    code, out = await redlock_status(cluster.urls, "pool")
    assert code == 0, out
    assert "semaphore pool: 0 of 3 permits held" in out


async def test_a_semaphore_and_a_lock_of_one_name_are_both_shown(make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(fencing=True)
    async with redlock.lock("both", owner="locker") as lock, redlock.semaphore("both", limit=2, owner="permit"):
        info = await redlock.inspect("both")
        assert (info.state, info.owner, info.fencing_counter) == ("held", "locker", lock.fencing_token)
        assert (info.limit, [permit.owner for permit in info.permits]) == (2, ["permit"])
        # An election of that name is the lock alone.
        leader = await redlock.election("both").leader()
        assert (leader.state, leader.owner, leader.limit, leader.permits) == ("held", "locker", None, ())


async def test_a_lock_many_holder_shows_as_holding_each_name(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    holder = await make_redlock(fencing=True)
    reader = await make_redlock()
    async with holder.lock_many(["m:a", "m:b", "m:c"], owner="batch") as lock:
        tokens = lock.fencing_tokens
        assert tokens is not None
        assert len(tokens) == 3
        for name, token in tokens.items():
            info = await reader.inspect(name)
            assert (info.state, info.owner, info.fencing_counter) == ("held", "batch", token), info
            code, out = await redlock_status(cluster.urls, str(name))
            assert code == EXIT_HELD, out
            assert "(batch) on 5 of 5 nodes (a majority)" in out
    for name in ("m:a", "m:b", "m:c"):
        assert (await reader.inspect(name)).state == "free"


# -- restart quarantine and nodes down ----------------------------------------------------------------------


async def test_a_node_restarted_empty_beside_a_holder_makes_the_verdict_unknown(faulty: Cluster) -> None:
    """Issue 26.3: A holds 3 of 5 nodes with ~29 s of validity; one of the three restarts empty. A fresh
    client is refused (the node sits out its quarantine), yet inspect(), Election.leader() and redlock
    status said free (exit 0): ``redlock status NAME && job`` would have run beside A."""
    async with Redlock(faulty.urls, ttl=30.0) as holding, Redlock(faulty.urls, ttl=30.0) as connected:
        election = holding.election("boss", owner="A")
        async with election.campaign() as term:
            await connected.inspect("boss")  # its inspector's connections are open before the restart
            for i in (3, 4):
                faulty[i].command("DEL", "redlock:boss")  # A holds nodes 0, 1 and 2
            faulty[2].restart(keep_data=False)

            async with Redlock(faulty.urls, ttl=30.0) as fresh:
                refused = fresh.lock("boss")
                assert not await refused.acquire(blocking=False)  # the premise: node 2 sits out
                assert fresh.statistics().nodes[2].quarantined
            verdicts: list[LockInfo] = []
            async with Redlock(faulty.urls) as reader:  # never inspected: judges node 2 afresh
                verdicts += [await reader.inspect("boss"), await reader.election("boss").leader()]
            async with asyncio.timeout(5):  # the connected inspector reconnects to node 2 (its delay)
                while (info := await connected.inspect("boss")).nodes[2].state == "unreachable":
                    await asyncio.sleep(0.02)
            verdicts += [info, await connected.election("boss").leader()]
            for info in verdicts:
                assert info.state == "unknown", info  # before: free
                assert [node.state for node in info.nodes] == ["held", "held", "quarantined", "free", "free"]
                assert "restart quarantine" in info.nodes[2].error
            code, out = await redlock_status(faulty.urls, "boss")
            assert code == EXIT_UNKNOWN, out  # before: 0
            assert "quarantined (in restart quarantine" in out
            assert "verdict: unknown: only 4 of 5 nodes answered in service (1 more in restart quarantine" in out
            # Held on 4 of 5 beside the quarantined node: held, whatever that node says.
            value = faulty[0].command("GET", "redlock:boss")
            assert isinstance(value, bytes)
            faulty[3].command("SET", "redlock:boss", value, "PX", 20_000)
            info = await connected.election("boss").leader()
            assert (info.state, info.owner, info.fencing_counter) == ("held", "A", term)
            code, _ = await redlock_status(faulty.urls, "boss")
            assert code == EXIT_HELD


async def test_a_permit_beside_a_node_restarted_empty_is_unknown_not_free(faulty: Cluster) -> None:
    """The same for a semaphore: its only permit held on nodes 0-2, node 2 restarts empty."""
    async with Redlock(faulty.urls, ttl=30.0) as holding, holding.semaphore("slots", limit=2, owner="P"):
        keys = faulty[0].command("KEYS", "*slots*")
        assert isinstance(keys, list)
        slot = next(key for key in keys if not key.endswith(b"limit"))
        for i in (3, 4):
            faulty[i].command("DEL", slot)
        faulty[2].restart(keep_data=False)
        async with Redlock(faulty.urls, ttl=30.0) as reader:
            info = await reader.inspect("slots")
        assert info.state == "unknown", info  # before: free
        assert info.limit == 2
        assert [permit.state for permit in info.permits] == ["unknown"]
        assert [node.state for node in info.permits[0].nodes] == ["held", "held", "quarantined", "free", "free"]
        code, out = await redlock_status(faulty.urls, "slots")
        assert code == EXIT_UNKNOWN, out
        assert "a permit may be held: too few nodes answered for it" in out


async def test_every_node_down_is_unknown(faulty: Cluster) -> None:
    async with Redlock(faulty.urls, connect_timeout=0.2) as redlock:
        assert (await redlock.inspect("gone")).state == "free"
        for i in range(len(faulty)):
            faulty[i].kill()
        for info in (await redlock.inspect("gone"), await redlock.election("gone").leader()):
            assert info.state == "unknown", info
            assert [node.state for node in info.nodes] == ["unreachable"] * 5
    code, out = await redlock_status(faulty.urls, "gone")
    assert code == EXIT_UNKNOWN, out
    assert "only 0 of 5 nodes answered" in out


async def test_a_majority_showing_one_live_key_is_held_whatever_the_quarantine_says() -> None:
    """Issue 35.5: a fresh cluster put in service by a client with 2 s leases (the Celery example's) is
    vouched for under its 2 s quarantine only; `redlock status` (default ttl 10 s) sat all 5 nodes out
    and answered unknown (exit 3) for a lock held on all 5. A quarantine can hide a holder, never invent
    one: the same live key on a majority is held."""
    with LocalNodes(5) as nodes:
        async with Redlock(nodes.urls, ttl=2.0) as short, short.lock("job", owner="celery"):
            async with Redlock(nodes.urls) as reader:  # ttl 10 s: a longer quarantine than the marks'
                info = await reader.inspect("job")
            assert [node.state for node in info.nodes] == ["quarantined"] * 5, info  # the premise
            assert (info.state, info.owner) == ("held", "celery"), info  # before: unknown
            code, out = await redlock_status(nodes.urls, "job")
            assert code == EXIT_HELD, out  # before: 3
            assert "(celery) on 5 of 5 nodes (a majority)" in out, out


async def test_status_speaks_of_a_read_write_lock_only_when_its_keys_exist(cluster: Cluster) -> None:
    """Issue 35.5: whenever the verdict was unknown, status printed "read/write lock NAME: a writer,
    0 readers" for a name never used as one."""
    urls = cluster.urls[:2] + dead_urls(3)
    code, out = await redlock_status(urls, "plain")
    assert code == EXIT_UNKNOWN, out
    assert "read/write lock" not in out, out  # before: "read/write lock plain: a writer, 0 readers"
    async with Redlock(urls) as reader:
        info = await reader.inspect("plain")
    assert (info.state, info.writer, info.readers) == ("unknown", None, ()), info
    # A writer's key on the nodes that answer: too few to tell, but it is spoken of.
    cluster[0].command("SET", rw_writer_key("redlock:", "plain"), "dG9rZW4x~W", "PX", 20_000)
    code, out = await redlock_status(urls, "plain")
    assert code == EXIT_UNKNOWN, out
    assert "read/write lock plain: maybe a writer, 0 readers" in out, out
