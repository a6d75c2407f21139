"""Restart quarantine: a node that came back without its keys sits out every quorum for a while.

The hazard (Kleppmann's analysis of Redlock): client A holds nodes 1, 2, 3;
node 3 restarts without its data; client B gets 3, 4, 5 and both hold the
lock. The cure antirez proposed is a *delayed restart*: a node that comes
back stays out until every lease it could have held has run out. Operators
rarely do it, so the client does: a node that restarted or lost its data
counts toward no quorum for ``restart_quarantine`` seconds (default: the
largest ttl in use, plus drift).

Detection, on every new connection, before anything else is answered
(the probe goes first on the wire, so its answer arrives before any vote):

* ``INFO server``: the ``run_id`` changes with every restart, and
  ``uptime_in_seconds`` says when it came back. A client that knew the old
  ``run_id`` sees any restart, with data or without.
* ``GET <key_prefix>``: a marker key that clients write on nodes in service
  (it can never be a lock's key: names are not empty). A node that lost its
  data has no marker, whatever its uptime; a client meeting it for the first
  time sees that, if the other nodes have theirs.

Until its probe is answered a node counts for nothing; the decision itself
is :func:`_algorithm.sit_out`. The cost: two commands per (re)connect, and
one attribute read per yes vote.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence

from redlock_async import _clock
from redlock_async._algorithm import Marker, quorum, sit_out
from redlock_async._node import Node
from redlock_async._wire import Failure, Reaction, Reply, pack

log = logging.getLogger(__name__)

RECHECK_FIRST = 0.1
"""Seconds before a node without marker is asked again: another client may have just judged it in service."""

REPAIR_RETRY = 0.5
"""Seconds before the fencing counters of a node back from a restart are copied again, when the other nodes
could not be read (too few in service): it keeps sitting out until they are."""

Repair = Callable[[int, list[int], int], Awaitable[str | None]]
"""Raises node *i*'s fencing counters from the nodes listed, at least as many as the number given answering
(``_fence_repair.raise_counters``): None when done, else why not."""

VOUCH_WAIT = 0.3
"""Longest a ballot holds a yes of a node met without marker, waiting for that first recheck's answer.

