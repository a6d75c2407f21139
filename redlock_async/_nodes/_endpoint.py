"""Where a node is and how to talk to it: an :class:`Endpoint`, made from a URL or a redis-py client.

redis-py parses the URL (``ConnectionPool.from_url``) or holds the client's
settings (``pool.connection_kwargs``); both are read through public
attributes only. Everything after that is ours: the socket, TLS through an
:class:`ssl.SSLContext`, and the handshake (``_node.py``). So a new redis-py
release can change its connection classes without breaking a lock.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

from redlock_async._nodes._voter_urls import CLUSTER, VoterURL, voter_url

CLIENT_NAME = "redlock_async"
"""What CLIENT LIST shows for our connections, unless the URL or client names one."""

_USED = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "client_name",
        "ssl_context",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_ca_data",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_password",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
    }
)
"""The connection settings an Endpoint takes from a URL or a client."""

_IGNORED = frozenset(
    {
        # Timeouts, retries and pooling are ours (per node, per request): redis-py's have no say.
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "retry_on_timeout",
        "retry_on_error",
        "max_connections",
        "health_check_interval",
        "protocol",
        "decode_responses",
        "encoding",
        "encoding_errors",
        # What redis-py's from_url adds of its own, by version.
        "himport_registry",
        "maint_notifications_pool_handler",
        "maint_notifications_config",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    }
)
"""URL options that are accepted and have no effect here."""

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One node's address, credentials and TLS settings. Its repr never shows a secret."""

    name: str
    """host:port or unix:path, with /db when db is not 0: what logs and errors call the node."""
    host: str | None = None
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    credential_provider: Any = field(default=None, repr=False)
    """redis-py's ``CredentialProvider`` (public API: ``get_credentials[_async]()``), asked on each connect."""
    client_name: str = CLIENT_NAME
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    server_hostname: str | None = None
    service: str | None = None
    """A Sentinel voter's service (``redis+sentinel://``): its master is asked of :attr:`sentinels` at each
    connect (``_sentinel_voter.py``); host and port are then the first Sentinel's. None for a plain node."""
    sentinels: tuple[Endpoint, ...] = ()
    cluster: bool = False
    """A node of a Redis Cluster voter (``redis+cluster://``, ``_cluster_voter.py``): the handshake takes a
    server in cluster mode. The voter's own endpoint lists :attr:`seeds`; a shard primary's lists none."""
    seeds: tuple[tuple[str, int], ...] = ()
    """A Cluster voter's seed addresses (host, port), tried in turn to reach the cluster; () otherwise."""
    probe_key: bytes = field(default=b"", repr=False)
    """A key under the Redlock's ``key_prefix`` that the handshake may name when it asks whether the user may
    run the server's native compare-and-delete (``_handshake.py``); empty: it does not ask (a subscriber's
    connection, a Cluster voter's shards), and the scripts run."""

    @property
    def address(self) -> tuple[str, ...]:
        """The server this names, spelled one way (the db left out: two dbs of one server are one server)."""
        if self.service is not None:
            return ("sentinel", self.service, *sorted(":".join(s.address) for s in self.sentinels))
        if self.seeds:
            return ("cluster", *sorted(f"{host.lower().rstrip('.')}:{port}" for host, port in self.seeds))
        if self.path is not None:
            return ("unix", os.path.realpath(self.path))
        assert self.host is not None
        return ("tcp", self.host.lower().rstrip("."), str(self.port))

    async def credentials(self) -> tuple[str | None, str | None]:
        """(username, password) for AUTH; (None, None) when the server wants none."""
        provider = self.credential_provider
        if provider is None:
            return self.username, self.password
        if hasattr(provider, "get_credentials_async"):
            creds = await provider.get_credentials_async()
        else:
            creds = provider.get_credentials()
        if len(creds) == 1:
            return None, creds[0]
        return creds[0], creds[1]


