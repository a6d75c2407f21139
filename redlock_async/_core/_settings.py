"""Every setting and its default, in one place, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from redlock_async._core._algorithm import best_validity, ttl_to_ms
from redlock_async._core._deprecated import renamed

MIN_TTL_TO_NODE_TIMEOUT = 10
"""The ttl must be at least this many node timeouts: a lease mostly spent waiting for nodes is useless."""

MIN_NODE_TIMEOUT = 0.001
"""Shortest node_timeout: below a millisecond every node would time out, even on loopback."""

MAX_TTL_MS = 2**53
"""Longest ttl in milliseconds: exact as a float, and well within what a server accepts for PX / PEXPIRE."""

MIN_FENCE_TTL = 60.0
"""Shortest fence_ttl, in seconds: a counter outlives any clock step or disagreement between nodes you
accept (the floor that replaces an expired counter is the node's clock; docs/fencing.md)."""

FENCE_TTL_TO_TTL = 10
"""fence_ttl must be at least this many ttls: grants in quick succession are ordered by the counter, which
outlives many leases, not by the clocks."""


def check_duration(name: str, value: object, *, zero_ok: bool = False, inf_ok: bool = False) -> float:
    """*value* as float seconds, or a ValueError/TypeError that says what to change."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds (int or float), got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(
            f"{name} is too large to be a number of seconds: got an int of {len(str(value))} digits"
        ) from None
    if math.isnan(number):
        raise ValueError(f"{name} must be a number of seconds, got NaN")
    if math.isinf(number) and not (inf_ok and number > 0):
        raise ValueError(f"{name} must be finite, got {number}")
    if number < 0 or (number == 0 and not zero_ok) or math.copysign(1.0, number) < 0:
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {number}")
    return number


def check_wait_replicas(value: object) -> int | None:
    """*value* as the ``wait_replicas`` setting (None, or an int of at least 1), or an error that says what to
    change."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"wait_replicas must be None or a number of replicas (an int of at least 1), got {type(value).__name__}"
        )
    if value < 1:
        raise ValueError(
            f"wait_replicas must be at least 1 (the replicas that must acknowledge a write before its yes counts), "
            f"got {value}: leave it None to count a yes at once"
        )
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """The settings of a Redlock; a Lock may override ttl and acquire_timeout.

    Durations are float seconds.
    """

    ttl: float = 10.0
    """Lease length. Long enough for the work between extensions; a crashed
    holder blocks others for at most this long."""
    node_timeout: float = 0.05
    """How long one node may take to answer one request before its vote counts
    as failed. Small next to the ttl (at most ttl/10): a slow node must not eat
    the lease. The early decision means a dead node costs nothing while a
    majority answers quickly."""
    adaptive_timeout: bool = True
    """Wait longer than node_timeout when the nodes are measured to take longer (a network 50 ms
    away): each node's round trips are tracked as TCP does (smoothed RTT + 4 x its variation),
    and a fan-out waits for the majority-th fastest node's estimate, at most ttl/10. On a fast
    network this never exceeds node_timeout, so nothing changes; False keeps node_timeout fixed."""
    drift_factor: float = 0.01
    """Fraction of the ttl assumed lost to clock drift between nodes (plus 2 ms)."""
    retry_delay: float = 0.2
    """Mean wait between attempts of a blocking acquire; each wait is random in
    [retry_delay/2, 3*retry_delay/2) so competing clients do not collide again."""
    acquire_timeout: float = 10.0
    """How long a blocking acquire (and ``async with``) keeps trying; math.inf waits forever."""
    connect_timeout: float = 1.0
    """Bound on (re)connecting to one node, TLS and AUTH included."""
    reconnect_delay: float = 0.1
    """After a failed connect, the node is skipped (fails at once) for this long."""
    max_unanswered: int = 1024
    """Unanswered commands on a stalled node (silent for connect_timeout) before new
    acquires and extends skip it; a node that keeps answering is never skipped,
    and a client whose own loop lags (a burst of acquires) is not taken for a stall."""
    key_prefix: str = "redlock:"
    """Prepended to every resource name to make the lock's key."""
    wait_for_release: bool = True
    """A blocking acquire that finds the lock taken is woken by the holder's
    release (pub/sub, one connection per node for the whole Redlock) instead
    of only polling; it still retries after retry_delay if no word comes."""
    queue: bool | None = None
    """The grant queue, the fair hand-off (docs/algorithm.md, "The grant queue"): waiters of a name wait
    in line on the nodes, and a release hands the key straight to the first of them, in whatever process
    it runs, so the lock changes hands in one round trip and every waiter gets its turn. None (the
    default): on whenever wait_for_release is (the nodes publish their grants). False: a waiter listens
    for release words and sends its own SETs (the hand-off of versions before 0.x: this process's oldest
    waiter gets the lock first, another process's only when it wins the race). For every primitive
    (locks, lock_many, semaphores, elections, read/write locks), fenced or not (a fenced grant from the
    queue raises the counters as any fenced grant does: docs/fencing.md). Every client of a name should
    use the same setting: one without it still excludes correctly, but does not queue."""
    fencing: bool = False
    """Give each grant a fencing token (Lock.fencing_token) that grows with every
    grant of the resource: one more round trip per acquire. See docs/fencing.md."""
    fence_prefix: str = "redlock-fence:"
    """Prepended to the resource name for its fencing counter."""
    fence_ttl: float | None = None
    """None: a fencing counter never expires (one small key per name ever fenced, on every node).
    Seconds: each counter expires this long after its last grant, and every fencing token is at least
    the node's time in microseconds, so that a counter that expired never restarts below a token
    already given, as long as the nodes' clocks never disagree or step back by this much. At least
    MIN_FENCE_TTL and FENCE_TTL_TO_TTL ttls; a day suits most. Every client of a fenced name must use
    the same setting (docs/fencing.md)."""
    auto_extend: bool = True
    """Inside ``async with lock``, a watchdog extends the lease until the block
    exits, and cancels the body (raising LockLost) if the lease is lost."""
    extend_threshold: float = 1 / 3
    """The watchdog extends a lease once less than this fraction of the ttl is
    left: a third leaves time for two more tries before the lease runs out."""
    max_hold: float = 3600.0
    """Longest a lock may be held in total through the watchdog's extensions.
    Redlock's liveness rests on leases ending: a holder that is alive but stuck
    (a coroutine waiting on something that never comes) would otherwise keep
    the lock forever. An hour suits most jobs; math.inf removes the bound."""
    max_extensions: int | None = None
    """Optional bound on the watchdog's extensions of one acquisition."""
    restart_quarantine: float | None = None
    """Seconds a node that restarted or lost its data counts toward no quorum
    (a client-side "delayed restart"; see docs/safety.md). None: the largest
    ttl this Redlock uses, plus drift, which is enough when every client of
    the nodes uses this Redlock's ttls or shorter ones; give the largest ttl of
    any client otherwise. 0 turns it off (only for nodes that never lose data)."""
    clock_guard: bool = True
    """Each acquire and extension reads the nodes' clocks (``TIME``, in the same write: no extra round
    trip); a node whose clock jumped ahead or runs fast beyond the drift factor counts toward no quorum
    for the longest ttl plus drift, and held locks count it as lost at once (docs/algorithm.md, "Clock
    faults"). A clock that stepped back or froze is reported. False turns it off."""
    wait_replicas: int | None = None
    """None: a node's yes counts at once. N: each yes (acquire, extension) is followed by ``WAIT N timeout``
    on the same connection, and counts only if N replicas acknowledged the write within the node timeout;
    a shortfall is a failed vote. An availability knob (a lock's key usually survives a failover), paid for
    with a replica's round trip per vote: the failover quarantine, not this, is what keeps a lock safe
    (docs/deployment.md). Waiters then hand off by release words and their own writes (the grant queue's
    grants are written by the releasing client, which a waiter's WAIT cannot confirm): queue is off."""
    ttl_ms: int = field(init=False, repr=False, compare=False)
    """The ttl as the servers get it (:func:`ttl_to_ms`), worked out once."""
    fence_ttl_ms: int | None = field(init=False, repr=False, compare=False)
    """fence_ttl as the servers get it, None when counters never expire."""

    def __post_init__(self) -> None:
        for name in ("ttl", "node_timeout", "connect_timeout"):
            object.__setattr__(self, name, check_duration(name, getattr(self, name)))
        for name in ("retry_delay", "reconnect_delay"):
            object.__setattr__(self, name, check_duration(name, getattr(self, name), zero_ok=True))
        object.__setattr__(
            self, "acquire_timeout", check_duration("acquire_timeout", self.acquire_timeout, zero_ok=True, inf_ok=True)
        )
        factor = self.drift_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float):
            raise TypeError(f"drift_factor must be a number like 0.01, got {type(factor).__name__}")
        if not 0 <= factor < 0.5:
            raise ValueError(f"drift_factor must be a fraction in [0, 0.5), like 0.01; got {factor!r}")
        object.__setattr__(self, "drift_factor", float(factor))
        # A relative tolerance, so that exactly ttl/10 passes despite float rounding (0.021 * 10 > 0.21).
        if self.node_timeout * MIN_TTL_TO_NODE_TIMEOUT > self.ttl * (1 + 1e-9):
            raise ValueError(
                f"node_timeout ({self.node_timeout} s) must be at most ttl/{MIN_TTL_TO_NODE_TIMEOUT} "
                f"({self.ttl / MIN_TTL_TO_NODE_TIMEOUT} s for ttl={self.ttl} s): "
                "raise the ttl or lower node_timeout"
            )
        object.__setattr__(self, "ttl_ms", ttl_to_ms(self.ttl))
        if self.ttl_ms > MAX_TTL_MS:
            raise ValueError(f"ttl must be at most {MAX_TTL_MS // 1000} s (2**53 ms, for the servers), got {self.ttl}")
        if self.ttl_ms < 1 or best_validity(self.ttl_ms / 1000, factor) <= 0:
            raise ValueError(
                f"ttl={self.ttl} s leaves no validity after drift ({factor} x ttl + 2 ms): use a ttl of at least 0.01 s"
            )
        if self.node_timeout < MIN_NODE_TIMEOUT:
            raise ValueError(
                f"node_timeout must be at least {MIN_NODE_TIMEOUT} s (1 ms), got {self.node_timeout}: "
                "no round trip to a server is shorter, even on loopback"
            )
        if isinstance(self.max_unanswered, bool) or not isinstance(self.max_unanswered, int):
            raise TypeError(f"max_unanswered must be an int, got {type(self.max_unanswered).__name__}")
        if self.max_unanswered < 1:
            raise ValueError(f"max_unanswered must be at least 1, got {self.max_unanswered}")
        object.__setattr__(self, "wait_replicas", check_wait_replicas(self.wait_replicas))
        if self.queue is None:
            object.__setattr__(self, "queue", self.wait_for_release and self.wait_replicas is None)
        elif self.queue is True and self.wait_replicas is not None:
            raise ValueError(
                f"queue=True cannot go with wait_replicas={self.wait_replicas}: a grant from the queue is written "
                "by the releasing client, and a waiter's WAIT cannot confirm another connection's write (drop "
                "queue=True: waiters then take the lock with writes of their own, each confirmed)"
            )
        for name in ("wait_for_release", "queue", "fencing", "auto_extend", "adaptive_timeout", "clock_guard"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {type(getattr(self, name)).__name__}")
        if self.queue and not self.wait_for_release:
            raise ValueError(
                "queue=True needs wait_for_release=True: the nodes publish their grants (drop queue=True, or "
                "wait_for_release=False)"
            )
        threshold = self.extend_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise TypeError(f"extend_threshold must be a fraction like 1/3, got {type(threshold).__name__}")
        if not 0.05 <= threshold <= 0.9:
            raise ValueError(f"extend_threshold must be in [0.05, 0.9] (a fraction of the ttl), got {threshold!r}")
        object.__setattr__(self, "max_hold", check_duration("max_hold", self.max_hold, inf_ok=True))
        if self.restart_quarantine is not None:
            object.__setattr__(
                self,
                "restart_quarantine",
                check_duration("restart_quarantine", self.restart_quarantine, zero_ok=True),
            )
        extensions = self.max_extensions
        if extensions is not None:
            if isinstance(extensions, bool) or not isinstance(extensions, int):
                raise TypeError(f"max_extensions must be an int or None, got {type(extensions).__name__}")
            if extensions < 0:
                raise ValueError(f"max_extensions must be >= 0 (or None for no bound), got {extensions}")
        self._check_fence_ttl()
        if not isinstance(self.key_prefix, str):
            raise TypeError(f"key_prefix must be a str, got {type(self.key_prefix).__name__}")
        if not isinstance(self.fence_prefix, str):
            raise TypeError(f"fence_prefix must be a str, got {type(self.fence_prefix).__name__}")
        for name in ("key_prefix", "fence_prefix"):
            try:
                getattr(self, name).encode()
            except UnicodeEncodeError as exc:
                raise ValueError(f"{name} {getattr(self, name)!r} is not valid UTF-8 ({exc.reason})") from None
        if self.fencing and (
            self.fence_prefix.startswith(self.key_prefix) or self.key_prefix.startswith(self.fence_prefix)
        ):
            raise ValueError(
                f"key_prefix {self.key_prefix!r} and fence_prefix {self.fence_prefix!r} overlap: a lock key "
                "could be taken for a fencing counter; pick prefixes where neither starts the other"
            )

    @property
    def max_queued(self) -> int:
        """Deprecated spelling of :attr:`max_unanswered`."""
        renamed("Settings.max_queued", ".max_unanswered")
        return self.max_unanswered

    def _check_fence_ttl(self) -> None:
        fence_ttl = self.fence_ttl
        if fence_ttl is None:
            object.__setattr__(self, "fence_ttl_ms", None)
            return
        fence_ttl = check_duration("fence_ttl", fence_ttl)
        least = max(MIN_FENCE_TTL, FENCE_TTL_TO_TTL * self.ttl)
        if fence_ttl < least:
            raise ValueError(
                f"fence_ttl ({fence_ttl} s) must be at least {least} s (60 s, and {FENCE_TTL_TO_TTL} x the "
                f"ttl of {self.ttl} s): a fencing counter must outlive many leases and any clock step between "
                "nodes; a day (86400) suits most, None keeps counters for ever"
            )
        if ttl_to_ms(fence_ttl) > MAX_TTL_MS:
            raise ValueError(f"fence_ttl must be at most {MAX_TTL_MS // 1000} s (2**53 ms), got {fence_ttl}: or None")
        object.__setattr__(self, "fence_ttl", fence_ttl)
        object.__setattr__(self, "fence_ttl_ms", ttl_to_ms(fence_ttl))
