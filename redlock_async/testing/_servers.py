"""Real local Redis-protocol servers with fault injection, for tests, demos and benchmarks."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redlock_async.testing._clocks import SPEC_NAME, NodeClock, require_faketime, server_environment, time_of
from redlock_async.testing._process import (
    COMMAND_TIMEOUT,
    DBFILENAME,
    LOG_NAME,
    SOCKET_NAME,
    SPAWN_ATTEMPTS,
    PortInUse,
    issued_ports,
    pick_port,
    registry_lock,
    server_binary,
)
from redlock_async.testing._proxy import Proxy
from redlock_async.testing._server_process import Address, ServerProcess

__all__ = ["LocalNode", "LocalNodes", "ServerTLS", "server_binary"]


@dataclass(frozen=True)
class ServerTLS:
    """TLS for a :class:`LocalNode`: PEM files of the server's certificate and key.

    *ca_file* is the CA that client certificates must chain to; *auth_clients*
    says whether clients must show one (``"yes"`` needs *ca_file*).
    """

    cert_file: str
    key_file: str
    ca_file: str | None = None
    auth_clients: Literal["no", "optional", "yes"] = "no"

    def __post_init__(self) -> None:
        if self.auth_clients != "no" and self.ca_file is None:
            raise ValueError(f"auth_clients={self.auth_clients!r} needs ca_file: the CA client certificates chain to")

    def args(self) -> list[str]:
        """The server's command-line options for these files."""
        args = ["--tls-cert-file", self.cert_file, "--tls-key-file", self.key_file]
        if self.ca_file is not None:
            args += ["--tls-ca-cert-file", self.ca_file]
        return [*args, "--tls-auth-clients", self.auth_clients]