def endpoints_for(nodes: object) -> list[Endpoint]:
    """The endpoints of a Redlock's *nodes* (URLs or clients), refusing an empty list and one server twice."""
    if isinstance(nodes, str | bytes):
        raise TypeError("nodes must be a list of URLs or clients, not a single string")
    if not isinstance(nodes, Iterable):
        raise TypeError(f"nodes must be a list of URLs or clients, got {type(nodes).__name__}")
    specs = list(nodes)
    if not specs:
        raise ValueError("nodes is empty: give the URLs of at least one Redis master (3 or 5 for Redlock)")
    endpoints: list[Endpoint] = []
    seen: dict[tuple[str, ...], int] = {}
    for index, spec in enumerate(specs):
        endpoint = endpoint_for(spec, index)
        if endpoint.address in seen:
            raise ValueError(
                f"nodes[{index}] ({endpoint.name}) is the same server as nodes[{seen[endpoint.address]}] "
                "(another db of a server is the same server): each node must be a distinct master, "
                "or the majority means nothing"
            )
        seen[endpoint.address] = index
        endpoints.append(endpoint)
    return endpoints


def endpoint_for(spec: object, index: int) -> Endpoint:
    """The :class:`Endpoint` of node *spec* (a URL or a ``redis.asyncio.Redis``); errors name ``nodes[index]``."""
    if isinstance(spec, str) and (voter := voter_url(spec, index)) is not None:
        return _voter_endpoint(voter, index)
    if isinstance(spec, str):
        pool = _parse_url(spec, index)
    elif isinstance(spec, Redis):
        pool = spec.connection_pool
    else:
        sync = " (a synchronous client: pass a redis.asyncio.Redis)" if isinstance(spec, redis.Redis) else ""
        raise TypeError(
            f"nodes[{index}] must be a URL string or a redis.asyncio.Redis client, got {type(spec).__name__}{sync}"
        )
    kwargs: Mapping[str, Any] = pool.connection_kwargs
    connection_class = pool.connection_class
    if isinstance(spec, str) and (unknown := sorted(set(kwargs) - _USED - _IGNORED)):
        raise ValueError(
            f"nodes[{index}] has URL options redlock_async does not know: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_USED - {'host', 'port', 'path'}))})"
        )
    db = _db(kwargs.get("db"), index)
    if issubclass(connection_class, UnixDomainSocketConnection):
        path = kwargs.get("path")
        if not path:
            raise ValueError(f"nodes[{index}] is a unix socket without a path: write unix:///path/to/socket")
        name = f"unix:{path}"
        host, port = None, 6379
    else:
        path = None
        host = str(kwargs.get("host") or "localhost")
        try:
            port = int(kwargs.get("port") or 6379)
        except (TypeError, ValueError):
            raise ValueError(f"nodes[{index}] has a port that is not a number: write host:port") from None
        if not 0 < port < 65536:
            raise ValueError(f"nodes[{index}] has port {port}: a port is 1 to 65535")
        name = f"{host}:{port}"
    if db:
        name += f"/{db}"
    tls = None
    if issubclass(connection_class, SSLConnection) or kwargs.get("ssl_context") is not None:
        tls = _tls_context(kwargs, name, index)
    client_name = kwargs.get("client_name")
    return Endpoint(
        name=name,
        host=host,
        port=port,
        path=path,
        db=db,
        username=kwargs.get("username") or None,
        password=kwargs.get("password"),
        credential_provider=kwargs.get("credential_provider"),
        client_name=str(client_name) if client_name else CLIENT_NAME,
        tls=tls,
        server_hostname=host if tls is not None and path is None else None,
    )


def _voter_endpoint(voter: VoterURL, index: int) -> Endpoint:
    """The endpoint of a ``redis+sentinel://`` voter (its Sentinels' endpoints in it) or of a
    ``redis+cluster://`` voter (its seeds in it; its shards' endpoints are made as the slot map names them)."""
    base = endpoint_for(voter.base, index)
    if voter.kind == CLUSTER:
        return replace(base, name=f"cluster:{base.name}", cluster=True, seeds=voter.addresses)
    sentinels = tuple(
        replace(
            base,
            name=f"{host}:{port}",
            host=host,
            port=port,
            db=0,
            username=voter.sentinel_username,
            password=voter.sentinel_password,
            credential_provider=None,
            server_hostname=host if base.tls is not None else None,
        )
        for host, port in voter.addresses
    )
    return replace(
        base, name=f"sentinel:{sentinels[0].name}/{voter.service}", service=voter.service, sentinels=sentinels
    )


