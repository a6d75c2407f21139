"""Opening a node's connection: the socket or TLS stream with our protocol from the first byte, and the
handshake (AUTH with an ACL user or a password, SELECT, CLIENT SETNAME, INFO server for the server's
identity, INFO replication and INFO cluster for its role, and whether the user may run the server's native
compare-and-delete), pipelined in one write; and the words for a connection that failed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
from dataclasses import dataclass

from redlock_async._nodes._endpoint import Endpoint
from redlock_async._nodes._outbox import Outbox
from redlock_async._nodes._replicas import ReplicatedOutbox
from redlock_async._nodes._sentinel_voter import master_address
from redlock_async._nodes._wire import Failure, Reply, Wire, describe
from redlock_async._scripts import NATIVE_PROBE

Command = tuple[bytes | str | int, ...]

log = logging.getLogger("redlock_async._node")  # said of a node, as its connection's other words

_SAFE_POLICIES = (b"noeviction", b"")  # "" when the server would not say (INFO refused to an ACL user)
"""``maxmemory-policy`` values that never evict a key: every other one may evict lock keys (``volatile-*``
too: lock keys have a ttl)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """What the handshake learnt of the server: its run_id (None when it would not say), how many
    replicas are connected to it, the eviction policy it runs under when that can evict keys ("" when not), and
    whether it refused INFO ("INFO" then: none of the checks above could be made)."""

    run_id: bytes | None
    replicas: int
    eviction: str
    blind: str = ""
    promoted: bool = False
    """It was a replica since it started (a failover promoted it, or REPLICAOF NO ONE): its data is what it
    had received from its old master, which may lack keys that master granted (``promoted``)."""
    evicted: int | None = None
    """The server's ``evicted_keys`` count (INFO stats), None when it would not say."""
    delifeq: bool = False
    """The server has the native compare-and-delete ``DELIFEQ`` (Valkey 9 and later) and the user may run it
    on the library's keys (an ACL user needs ``+delifeq``): the cheaper scripts and commands may use it."""
    grouped: bool = False
    """A Sentinel group's master or a Cluster's shard primary: it has replicas by design (their promotion is
    judged as a restart), so they are not warned of as a standalone master's are."""


class ConnectError(Exception):
    """The connection or the handshake failed; its text is safe to show (no password, no token)."""


async def open_transport(loop: asyncio.AbstractEventLoop, endpoint: Endpoint, wire: Wire) -> asyncio.Transport:
    """Connect to *endpoint* (TCP, TLS or a unix socket) with *wire* as the protocol from the first byte."""
    host, port, server_hostname = endpoint.host or "localhost", endpoint.port, endpoint.server_hostname
    if endpoint.service is not None:  # a Sentinel voter: its master now, as the Sentinels say
        host, port = await master_address(endpoint)
        server_hostname = host if endpoint.tls is not None else None
    if len(endpoint.seeds) > 1:  # a Cluster voter's own connection: the first seed that answers
        return await _first_seed(loop, endpoint, wire)
    if endpoint.path is not None:
        transport, _ = await loop.create_unix_connection(lambda: wire, endpoint.path)
    else:
        transport, _ = await loop.create_connection(
            lambda: wire, host, port, ssl=endpoint.tls, server_hostname=server_hostname
        )
    # No isinstance check: uvloop's transports are not asyncio.Transport subclasses.
    return transport


async def _first_seed(loop: asyncio.AbstractEventLoop, endpoint: Endpoint, wire: Wire) -> asyncio.Transport:
    """Connect to the first of a Cluster voter's seeds that accepts (the last one's error if none does)."""
    error: OSError | None = None
    start = random.randrange(len(endpoint.seeds))  # a seed that hangs is not the first one every time
    for host, port in endpoint.seeds[start:] + endpoint.seeds[:start]:
        try:
            server_hostname = host if endpoint.tls is not None else None
            transport, _ = await loop.create_connection(
                lambda: wire, host, port, ssl=endpoint.tls, server_hostname=server_hostname
            )
        except OSError as exc:
            error = exc
            continue
        return transport
    assert error is not None
    raise error