class LocalNode:
    """One server process on 127.0.0.1 with its own temp dir.

    The port is picked on construction (or given) and kept for the node's lifetime once the
    server has started, so URLs stay valid across kill/restart.

    Options (the defaults give a plain TCP server with no password):

    * *tls*: serve TLS only (``rediss://``) on the port, with these files;
    * *unix_socket*: serve only on a unix socket in the node's temp dir (``unix://``);
    * *password*: ``requirepass``, the default user's password;
    * *acl*: ACL rules, one user each, as in ``ACL SETUSER``: ``"alice on >secret ~* +@all"``.

    With *tls*, the node also listens on a unix socket in its temp dir, which the harness
    (``command()``, start and restart) uses. URLs never hold a password: add your own.

    With *proxied*, clients reach the server through a :class:`Proxy` (``node.proxy``) that
    can slow, silence or cut their connections: ``url`` is the proxy's, ``direct_url`` the
    server's, and ``command()`` always talks to the server directly. The proxy is made when
    the node first starts (or its URL is first asked for), keeps its port across restarts,
    and lives until ``close()``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        tls: ServerTLS | None = None,
        unix_socket: bool = False,
        password: str | None = None,
        acl: Sequence[str] = (),
        proxied: bool = False,
        server_args: Sequence[str] = (),
        clock: bool = False,
        config: str | None = None,
    ) -> None:
        if tls is not None and unix_socket:
            raise ValueError("tls and unix_socket do not go together: the server speaks TLS on TCP only")
        if proxied and unix_socket:
            raise ValueError("proxied and unix_socket do not go together: the proxy forwards TCP")
        self.proxied = proxied
        self._proxy: Proxy | None = None
        self.binary = binary if binary is not None else server_binary()
        self._process = ServerProcess(self.binary)
        self.tls = tls
        self.unix_socket = unix_socket
        self.password = password
        self.acl = tuple(acl)
        self.server_args = tuple(server_args)
        self.config = config
        """A config file's text, written once into the node's dir and named first on the command line (a
        Sentinel needs one it may rewrite); its later rewrites by the server are kept across restarts."""
        # The clock nemesis (testing/_clocks.py): libfaketime preloaded, its spec in the node's dir.
        self._faketime = require_faketime() if clock else None
        self._clock: NodeClock | None = None
        """More server configuration, appended to the command line (``"--maxmemory", "1mb"``, ...)."""
        self.port = port if port is not None else pick_port()
        # A port chosen by the caller, or one clients already know, never changes.
        self._port_fixed = port is not None
        self._client: redis.Redis | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        via = f" via proxy :{self._proxy.port}" if self._proxy is not None else ""
        return f"<LocalNode {self.direct_url}{via} {state}>"

    @property
    def url(self) -> str:
        """The URL clients should use: the proxy's when *proxied*, else :attr:`direct_url`."""
        if self.proxied:
            return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.proxy.port}"
        return self.direct_url

    @property
    def proxy(self) -> Proxy:
        """The proxy in front of the server (*proxied* nodes only)."""
        if not self.proxied:
            raise RuntimeError(f"{self!r} has no proxy: make it with proxied=True (or LocalNodes(..., proxied=True))")
        if self._proxy is None:
            # The port is read at each new connection: the first start may still move it.
            self._proxy = Proxy(lambda: self.port)
            with registry_lock:
                issued_ports.add(self._proxy.port)  # never handed to a server later
        return self._proxy

    @property
    def direct_url(self) -> str:
        """The server's own URL, bypassing any proxy, with no credentials.

        ``redis://``, or ``rediss://`` with *tls*, ``unix://`` with *unix_socket*.
        """
        if self.unix_socket:
            return f"unix://{self.socket_path}"
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> str | None:
        """The unix socket the server listens on (with *unix_socket* or *tls*), else None."""
        if not (self.unix_socket or self.tls):
            return None
        return os.path.join(self._process.ensure_dir(), SOCKET_NAME)

    @property
    def pid(self) -> int | None:
        proc = self._process.proc
        return proc.pid if self.running and proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the process is alive; a paused process counts as running."""
        return self._process.running

    @property
    def paused(self) -> bool:
        return self._process.paused

    @property
    def dir(self) -> str | None:
        """The node's temp dir (RDB file and server log), or None before the first start."""
        return self._process.dir

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self._spawn()
        self._await_start()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections are accepted but nothing is answered."""
        self._process.pause(repr(self))

    def resume(self) -> None:
        """Unfreeze a paused process (SIGCONT); no-op if not paused."""
        self._process.resume()

    def kill(self) -> None:
        """SIGKILL the process and reap it; data in memory is lost. No-op if not running."""
        self._close_client()
        self._process.kill()

    def stop(self) -> None:
        """Stop gracefully: SIGTERM, then SIGKILL if it does not exit in time. Idempotent."""
        self._close_client()
        self._process.stop()

    def restart(self, *, keep_data: bool = True) -> None:
        """Restart on the same port.

        keep_data=True saves an RDB snapshot on shutdown and loads it back (keys and TTLs
        survive); keep_data=False kills the process and starts it empty.
        """
        self._close_client()
        if keep_data:
            if self.running:
                self._process.shutdown_save(self.url, self._control_address(), self.password)
        else:
            self.kill()
            self._process.remove_rdb()
        self.start()
        # Consumed: a later kill()/stop() + start() must come back empty, as documented.
        self._process.remove_rdb()

    def close(self) -> None:
        """Stop the server and its proxy, and remove its temp dir. Idempotent."""
        try:
            self.stop()
        finally:
            proxy, self._proxy = self._proxy, None
            if proxy is not None:
                proxy.close()
            self._process.remove_dir()

    @property
    def clock(self) -> NodeClock:
        """This node's wall clock, to step, speed up, slow down or freeze (``LocalNode(clock=True)``, started)."""
        if self._faketime is None:
            raise RuntimeError(f"{self!r} has no clock control: make it with clock=True (libfaketime preloaded)")
        if self._clock is None:
            raise RuntimeError(f"{self!r} has not started yet: its clock comes with the server")
        return self._clock

    def time(self) -> float:
        """The server's wall clock (``TIME``), in seconds since the epoch."""
        return time_of(self.command("TIME"))

    def command(self, *args: str | bytes | int) -> object:
        """Send one command to the server (never through the proxy) and return its (undecoded) reply."""
        if self._client is None:
            self._client = redis.Redis(
                host="127.0.0.1",
                port=self.port,
                unix_socket_path=self.socket_path,
                password=self.password,
                socket_timeout=COMMAND_TIMEOUT,
                socket_connect_timeout=COMMAND_TIMEOUT,
                retry=Retry(NoBackoff(), 0),
            )
        # redis-py leaves execute_command unannotated.
        execute: Callable[..., object] = self._client.execute_command
        return execute(*args)

    # internals

    def _control_address(self) -> Address:
        """Where the harness talks to the server in plain text: the unix socket if any, else the port."""
        return self.socket_path or ("127.0.0.1", self.port)

    def _spawn(self) -> None:
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        if self.proxied:
            self.proxy  # noqa: B018 (made before the server starts, so its URL is known once it answers)
        directory = self._process.ensure_dir()
        log = os.path.join(directory, LOG_NAME)
        argv = [self.binary]
        if self.config is not None:
            config = os.path.join(directory, "server.conf")
            if not os.path.exists(config):
                with open(config, "w") as fh:
                    fh.write(self.config)
            argv.append(config)
        argv += [
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", directory,
            "--dbfilename", DBFILENAME,
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", log,
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.socket_path is not None:
            argv += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.unix_socket:
            argv[argv.index("--port") + 1] = "0"
        elif self.tls is not None:
            argv[argv.index("--port") + 1] = "0"
            argv += ["--tls-port", str(self.port), *self.tls.args()]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        for rule in self.acl:
            argv += ["--user", *rule.split()]
        argv += self.server_args
        env = None
        if self._faketime is not None:
            if self._clock is None:  # kept across restarts: a node comes back with the clock it had
                self._clock = NodeClock(os.path.join(directory, SPEC_NAME), self.time)
            else:
                self._clock.rewrite()  # where it reads now, not where its last change put it
            env = server_environment(self._faketime, self._clock.spec)
        self._process.spawn(argv, env)

    def _await_start(self) -> None:
        """Wait for the spawned server, relaunching when its port turned out to be taken."""
        for attempt in range(SPAWN_ATTEMPTS):
            try:
                self._process.await_ready(self.port, self._control_address(), self.password)
            except PortInUse:
                self._process.forget()
                if attempt == SPAWN_ATTEMPTS - 1:
                    break
                if self._port_fixed:
                    time.sleep(0.1 * (attempt + 1))
                else:
                    self.port = pick_port()
                self._spawn()
            except BaseException:
                self.kill()
                raise
            else:
                self._port_fixed = True
                if self._clock is not None:
                    self._clock.settle()  # its clock as asked (the server read the spec at its start, maybe late)
                return
        raise RuntimeError(
            f"port {self.port} on 127.0.0.1 stayed in use after {SPAWN_ATTEMPTS} attempts{self._process.log_tail()}"
        )

    def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


class LocalNodes:
    """N independent nodes (default 5), as a sync or async context manager.

    *tls*, *unix_socket*, *password*, *acl* and *proxied* apply to every node (see
    :class:`LocalNode`). With ``proxied=True`` each node sits behind its own :class:`Proxy`:
    ``urls`` are the proxies', ``nodes[i].proxy`` injects network faults on node i, and
    ``heal()`` ends them all.
    """

    def __init__(
        self,
        count: int = 5,
        *,
        binary: str | None = None,
        tls: ServerTLS | None = None,
        unix_socket: bool = False,
        password: str | None = None,
        acl: Sequence[str] = (),
        proxied: bool = False,
        clock: bool = False,
    ) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        resolved = binary if binary is not None else server_binary()
        self.nodes: list[LocalNode] = [
            LocalNode(
                resolved, tls=tls, unix_socket=unix_socket, password=password, acl=acl, proxied=proxied, clock=clock
            )
            for _ in range(count)
        ]

    def __repr__(self) -> str:
        return f"<LocalNodes {self.nodes!r}>"

    @property
    def urls(self) -> list[str]:
        """The URLs clients should use (the proxies' when proxied)."""
        return [node.url for node in self.nodes]

    @property
    def direct_urls(self) -> list[str]:
        """The servers' own URLs, bypassing any proxy."""
        return [node.direct_url for node in self.nodes]

    @property
    def proxies(self) -> list[Proxy]:
        """The proxy of each node, in order (``proxied=True`` only)."""
        return [node.proxy for node in self.nodes]

    def heal(self) -> None:
        """End every network fault on every node's proxy (no-op when not proxied); paused nodes stay paused."""
        for node in self.nodes:
            if node._proxy is not None:
                node._proxy.heal()

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> LocalNode:
        return self.nodes[index]

    def __iter__(self) -> Iterator[LocalNode]:
        return iter(self.nodes)

    def start(self) -> None:
        """Launch every stopped node, then wait for each to answer."""
        try:
            spawned = []
            for node in self.nodes:
                if not node.running:
                    node._spawn()
                    spawned.append(node)
            for node in spawned:
                node._await_start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop every node (paused ones too) and remove the temp dirs. Idempotent."""
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.close()
            except BaseException as exc:  # keep going: no node may be left running
                errors.append(exc)
        if errors:
            raise errors[0]

    def flush(self) -> None:
        """FLUSHALL on every running, non-paused node."""
        for node in self.nodes:
            if node.running and not node.paused:
                node.command("FLUSHALL")

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def nodes_from_env(count: int = 5, *, variable: str = "REDLOCK_NODES") -> Iterator[list[str]]:
    """The node URLs in ``$REDLOCK_NODES`` (comma-separated), or *count* local nodes for the block.

    For examples and demos that should run anywhere: against your servers when
    the variable names them, against embedded ones otherwise.
    """
    if urls := [url.strip() for url in os.environ.get(variable, "").split(",") if url.strip()]:
        yield urls
        return
    with LocalNodes(count) as nodes:
        yield nodes.urls