Two clients meeting a new cluster at the same moment: each judges it new and marks every node, but a
probe may land on a node before the other client's marker does, while the other nodes show theirs: a
suspect, in that client's view, for the instant until its recheck. Refusing its yes there failed
both clients' first tries (two ``blocking=False`` tries, one task sent twice: neither ran). A yes
held until the recheck counts once the node is judged in service, as if it had been met a moment
later; if the recheck finds no marker (it did lose its data), the yes is refused as before."""


class Quarantine:
    """Per Redlock: probes each node on connect and sets its ``quarantined_until``."""

    def __init__(
        self,
        marker: bytes,
        period: Callable[[], float],
        nodes: Sequence[Node],
        *,
        read_only: bool = False,
        repair: Repair | None = None,
    ) -> None:
        self._marker = marker
        # A node whose quarantine is over first gets its fencing counters back (docs/fencing.md).
        self._repair = None if read_only else repair
        self._repairs: dict[int, asyncio.Task[None]] = {}
        self._read_only = read_only  # judge, but write no marker (inspection writes nothing)
        # Inspection's judgement is its own verdicts' business: the locking clients warn of a restart.
        self._warning = logging.DEBUG if read_only else logging.WARNING
        self._info = logging.DEBUG if read_only else logging.INFO
        self._period = period  # read at each decision: the largest ttl in use may grow
        self._nodes = tuple(nodes)
        n = len(self._nodes)
        self._run_ids: list[bytes | None] = [None] * n
        self._marked: list[bool | None] = [None] * n  # None: not seen yet, or the marker could not be read
        # Per node: the server its marker named when last read (or written by us), None when none was.
        self._named: list[bytes | None] = [None] * n
        self._seen = [False] * n
        # Per node: it restarted or lost its data since it was last marked in service, and its fencing counters
        # were not raised from the others since: they may be behind (docs/fencing.md).
        self._behind = [False] * n
        self._suspects: set[int] = set()
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._fresh_checked = False
        self._fresh_at = -math.inf  # when this client judged the cluster new
        self._closed = False

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._repairs.values():
            task.cancel()
        self._repairs.clear()
        for node in self._nodes:
            _settle(node)

    # -- the probe --------------------------------------------------------

    def on_ready(self, node: Node) -> None:
        """A new connection to *node*: count nothing from it until the probe is answered."""
        node.quarantined_until = math.inf
        repairing = self._repairs.pop(self._nodes.index(node), None)
        if repairing is not None:
            repairing.cancel()  # the new connection's probe judges it again
        _settle(node)  # votes held for the last connection's recheck count for nothing now
        # Replies come in order: when the marker's is in, so is INFO's. Both are read the moment
        # they are parsed, before any vote that follows them on this connection is counted.
        info: list[Reply] = []
        node.send_first(
            (Reaction(info.append), (b"INFO", b"server")),
            (Reaction(lambda marker: self._probed(node, info[0], marker)), (b"GET", self._marker)),
        )

    def _probed(self, node: Node, info: Reply, marker: Reply) -> None:
        if self._closed or _lost(info) or _lost(marker):
            return  # the connection broke under the probe: the next one probes again
        i = self._nodes.index(node)
        run_id, uptime = _server_info(info)
        state = _marker_state(marker, run_id, self._period())
        marked = None if state is Marker.UNKNOWN else state is not Marker.ABSENT
        known = self._run_ids[i]
        seconds, suspect = sit_out(
            self._period(),
            uptime=uptime,
            known_run_id=known is not None and run_id == known,
            restarted=known is not None and run_id is not None and run_id != known,
            marker=state,
        )
        replaced = self._replaced(i, node, run_id, marker)
        if replaced:
            seconds, suspect = self._period(), False
        if run_id is not None:
            self._run_ids[i] = run_id
        self._seen[i] = True
        self._behind[i] = state is not Marker.CURRENT and (
            state is Marker.ABSENT
            or (known is not None and run_id is not None and run_id != known)
            or _restarted_since_marked(state, marker, run_id)
        )
        self._marked[i] = marked
        if suspect and known is None and node.connect_started <= self._fresh_at:
            # Its first connection began before we judged the cluster new: one of that round, late.
            seconds, suspect = 0.0, False
        if suspect:
            self._suspects.add(i)
            if known is None and node.vouching is None:
                # Met for the first time without marker, while others have theirs: it may be marked in
                # service by another client this very moment. Its yes votes wait for the first recheck.
                node.vouching = []
                node.vouch_until = _clock.now() + VOUCH_WAIT
        else:
            self._suspects.discard(i)
        why = REPLACED if replaced else "" if suspect else _why(state, marker, run_id)
        self._sit_out(i, seconds, why)
        if not seconds and _restarted_since_marked(state, marker, run_id):
            # Back with its data (a snapshot) longer than a quarantine ago, marked in service by no client
            # since: its counters may be the snapshot's. Raised from the others before it counts.
            self._served(i)
        elif not seconds and state is not Marker.CURRENT and run_id is not None:
            self._mark(i)
        if suspect and self._fresh_checked:
            self._warn_suspect(i)
        self._check_fresh()

    def _replaced(self, i: int, node: Node, run_id: bytes | None, marker: Reply) -> bool:
        """The data on node *i* is another server's: its marker names another node of ours (it was made a
        replica of that node, which replaced its data, then a master again), or, the same server process as
        before, it now shows a marker of another server than when last read (replicated from elsewhere).
        The keys it held are gone, whatever its uptime says."""
        named = marker.partition(b"/")[0] if isinstance(marker, bytes) else None
        seen, self._named[i] = self._named[i], named
        if named is None or run_id is None or named == run_id:
            return False
        others = {self._run_ids[j] for j in range(len(self._nodes)) if j != i}
        others.update(other.server_id for other in self._nodes if other is not node)
        return named in others or (self._run_ids[i] == run_id and named != seen)

    def _check_fresh(self) -> None:
        """A majority of nodes seen, none with a marker: a new cluster, whose nodes serve at once.

        Telling a new cluster from one where a majority lost its data at once
        takes a memory no new client has (one that knew the old servers sees
        their run_ids change); Redlock cannot survive losing a majority anyway.
        A node with a marker among those seen means the cluster was in service.
        """
        if self._fresh_checked:
            return
        if any(self._marked):
            self._fresh_checked = True
            for i in sorted(self._suspects):
                self._warn_suspect(i)
            return
        unmarked = sum(1 for seen, marked in zip(self._seen, self._marked, strict=True) if seen and marked is False)
        if unmarked < quorum(len(self._nodes)):
            return
        self._fresh_checked = True
        self._fresh_at = _clock.now()
        log.debug("redlock: a majority of nodes seen and none has a marker: a new cluster, in service now")
        for i in sorted(self._suspects):
            self._sit_out(i, 0.0, "")
            self._mark(i)
        self._suspects.clear()

    # -- sitting out --------------------------------------------------------

    def _sit_out(self, i: int, seconds: float, why: str) -> None:
        node = self._nodes[i]
        timer = self._timers.pop(i, None)
        if timer is not None:
            timer.cancel()
        if seconds <= 0:
            _release(node)
            return
        if i not in self._suspects:
            _settle(node)  # it sits out for a reason a recheck cannot lift: held yes votes are refused
        until = _clock.now() + seconds
        if node.clock_held_until > until:
            until = node.clock_held_until  # its clock's quarantine lasts longer: the clock's reason stands
        else:
            node.quarantine_reason = why or "no marker: it lost its data, or is new"
        node.quarantined_until = until
        if why:
            log.log(self._warning, "redlock node %s %s: it counts toward no quorum for %.1f s", node.name, why, seconds)
        loop = asyncio.get_running_loop()
        if i in self._suspects:
            self._timers[i] = loop.call_later(min(RECHECK_FIRST, seconds), self._recheck, i, RECHECK_FIRST)
        else:
            self._timers[i] = loop.call_later(seconds, self._served, i)

    def _warn_suspect(self, i: int) -> None:
        node = self._nodes[i]
        if node.vouching is not None:
            return  # met a moment ago: another client may be marking it now; its first recheck warns if not
        left = node.quarantined_until - _clock.now()
        log.log(
            self._warning,
            "redlock node %s has lost its data (no marker, while other nodes have theirs): "
            "it counts toward no quorum for %.1f s",
            node.name,
            left,
        )

    def _served(self, i: int) -> None:
        """The quarantine ran out: the node is in service, and says so to clients that meet it later; first,
        its fencing counters are raised from the other nodes' (it sits out until they are)."""
        self._timers.pop(i, None)
        self._suspects.discard(i)
        if self._repair is not None and self._behind[i] and i not in self._repairs:
            node = self._nodes[i]
            node.quarantined_until = math.inf
            node.quarantine_reason = "back from a restart: its fencing counters are being raised from the other nodes"
            self._repairs[i] = asyncio.get_running_loop().create_task(self._repaired(i))
            return
        self._in_service(i)

    async def _repaired(self, i: int) -> None:
        """Copy node *i*'s fencing counters from the others; then it counts again, or the copy is tried later."""
        try:
            assert self._repair is not None
            why = await self._repair(i, *self._sources(i))
        except Exception as exc:  # a bug here must not leave the node out for ever, unsaid
            why = f"{type(exc).__name__}: {exc}"
        if self._closed or self._repairs.get(i) is not asyncio.current_task():
            return  # closed, or a new connection's probe judges it again
        del self._repairs[i]
        if why is None:
            self._in_service(i)
            return
        node = self._nodes[i]
        log.log(self._info, "redlock node %s sits out a moment more: %s", node.name, why)
        node.quarantine_reason = f"back from a restart, its fencing counters not raised yet: {why}"
        self._timers[i] = asyncio.get_running_loop().call_later(REPAIR_RETRY, self._retry_repair, i)

    def _sources(self, i: int) -> tuple[list[int], int]:
        """The nodes to read node *i*'s counters from, and how many of them must answer: the others whose
        counters are whole (not behind), a majority of them. If not even every node not judged yet could make
        that majority (a majority restarted at once: nothing keeps every token then), every other node that
        is connected, as many as answer, so that the cluster comes back at all."""
        need = quorum(len(self._nodes))
        others = [j for j in range(len(self._nodes)) if j != i]
        whole = [j for j in others if self._seen[j] and not self._behind[j] and self._nodes[j].connected]
        maybe = [j for j in others if not self._seen[j] or not self._nodes[j].connected]
        if len(whole) + len(maybe) >= need:
            return whole, need
        log.log(
            self._warning,
            "redlock node %s: too few other nodes kept their data to raise its fencing counters from a majority "
            "(a majority restarted at once?): raised from the %d connected others as they are",
            self._nodes[i].name,
            sum(self._nodes[j].connected for j in others),
        )
        return [j for j in others if self._nodes[j].connected], 0

    def _retry_repair(self, i: int) -> None:
        self._timers.pop(i, None)
        if not self._closed and i not in self._repairs:
            self._repairs[i] = asyncio.get_running_loop().create_task(self._repaired(i))

    def _in_service(self, i: int) -> None:
        _release(self._nodes[i])
        log.log(self._info, "redlock node %s: quarantine over, counts again", self._nodes[i].name)
        self._mark(i)

    def _recheck(self, i: int, delay: float) -> None:
        """A node without marker: has another client judged it in service meanwhile?"""
        self._timers.pop(i, None)
        node = self._nodes[i]
        if self._closed:
            _settle(node)
            return
        if _clock.now() >= node.quarantined_until:
            self._served(i)
            return

        def answered(reply: Reply) -> None:
            if self._closed or i not in self._suspects or math.isinf(node.quarantined_until):
                return  # decided otherwise meanwhile (a new probe, the fresh-cluster check)
            if _marker_state(reply, self._run_ids[i], self._period()) is Marker.CURRENT:
                self._suspects.discard(i)
                self._marked[i] = True
                self._behind[i] = False  # that client raised its counters before it marked it
                self._sit_out(i, 0.0, "")
                log.log(self._info, "redlock node %s: marked in service by another client, counts again", node.name)
                return
            first = node.vouching is not None
            _settle(node)  # still no marker: a yes held for this recheck is refused
            if first and self._fresh_checked and not _lost(reply):
                # Not told when met: no other client marked it meanwhile either. (A broken connection's
                # next probe judges it again, and warns then.)
                self._warn_suspect(i)
            left = node.quarantined_until - _clock.now()
            later = min(delay * 2, max(left, 0.0), self._period() / 4)
            self._timers[i] = asyncio.get_running_loop().call_later(later, self._recheck, i, delay * 2)

        node.send_packed(Reaction(answered), 0, pack((b"GET", self._marker)))

    def _mark(self, i: int) -> None:
        self._marked[i] = True
        self._behind[i] = False  # counters raised (or nothing to raise: a new cluster, a period's marker)
        run_id = self._run_ids[i]
        if run_id is not None and not self._read_only:  # without INFO there is no run_id to vouch for
            self._named[i] = run_id
            # With the period it was judged under: a client with longer leases trusts it for no more.
            self._nodes[i].send(b"SET", self._marker, marker_value(run_id, self._period()))