async def handshake_commands(endpoint: Endpoint) -> list[Command]:
    """AUTH (when the endpoint has a password), SELECT (a database other than 0), CLIENT SETNAME, INFO server,
    INFO replication, INFO cluster, INFO memory, INFO stats (one section each: Redis 6.2 reads one section per INFO),
    and, when the endpoint names a probe key, the question whether the user may run DELIFEQ (``NATIVE_PROBE``:
    asked of the ACL from a script, as the release scripts would call it; 0 where the server lacks it)."""
    username, password = await endpoint.credentials()
    commands: list[Command] = []
    if password is not None:
        commands.append((b"AUTH", username, password) if username else (b"AUTH", password))
    if endpoint.db:
        commands.append((b"SELECT", endpoint.db))
    commands.append((b"CLIENT", b"SETNAME", endpoint.client_name))
    commands.append((b"INFO", b"server"))
    commands.append((b"INFO", b"replication"))
    commands.append((b"INFO", b"cluster"))
    commands.append((b"INFO", b"memory"))
    commands.append((b"INFO", b"stats"))
    if endpoint.probe_key:
        commands.append((b"EVAL", NATIVE_PROBE, 1, endpoint.probe_key, b"0"))
    return commands


def judge_handshake(endpoint: Endpoint, commands: list[Command], replies: list[Reply]) -> Identity:
    """What the server is; raise ConnectError if it refused us, or cannot be a voter (a replica, a
    cluster-mode node)."""
    sections: dict[bytes, bytes] = {}
    blind = ""
    delifeq = False
    for command, reply in zip(commands, replies, strict=True):
        if command[0] == b"INFO" and isinstance(reply, bytes) and isinstance(section := command[1], bytes):
            sections[section] = reply
        # Anything but 1 (0, or an error: no EVAL allowed, a server loading, busy) leaves the scripts.
        delifeq = delifeq or (command[0] == b"EVAL" and reply == 1)
        if not isinstance(reply, Failure):
            continue
        if command[0] == b"AUTH":
            raise ConnectError(f"AUTH refused: {reply.detail}")
        if command[0] == b"SELECT":
            raise ConnectError(f"SELECT {endpoint.db} refused: {reply.detail}")
        if not reply.answered:
            raise ConnectError(reply.detail.removeprefix("connection lost: "))
        if "NOAUTH" in reply.detail or "Authentication required" in reply.detail:
            raise ConnectError(f"the server wants a password: put it in the URL ({reply.detail})")
        # CLIENT SETNAME or INFO refused (an ACL user without them): we can do without, but not see what
        # the server is without INFO (said once: warn_of_setup).
        if command[0] == b"INFO":
            blind = "INFO"
    replication = info_fields(sections.get(b"replication", b""))
    if replication.get(b"role") == b"slave" and not (endpoint.cluster and endpoint.seeds):
        # (A Cluster voter's own connection, its pub/sub, may be a replica: any node hears every PUBLISH.)
        master = f"{replication.get(b'master_host', b'?').decode()}:{replication.get(b'master_port', b'?').decode()}"
        if endpoint.service is not None:
            raise ConnectError(f"the Sentinels named a replica (of {master}): failing over? asked again at next use")
        if endpoint.cluster:
            raise ConnectError(f"this node of the Cluster is a replica (of {master}) now: the slot map is read again")
        raise ConnectError(
            f"this server is a replica (of {master}): a voter must be a master that keeps its own keys;"
            " list the master itself, never a replica (a replica may be promoted without the latest lock keys)"
        )
    clustered = info_fields(sections.get(b"cluster", b"")).get(b"cluster_enabled") == b"1"
    if endpoint.cluster and not clustered:
        raise ConnectError(
            "this server is not in cluster mode (cluster_enabled:0): a redis+cluster:// voter names a Redis"
            " Cluster's nodes; write redis://HOST:PORT for a standalone master"
        )
    if clustered and not endpoint.cluster:
        raise ConnectError(
            "this server runs in cluster mode: a redis:// voter must be a standalone master"
            " (cluster_enabled:0); write redis+cluster://HOST:PORT to use the whole Cluster as one voter"
        )
    replicas = int(replication.get(b"connected_slaves", b"0") or 0)
    memory = info_fields(sections.get(b"memory", b""))
    policy = memory.get(b"maxmemory_policy", b"")
    limited = memory.get(b"maxmemory", b"0") not in (b"0", b"")
    eviction = policy.decode(errors="replace") if limited and policy not in _SAFE_POLICIES else ""
    server = sections.get(b"server")
    evicted = info_fields(sections.get(b"stats", b"")).get(b"evicted_keys")
    count = int(evicted) if evicted is not None and evicted.isdigit() else None
    return Identity(
        run_id(server) if server is not None else None,
        replicas,
        eviction,
        blind,
        promoted(replication),
        count,
        delifeq,
        # A Sentinel voter has replicas by design: a failover is judged as a restart (Identity.promoted).
        # A Cluster's shard too: its replicas' promotion is judged per shard (``_cluster_voter.py``).
        endpoint.service is not None or endpoint.cluster,
    )


