"""Several OS processes contend for one lock on 3 voters while two of them fail over (issue 39 item 4):
a Cluster voter (a shard with a replica), a Sentinel voter (a master, a replica, 3 Sentinels) and a
standalone node. Every critical section of every process is checked as one :class:`History`.

The faults are the hazard itself: both replicas stop (SIGSTOP, their links cut) so that the next holder's
key reaches the masters only; that holder sits in its section (tests/_failover_contender.py holds a
section begun after the hold mark for as long as the hold file exists) while both masters die (SIGKILL)
and their replicas, without its key, are promoted (``CLUSTER FAILOVER TAKEOVER``, ``SENTINEL FAILOVER``).
The promoted voters and the standalone one are a majority without the holder's key: only the failover
quarantine keeps a second holder out. With it, 0 overlaps, and locks are granted again once the
quarantine is over; with ``restart_quarantine=0`` (which turns the shard probe off too) the same run
finds an overlap.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from redlock_async.testing import History, LocalCluster, LocalNodes, LocalSentinels
from redlock_async.testing._history import Section
from tests.conftest import mark_in_service
from tests.test_cluster_voter import mark_shards

pytestmark = pytest.mark.slow

CHILD = str(Path(__file__).with_name("_failover_contender.py"))
PROCESSES = 3
KEY = "redlock:failover"
TTL = 10.0  # the contenders' (tests/_failover_contender.py)
BESIDE = 3.0
"""Seconds the first holder sits on after the failovers: time for a second holder to come in, if it can."""


def _wait(what: str, ready: Any, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = ready()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.02)


def _free_for_a_while(master: Any) -> bool:
    """No key of the lock on *master*, for 0.3 s (the attempts under way before the quiet mark have ended)."""
    if master.command("EXISTS", KEY):
        return False
    time.sleep(0.3)
    return not master.command("EXISTS", KEY)


def _freshly_held(master: Any) -> object:
    """The key's value when a section begun after the hold mark holds the lock with most of a lease ahead
    (the value stays for 0.3 s, as no section begun before the mark does, and its time to live is above
    three quarters of the ttl: acquired or extended just now), else None."""
    first = master.command("GET", KEY)
    if first is None:
        return None
    time.sleep(0.3)
    pttl: Any = master.command("PTTL", KEY)
    fresh = int(pttl) > TTL * 750
    return first if fresh and master.command("GET", KEY) == first else None


def _promote_shard(cluster: LocalCluster, replica: Any) -> None:
    """``CLUSTER FAILOVER TAKEOVER`` on *replica*, or its own failover if it promoted itself first (its master
    is dead: after cluster-node-timeout it does)."""
    try:
        cluster.failover(0, replica=replica)
    except redis.ResponseError:
        info: Any = replica.command("INFO", "replication")
        if info.get("role") != "master":
            raise
        cluster.wait_ready()


def _promote_sentinel_replica(group: LocalSentinels, old: Any) -> None:
    """``SENTINEL FAILOVER``, asked again while the Sentinels find no replica good yet (it was stopped a
    moment ago), and waited for if their own failover began first (the master is dead)."""
    deadline = time.monotonic() + 30.0
    while True:
        try:
            group.failover()
            return
        except RuntimeError as exc:
            if "INPROG" in str(exc):
                group.await_failover(old)
                return
            if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def _run(tmp: Path, quarantine: str, after: float) -> tuple[History, float]:
    """The contenders' history, and the monotonic time the failovers were done; the contenders stop *after*
    seconds after that."""
    with LocalCluster(1, 1) as cluster, LocalSentinels(1, 3, down_after=5.0) as group, LocalNodes(1) as plain:
        mark_shards(cluster)
        mark_in_service(group.master())
        mark_in_service(plain.nodes[0])
        urls = [cluster.url, group.url, *plain.urls]
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable, CHILD, str(tmp), quarantine, *urls, stdout=asyncio.subprocess.PIPE
            )
            for _ in range(PROCESSES)
        ]
        outputs = asyncio.gather(*(child.communicate() for child in children))
        try:
            ready = lambda: len(list(tmp.glob("ready.*"))) == PROCESSES  # noqa: E731
            await asyncio.to_thread(_wait, "every contender connected", ready, 60.0)
            await asyncio.sleep(1.0)  # contending before any fault
            masters = [cluster.master_of(0), group.master()]
            replicas = [cluster.replicas_of(0)[0], next(node for node in group.servers if node is not masters[1])]
            # The lock free for a moment (every attempt under way ended, its release replicated): the replicas
            # then hold no key of it, and the next holder's key reaches the masters only.
            (tmp / "quiet").touch()
            await asyncio.to_thread(_wait, "the lock free", lambda: _free_for_a_while(masters[0]))
            for replica in replicas:
                replica.pause()
            for master in masters:
                master.command("CLIENT", "KILL", "TYPE", "replica")
            (tmp / "hold").write_text(repr(time.monotonic()))  # sections from now on last while the file exists
            (tmp / "quiet").unlink()
            held = await asyncio.to_thread(_wait, "a section after the hold mark", lambda: _freshly_held(masters[0]))
            for master in masters:
                master.kill()
            for replica in replicas:
                replica.resume()
            await asyncio.gather(
                asyncio.to_thread(_promote_shard, cluster, replicas[0]),
                asyncio.to_thread(_promote_sentinel_replica, group, masters[1]),
            )
            failed_over = time.monotonic()
            for node in (cluster.master_of(0), group.master()):
                assert node.command("GET", KEY) != held, f"{node!r} was promoted with the holder's key"
            await asyncio.sleep(BESIDE)
            (tmp / "hold").unlink()
            await asyncio.sleep(after - BESIDE)
        finally:
            (tmp / "stop").touch()
        async with asyncio.timeout(60):
            results = await outputs
    history = History()
    for (out, _), child in zip(results, children, strict=True):
        assert child.returncode == 0, f"a contender exited with {child.returncode}"
        for line in out.decode().splitlines():
            client, token, fencing, start, end = json.loads(line)
            history.sections.append(Section(client, token, fencing, start, end))
    return history, failed_over


async def test_processes_contending_through_cluster_and_sentinel_failovers_never_overlap(tmp_path: Path) -> None:
    # Long enough after the failovers for the promoted voters' quarantine (a ttl plus drift) to end.
    history, failed_over = await _run(tmp_path, "none", after=TTL + 5.0)
    assert history.overlaps() == []
    assert len({section.client.split(".")[0] for section in history.sections}) == PROCESSES
    assert any(section.end < failed_over for section in history.sections), "no lock before the failovers"
    # Locks were granted again after the failovers (once the promoted voters' quarantine was over).
    assert any(section.start > failed_over for section in history.sections), "no lock after the failovers"
    history.check()


async def test_without_the_quarantine_the_same_failovers_let_a_second_holder_in(tmp_path: Path) -> None:
    history, _ = await _run(tmp_path, "0", after=BESIDE + 0.5)
    assert history.overlaps(), "no overlap: the run did not make the hazard it tests"