REPLACED = "holds another server's data (it was a replica, or loaded another's data): the keys it held are gone"
"""Why a node whose marker names another server process it did not restart from sits out a whole period."""


def _release(node: Node) -> None:
    """The restart quarantine of *node* is over: it counts again, unless its clock's quarantine (the clock
    guard's, ``Node.clock_held_until``) still runs."""
    held = node.clock_held_until
    node.quarantined_until = held if held > _clock.now() else 0.0
    _settle(node)


def _settle(node: Node) -> None:
    """The recheck that yes votes of *node* were held for has decided: each holder counts them now
    (yes if the node counts again, quarantined if not; ``Node.vouching``)."""
    waiting = node.vouching
    if waiting is not None:
        node.vouching = None
        for count in waiting:
            count()


def _why(state: Marker, marker: Reply, run_id: bytes | None) -> str:
    """Why a node that is not a suspect sits out, in words (its warning, and its votes' detail)."""
    if state is Marker.STALE and isinstance(marker, bytes) and marker.partition(b"/")[0] == run_id:
        # This very server process was judged in service, but by a client with shorter leases.
        return "was vouched for only under a shorter quarantine than ours, by a client with a shorter ttl"
    if state is Marker.ABSENT:
        return "restarted, and lost its data"
    return "restarted"