def promoted(replication: dict[bytes, bytes]) -> bool:
    """Whether INFO replication shows a master that was a replica since it started: it keeps its old
    master's replication id as ``master_replid2`` (all zeros, and ``second_repl_offset:-1``, when never)."""
    replid2 = replication.get(b"master_replid2", b"").strip(b"0")
    offset = replication.get(b"second_repl_offset", b"-1")
    return bool(replid2) or offset not in (b"-1", b"")


def warn_of_setup(name: str, identity: Identity, warned: set[str], level: int, outbox: Outbox | None = None) -> None:
    """Once per node and kind (*warned* holds the kinds said): a setup under which node *name* may lose lock
    keys (its replicas, its eviction policy), or whose votes all fail (fewer replicas than the WAITs of its
    *outbox* ask for: ``wait_replicas``, where replicas are what the user asked for, not a hazard)."""
    replicas = identity.replicas
    wanted = outbox.replicas if isinstance(outbox, ReplicatedOutbox) else 0
    warnings = (
        (
            "replicas",
            not wanted and not identity.grouped and replicas > 0,
            f"this master has {replicas} connected replica(s): if a failover promotes one, keys it had not"
            " received yet are lost; a Redlock voter should be a master without failover",
        ),
        (
            "too few replicas",
            replicas < wanted,
            f"this master has {replicas} connected replica(s), fewer than wait_replicas={wanted}: every yes of"
            f" it fails (its WAIT finds too few replicas) until {wanted} are connected",
        ),
        (
            "eviction",
            bool(identity.eviction),
            f"maxmemory-policy is {identity.eviction}: under memory pressure it may evict lock keys and fencing"
            " counters, letting a second holder in; set maxmemory-policy noeviction",
        ),
        (
            "blind",
            bool(identity.blind),
            f"the user may not run {identity.blind}: nothing checks that this server is a master (not a replica,"
            " not in cluster mode), distinct from the other nodes, or when it restarted; allow +info",
        ),
    )
    for kind, said, text in warnings:
        if said and kind not in warned:
            warned.add(kind)
            log.log(level, "redlock node %s: %s (see docs/deployment.md)", name, text)


def describe_connect(exc: BaseException) -> str:
    """A failed connect in words: the socket or TLS error, never a password."""
    if isinstance(exc, ConnectError):
        return str(exc)
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError) and exc.errno:
        return os.strerror(exc.errno)  # asyncio's text repeats the address and the errno
    return describe(exc)


def tls_hint(endpoint: Endpoint, exc: BaseException) -> str:
    """A hint when the failure looks like TLS on one side only (the errors alone say nothing of it)."""
    text = str(exc).lower()
    if endpoint.tls is not None:
        if isinstance(exc, TimeoutError) or "wrong version number" in text or "record layer" in text:
            return " (a rediss:// URL: if the server does not speak TLS on this port, write redis://)"
    elif isinstance(exc, ConnectError) and any(word in text for word in ("reset by peer", "closed by", "broken pipe")):
        # The server hung up on the handshake: a TLS server does that to a plain client.
        return " (if the server speaks TLS on this port, write rediss://)"
    return ""


def info_fields(info: bytes) -> dict[bytes, bytes]:
    """The ``name:value`` lines of an INFO reply."""
    fields: dict[bytes, bytes] = {}
    for line in info.splitlines():
        name, colon, value = line.partition(b":")
        if colon and not name.startswith(b"#"):
            fields[name] = value.strip()
    return fields


def run_id(info: bytes) -> bytes | None:
    """The run_id line of an INFO server reply."""
    for line in info.splitlines():
        if line.startswith(b"run_id:"):
            return line[7:].strip() or None
    return None
