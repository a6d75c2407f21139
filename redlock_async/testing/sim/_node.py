"""A simulated Valkey node: a :class:`_store.Store` on the node's own clock, the scripts (``_lua``), pub/sub,
``INFO`` and ``TIME``, and the connection-level commands of the library's handshake.

The node knows nothing of the network: a :class:`Session` is one client connection's state (its
subscriptions), and :meth:`SimNode.execute` answers one command for it. Replies pushed to a subscriber
(``message``) go to :attr:`Session.push`. Its faults: :meth:`restart` (with or without its data: a new
run_id either way), :meth:`step_clock`, :meth:`set_clock_rate`, ``SCRIPT FLUSH``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from redlock_async.testing.sim._lua import Lua, shared
from redlock_async.testing.sim._store import OK, STORE_COMMANDS, Error, Reply, Status, Store, arity, integer

WALL_START = 1_700_000_000.0
"""A node clock's reading (Unix seconds) at virtual time 0, before any step."""

_SUBSCRIBED_ONLY = frozenset({b"SUBSCRIBE", b"UNSUBSCRIBE", b"PSUBSCRIBE", b"PUNSUBSCRIBE", b"PING", b"QUIT", b"RESET"})


class Session:
    """One connection's state on a node: its subscriptions and where pushed messages go."""

    __slots__ = ("channels", "closed", "name", "push", "seq")

    def __init__(self, push: Callable[[Reply], None], seq: int) -> None:
        self.push = push
        self.seq = seq  # the order subscribers hear a message in (the order they connected)
        self.channels: set[bytes] = set()
        self.name = b""
        self.closed = False