def _restarted_since_marked(state: Marker, marker: Reply, run_id: bytes | None) -> bool:
    """The marker names another server process than *run_id*: the node restarted since it was marked."""
    return (
        state is Marker.STALE
        and run_id is not None
        and isinstance(marker, bytes)
        and marker.partition(b"/")[0] != run_id
    )


def marker_value(run_id: bytes, period: float) -> bytes:
    """What the marker key holds: the run_id judged in service, and the period it sat out (ms)."""
    return run_id + b"/" + str(math.ceil(period * 1000)).encode()


def _marker_state(reply: Reply, run_id: bytes | None, period: float) -> Marker:
    if isinstance(reply, Failure):
        return Marker.UNKNOWN
    if reply is None:
        return Marker.ABSENT
    if not isinstance(reply, bytes):
        return Marker.STALE
    marked_id, _, judged = reply.partition(b"/")
    if run_id is not None and marked_id != run_id:
        return Marker.STALE
    try:
        judged_ms = int(judged) if judged else 0  # a marker of an older release carries no period
    except ValueError:
        judged_ms = 0
    return Marker.CURRENT if judged_ms >= math.ceil(period * 1000) else Marker.STALE


def _lost(reply: Reply) -> bool:
    return isinstance(reply, Failure) and not reply.answered


def _server_info(reply: Reply) -> tuple[bytes | None, float | None]:
    """run_id and uptime_in_seconds from an INFO server reply; (None, None) when INFO was refused."""
    if not isinstance(reply, bytes):
        return None, None
    run_id: bytes | None = None
    uptime: float | None = None
    for line in reply.splitlines():
        key, _, value = line.partition(b":")
        if key == b"run_id":
            run_id = value.strip()
        elif key == b"uptime_in_seconds":
            try:
                uptime = float(value)
            except ValueError:
                uptime = None
    return run_id, uptime