def _parse_url(url: str, index: int) -> ConnectionPool:
    """redis-py's URL parsing, with errors that never quote the URL (a password may be in it)."""
    encode = "if a password holds '#', '/', '?', '@' or '%', percent-encode it: urllib.parse.quote(password, safe='')"
    if "#" in url:
        # An unescaped '#' ends the URL there: the rest would be dropped, host and port included.
        raise ValueError(f"nodes[{index}] is not a usable Redis URL: it holds a '#'; {encode}")
    try:
        return ConnectionPool.from_url(url)
    except (ValueError, TypeError) as exc:
        if "@" in url or "password" in url.lower():
            # redis-py's text may quote a piece of the password ("Port could not be cast ... as 'hunter2'").
            raise ValueError(f"nodes[{index}] is not a usable Redis URL: {encode}") from None
        raise ValueError(
            f"nodes[{index}] is not a usable Redis URL ({exc}): "
            "write redis://host:port, rediss://host:port or unix:///path/to/socket"
        ) from None


def _db(value: object, index: int) -> int:
    if value in (None, ""):
        return 0
    try:
        db = int(str(value))
    except ValueError:
        raise ValueError(f"nodes[{index}] has db {value!r}: a db is a number, as in redis://host:port/0") from None
    if db < 0:
        raise ValueError(f"nodes[{index}] has db {db}: a db is 0 or more")
    return db


def _tls_context(kwargs: Mapping[str, Any], name: str, index: int) -> ssl.SSLContext:
    """An SSLContext from redis-py's ``ssl_*`` settings (or the ``ssl_context`` given); default: verify everything."""
    given = kwargs.get("ssl_context")
    if isinstance(given, ssl.SSLContext):
        return given
    for option in ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile"):
        # Else every connect fails with a bare "No such file or directory".
        if isinstance(path := kwargs.get(option), str) and not os.path.exists(path):
            raise ValueError(f"nodes[{index}] ({name}): {option} {path!r} does not exist")
    reqs = kwargs.get("ssl_cert_reqs", "required")
    if reqs is None:
        reqs = ssl.CERT_NONE
    if isinstance(reqs, str):
        if reqs.lower() not in _CERT_REQS:
            raise ValueError(f"nodes[{index}] ({name}): ssl_cert_reqs must be none, optional or required, got {reqs!r}")
        reqs = _CERT_REQS[reqs.lower()]
    try:
        context = ssl.create_default_context(
            cafile=kwargs.get("ssl_ca_certs"), capath=kwargs.get("ssl_ca_path"), cadata=kwargs.get("ssl_ca_data")
        )
        context.check_hostname = bool(kwargs.get("ssl_check_hostname", True)) and reqs != ssl.CERT_NONE
        context.verify_mode = reqs
        if certfile := kwargs.get("ssl_certfile"):
            context.load_cert_chain(certfile, kwargs.get("ssl_keyfile"), kwargs.get("ssl_password"))
        if minimum := kwargs.get("ssl_min_version"):
            context.minimum_version = minimum
        if ciphers := kwargs.get("ssl_ciphers"):
            context.set_ciphers(ciphers)
        for flag in kwargs.get("ssl_include_verify_flags") or ():
            context.verify_flags |= flag
        for flag in kwargs.get("ssl_exclude_verify_flags") or ():
            context.verify_flags &= ~flag
    except (ssl.SSLError, OSError, ValueError, TypeError) as exc:
        raise ValueError(f"nodes[{index}] ({name}) has TLS settings that do not load: {exc}") from None
    return context