class SimNode:
    """One simulated master. *now* is the true (virtual) time in seconds; the node reads its own clock."""

    def __init__(self, name: str, now: Callable[[], float], rng: random.Random, lua: Lua | None = None) -> None:
        self.name = name
        self._now = now
        self._rng = rng
        self._lua = lua or shared()
        self.offset = 0.0  # seconds added to the node's clock (steps)
        self.rate = 1.0  # how fast the node's clock runs against true time
        self._anchor = (0.0, 0.0)  # (true time, clock reading without offset) the rate counts from
        self._frozen_ms: float | None = None  # a script's start: keys expire by it while the script runs
        self.store = Store(self.keys_clock_ms, rng)
        self.scripts: set[bytes] = set()
        self.sessions: set[Session] = set()
        self._sessions_made = 0
        self.channels: dict[bytes, set[Session]] = {}
        self.run_id = self._new_run_id()
        self.started = self.clock()
        self.restarts = 0
        self.commands = 0

    def _new_run_id(self) -> bytes:
        return b"%040x" % self._rng.getrandbits(160)

    # -- the node's clock -----------------------------------------------------

    def clock(self) -> float:
        """The node's clock, Unix seconds (what TIME says)."""
        true0, local0 = self._anchor
        return WALL_START + local0 + (self._now() - true0) * self.rate + self.offset

    def clock_ms(self) -> float:
        return self.clock() * 1000.0

    def keys_clock_ms(self) -> float:
        """The time keys expire by: the clock, held still while a script runs (as Valkey does)."""
        return self._frozen_ms if self._frozen_ms is not None else self.clock() * 1000.0

    def step_clock(self, seconds: float) -> None:
        """Jump the node's clock by *seconds* (forward or back)."""
        self.offset += seconds

    def set_clock_rate(self, rate: float) -> None:
        """From now on, the node's clock runs *rate* times as fast as true time."""
        true = self._now()
        self._anchor = (true, self.clock() - WALL_START - self.offset)
        self.rate = rate

    # -- faults -----------------------------------------------------------------

    def restart(self, *, keep_data: bool) -> None:
        """A new server process: sessions dropped (the network closes their connections), scripts
        forgotten, a new run_id; the keys kept (as from an AOF) or lost."""
        self.restarts += 1
        for session in list(self.sessions):
            self.close_session(session)
        if not keep_data:
            self.store.data.clear()
            self.store.expires.clear()
        self.scripts.clear()
        self.run_id = self._new_run_id()
        self.started = self.clock()

    def open_session(self, push: Callable[[Reply], None]) -> Session:
        self._sessions_made += 1
        session = Session(push, self._sessions_made)
        self.sessions.add(session)
        return session

    def close_session(self, session: Session) -> None:
        session.closed = True
        self.sessions.discard(session)
        for channel in session.channels:
            subscribers = self.channels.get(channel)
            if subscribers is not None:
                subscribers.discard(session)
                if not subscribers:
                    del self.channels[channel]
        session.channels.clear()

    # -- commands ---------------------------------------------------------------

    def execute(self, session: Session | None, args: list[bytes]) -> list[Reply]:
        """The replies to one command of *session* (None: run with no connection, as a test's own call)."""
        self.commands += 1
        name = args[0].upper() if args else b""
        if session is not None and session.channels and name not in _SUBSCRIBED_ONLY:
            command = args[0].decode(errors="replace").lower()
            return [
                Error(
                    f"ERR Can't execute '{command}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET "
                    "are allowed in this context"
                )
            ]
        if name == b"SUBSCRIBE":
            return self._subscribe(session, args)
        if name == b"UNSUBSCRIBE":
            return self._unsubscribe(session, args)
        if name == b"PING" and session is not None and session.channels:
            return [[b"pong", args[1] if len(args) > 1 else b""]]
        return [self.command(args)]

    def command(self, args: list[bytes]) -> Reply:
        """One command that any connection (or a script) may run."""
        name = args[0].upper()
        if name in STORE_COMMANDS:
            return self.store.execute(args)
        handler = _NODE_COMMANDS.get(name)
        if handler is None:
            return self.store.execute(args)  # its "unknown command"
        return handler(self, args[1:])

    def _time(self, a: list[bytes]) -> Reply:
        if a:
            return arity(b"time")
        micros = int(self.clock() * 1_000_000)
        return [b"%d" % (micros // 1_000_000), b"%d" % (micros % 1_000_000)]

    def _ping(self, a: list[bytes]) -> Reply:
        if len(a) > 1:
            return arity(b"ping")
        return a[0] if a else Status(b"PONG")

    def _info_reply(self, a: list[bytes]) -> Reply:
        micros = int(self.clock() * 1_000_000)
        sections = {
            b"server": (
                b"# Server\r\nredis_version:7.2.4\r\nvalkey_version:8.0.0\r\nserver_mode:standalone\r\n"
                b"run_id:%s\r\nuptime_in_seconds:%d\r\nserver_time_usec:%d\r\n"
                % (self.run_id, max(0, int(self.clock() - self.started)), micros)
            ),
            b"replication": b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n",
            b"cluster": b"# Cluster\r\ncluster_enabled:0\r\n",
            b"memory": b"# Memory\r\nmaxmemory:0\r\nmaxmemory_policy:noeviction\r\n",
        }
        wanted = [section.lower() for section in a] or list(sections)
        if any(section in (b"all", b"everything", b"default") for section in wanted):
            wanted = list(sections)
        return b"\r\n".join(sections[section] for section in wanted if section in sections)

    def _flushall(self, a: list[bytes]) -> Reply:
        self.store.data.clear()
        self.store.expires.clear()
        return OK

    def _publish(self, a: list[bytes]) -> Reply:
        if len(a) != 2:
            return arity(b"publish")
        return self.publish(a[0], a[1])

    def publish(self, channel: bytes, message: bytes) -> int:
        subscribers = self.channels.get(channel, ())
        for session in sorted(subscribers, key=_seq) if len(subscribers) > 1 else subscribers:
            session.push([b"message", channel, message])
        return len(subscribers)

    def _client_reply(self, a: list[bytes]) -> Reply:
        if a and a[0].upper() == b"SETNAME" and len(a) == 2:
            return OK
        if a and a[0].upper() == b"GETNAME":
            return None
        return Error("ERR unknown subcommand or wrong number of arguments for 'client' command")

    def _select(self, a: list[bytes]) -> Reply:
        if len(a) != 1:
            return arity(b"select")
        db = integer(a[0])
        if db is None:
            return Error("ERR value is not an integer or out of range")
        return OK if db == 0 else Error("ERR the simulated node has only db 0")

    def _auth(self, a: list[bytes]) -> Reply:
        return Error(
            "ERR AUTH <password> called without any password configured for the default user. "
            "Are you sure your configuration is correct?"
        )

    def _script(self, a: list[bytes]) -> Reply:
        sub = a[0].upper() if a else b""
        if sub == b"LOAD" and len(a) == 2:
            sha, error = self._lua.compile(a[1])
            if error is not None:
                return error
            self.scripts.add(sha)
            return sha
        if sub == b"FLUSH" and len(a) <= 2:
            self.scripts.clear()
            return OK
        if sub == b"EXISTS" and len(a) >= 2:
            return [int(sha.lower() in self.scripts) for sha in a[1:]]
        return Error("ERR unknown subcommand or wrong number of arguments for 'script' command")

    def _eval_script(self, a: list[bytes]) -> Reply:
        if len(a) < 2:
            return arity(b"eval")
        sha, error = self._lua.compile(a[0])
        if error is not None:
            return error
        self.scripts.add(sha)
        return self._call_script(sha, a[1:])

    def _evalsha_script(self, a: list[bytes]) -> Reply:
        if len(a) < 2:
            return arity(b"evalsha")
        sha = a[0].lower()
        if sha not in self.scripts:
            return Error("NOSCRIPT No matching script. Please use EVAL.")
        return self._call_script(sha, a[1:])

    def _call_script(self, sha: bytes, a: list[bytes]) -> Reply:
        count = integer(a[0])
        if count is None:
            return Error("ERR value is not an integer or out of range")
        if count < 0:
            return Error("ERR Number of keys can't be negative")
        if count > len(a) - 1:
            return Error("ERR Number of keys can't be greater than number of args")
        keys, argv = a[1 : 1 + count], a[1 + count :]
        self._frozen_ms = self.clock_ms()
        try:
            return self._lua.run(sha, keys, argv, self._script_command)
        finally:
            self._frozen_ms = None

    def _script_command(self, args: list[bytes]) -> Reply:
        name = args[0].upper()
        if name in STORE_COMMANDS:
            return self.store.execute(args)  # (most of a script's calls: straight to the keyspace)
        if name in (b"EVAL", b"EVALSHA", b"SCRIPT", b"SUBSCRIBE", b"UNSUBSCRIBE"):
            return Error("ERR This Redis command is not allowed from script")
        return self.command(args)

    # -- pub/sub ------------------------------------------------------------------

    def _subscribe(self, session: Session | None, args: list[bytes]) -> list[Reply]:
        if len(args) < 2:
            return [arity(b"subscribe")]
        if session is None:
            return [Error("ERR SUBSCRIBE needs a connection")]
        replies: list[Reply] = []
        for channel in args[1:]:
            session.channels.add(channel)
            self.channels.setdefault(channel, set()).add(session)
            replies.append([b"subscribe", channel, len(session.channels)])
        return replies

    def _unsubscribe(self, session: Session | None, args: list[bytes]) -> list[Reply]:
        if session is None:
            return [Error("ERR UNSUBSCRIBE needs a connection")]
        channels = args[1:] or sorted(session.channels)
        if not channels:
            return [[b"unsubscribe", None, 0]]
        replies: list[Reply] = []
        for channel in channels:
            session.channels.discard(channel)
            subscribers = self.channels.get(channel)
            if subscribers is not None:
                subscribers.discard(session)
                if not subscribers:
                    del self.channels[channel]
            replies.append([b"unsubscribe", channel, len(session.channels)])
        return replies


def _seq(session: Session) -> int:
    return session.seq


_NODE_COMMANDS: dict[bytes, Callable[[SimNode, list[bytes]], Reply]] = {
    b"TIME": SimNode._time,
    b"PING": SimNode._ping,
    b"INFO": SimNode._info_reply,
    b"PUBLISH": SimNode._publish,
    b"FLUSHALL": SimNode._flushall,
    b"CLIENT": SimNode._client_reply,
    b"SELECT": SimNode._select,
    b"AUTH": SimNode._auth,
    b"SCRIPT": SimNode._script,
    b"EVAL": SimNode._eval_script,
    b"EVALSHA": SimNode._evalsha_script,
}
