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
is :func:`_algorithm.sit_out`. The cluster is new only when every node
answered and none has a marker (:meth:`Quarantine._check_fresh` says why not
a majority). Once it is in service, the first client to find a node without
marker writes the *watch* on it (the ``WATCH`` script: ``run_id/since/µs``,
the node's own time): every client, fresh processes included, ends that
node's quarantine a period after then, instead of each at its own first
sight (``redlock run`` after a restart exited 69 for as long as runs came).
The cost: two commands per (re)connect, two per recheck of a suspect, and
one attribute read per yes vote.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

from redlock_async._core import Marker, sit_out
from redlock_async._core import clock as _clock
from redlock_async._health._fence_repair import Repair, Repairs
from redlock_async._health._held import Held
from redlock_async._health._markers import (
    data_replaced,
    integer,
    lost,
    marker_state,
    marker_value,
    restarted_since_marked,
    server_info,
    time_of,
    watched_for,
    why_out,
)
from redlock_async._nodes import Node, Reaction, Reply, pack, pack_script
from redlock_async._scripts import WATCH

log = logging.getLogger("redlock_async._quarantine")  # its name before the wings: users' log settings name it

RECHECK_FIRST = 0.1
"""Seconds before a node without marker is asked again: another client may have just judged it in service."""


VOUCH_WAIT = 0.3
"""Longest a ballot holds a yes of a node met without marker, waiting for that first recheck's answer.

Two clients meeting a new cluster at the same moment: each judges it new and marks every node, but a
probe may land on a node before the other client's marker does, while the other nodes show theirs: a
suspect, in that client's view, for the instant until its recheck. Refusing its yes there failed
both clients' first tries (two ``blocking=False`` tries, one task sent twice: neither ran). A yes
held until the recheck counts once the node is judged in service, as if it had been met a moment
later; if the recheck finds no marker (it did lose its data), the yes is refused as before."""

ABSENT_REASON = "no marker: it lost its data, or is new"
WATCHED_REASON = "it lost its data: found without marker by a client, it sits out a period from then"


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
        elsewhere: Callable[[], bool | None] | None = None,
    ) -> None:
        self._marker = marker
        self._elsewhere = elsewhere  # the Cluster voters' word on a new deployment (suspects' rechecks ask again)
        # A node whose quarantine is over first gets its fencing counters back (docs/fencing.md).
        self._repairs: Repairs[int] | None = None
        if not read_only and repair is not None:
            self._repairs = Repairs(repair, lambda i: self._nodes[i], self._counts_again, read_only)
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
        self._unknown = [False] * n  # could not be reached before its first probe, or its marker not read
        self._watched: list[int | None] = [None] * n  # since when its watch marker says it is watched (µs)
        self._suspects: set[int] = set()
        self._unmarked: set[int] = set()  # seen without any marker: watched once the cluster is in service
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._in_service = False  # judged: a new cluster (marked now), or one in service already
        self._closed = False

    def close(self) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._repairs is not None:
            self._repairs.close()
        for node in self._nodes:
            _settle(node)

    # -- the probe --------------------------------------------------------

    def on_ready(self, node: Node) -> None:
        """A new connection to *node*: count nothing from it until the probe is answered."""
        node.quarantined_until = math.inf
        if self._repairs is not None:
            self._repairs.cancel(self._nodes.index(node))  # the new connection's probe judges it again
        _settle(node)  # votes held for the last connection's recheck count for nothing now
        # Replies come in order: when the marker's is in, so is INFO's. Both are read the moment
        # they are parsed, before any vote that follows them on this connection is counted.
        info: list[Reply] = []
        node.send_first(
            (Reaction(info.append), (b"INFO", b"server")),
            (Reaction(lambda marker: self._probed(node, info[0], marker)), (b"GET", self._marker)),
        )

    def on_unreachable(self, node: Node) -> None:
        """A connection to *node* could not be made: before its first probe, the cluster cannot be judged new."""
        i = self._nodes.index(node)
        if self._closed or self._in_service or self._seen[i]:
            return
        self._unknown[i] = True
        self._check_fresh()

    def _probed(self, node: Node, info: Reply, marker: Reply) -> None:
        if self._closed or lost(info) or lost(marker):
            return  # the connection broke under the probe: the next one probes again
        i = self._nodes.index(node)
        run_id, uptime, node_time = server_info(info)
        state, since = marker_state(marker, run_id, self._period())
        known = self._run_ids[i]
        seconds, suspect = sit_out(
            self._period(),
            uptime=uptime,
            known_run_id=known is not None and run_id == known,
            restarted=known is not None and run_id is not None and run_id != known,
            marker=state,
            watched=watched_for(since, node_time),
            promoted=node.promoted,
        )
        replaced = self._replaced(i, node, run_id, marker)
        if replaced:
            seconds, suspect = self._period(), False
        if run_id is not None:
            self._run_ids[i] = run_id
        self._seen[i] = True
        self._behind[i] = state is not Marker.CURRENT and (
            node.promoted
            or state in (Marker.ABSENT, Marker.WATCHED)
            or (known is not None and run_id is not None and run_id != known)
            or restarted_since_marked(state, marker, run_id)
        )
        self._marked[i] = None if state is Marker.UNKNOWN else state is not Marker.ABSENT
        self._unknown[i] = state is Marker.UNKNOWN
        self._watched[i] = since
        if state is Marker.ABSENT:
            self._unmarked.add(i)
        else:
            self._unmarked.discard(i)
        if suspect:
            self._suspects.add(i)
            if known is None and node.vouching is None:
                # Met for the first time without marker (or watched), while others have theirs: it may be
                # marked in service by another client this very moment. Its yes votes wait for the first recheck.
                node.vouching = Held(node, self._marker, partial(self._confirmed, i, node))
                node.vouch_until = _clock.now() + VOUCH_WAIT
        else:
            self._suspects.discard(i)
        why = REPLACED if replaced else "" if suspect else why_out(state, marker, run_id, node.promoted)
        self._sit_out(i, seconds, why)
        if not seconds and (state is Marker.WATCHED or restarted_since_marked(state, marker, run_id)):
            # Its watch ran out, or it is back with its data (a snapshot) longer than a quarantine ago, marked
            # in service by no client since: its counters may be behind; raised from the others before it counts.
            self._served(i)
        elif not seconds and state is not Marker.CURRENT and run_id is not None:
            self._mark(i)
        if self._in_service:
            if state is Marker.ABSENT:
                self._watch(i)
            if suspect:
                _warn_suspect(self._nodes[i], self._watched[i], self._warning)
        self._check_fresh()

    def _replaced(self, i: int, node: Node, run_id: bytes | None, marker: Reply) -> bool:
        """The data on node *i* is another server's (see `data_replaced`); remembers whom its marker names."""
        named = marker.partition(b"/")[0] if isinstance(marker, bytes) else None
        seen, self._named[i] = self._named[i], named
        others = {self._run_ids[j] for j in range(len(self._nodes)) if j != i}
        others.update(other.server_id for other in self._nodes if other is not node)
        return data_replaced(named, seen, run_id, self._run_ids[i], others)

    def _check_fresh(self) -> None:
        """Every node answered, none with a marker, and the Cluster voters' shards none either (*elsewhere*):
        a new cluster, whose nodes serve at once (:func:`fresh_state` says why nothing less will do)."""
        if self._in_service:
            return
        elsewhere = False if self._elsewhere is None else self._elsewhere()
        if any(self._marked) or any(self._unknown) or elsewhere:
            self._in_service = True
            for i in sorted(self._unmarked):
                self._watch(i)  # each sits out a period from the moment it is watched, for every client alike
            for i in sorted(self._suspects):
                _warn_suspect(self._nodes[i], self._watched[i], self._warning)
            return
        if elsewhere is None or self.state() is not False:
            return
        self._in_service = True
        log.debug("redlock: every node answered and none has a marker: a new cluster, in service now")
        for i in sorted(self._suspects):
            self._unmarked.discard(i)
            self._sit_out(i, 0.0, "")
            self._mark(i)
        self._suspects.clear()
        for i in sorted(self._unmarked):
            self._watch(i)  # seen to restart meanwhile: it sits out all the same

    def judged(self, i: int) -> tuple[bool, bool]:
        """Node *i*, as the fencing counters' repair reads it: seen (its probe answered), and behind (it lost
        its counters since it was last marked in service, and they were not raised since)."""
        return self._seen[i], self._behind[i]

    def state(self) -> bool | None:
        """Its own nodes' word on a new deployment: True in service, False new, None not all answered yet."""
        return fresh_state(self._seen, self._marked, self._unknown)

    # -- the watch ---------------------------------------------------------

    def _watch(self, i: int) -> None:
        """Node *i* has no marker and the cluster is in service: write, unless a marker is there by now,
        since when it is watched (in the node's time), so every client ends its quarantine at once."""
        if self._read_only or self._closed:
            return
        keys = (self._marker,)
        # (Not loaded on connect: the first watch after a server's restart goes out again as EVAL.)
        self._nodes[i].send_packed(
            Reaction(partial(self._watch_set, i)), 0, pack_script(WATCH, keys, ()), fallback=(WATCH, keys, ())
        )

    def _watch_set(self, i: int, reply: Reply) -> None:
        """The watch's answer: the marker node *i* holds now, and its time."""
        node = self._nodes[i]
        if self._closed or not isinstance(reply, list) or len(reply) != 2 or math.isinf(node.quarantined_until):
            return  # closed, failed (the next probe or recheck judges the node again), or a new probe out
        marker, now = reply
        state, since = marker_state(marker, self._run_ids[i], self._period())
        if state is Marker.CURRENT:
            if i in self._suspects:  # (one known to have restarted trusts no client's judgement: sit_out)
                self._vouched(i)
        elif state is Marker.WATCHED:
            self._watched_until(i, since, integer(now))

    def _watched_until(self, i: int, since: int | None, node_time: int | None) -> None:
        """Node *i*'s marker says it is watched since *since*: it sits out until a period after then."""
        self._unmarked.discard(i)
        self._marked[i] = True
        self._watched[i] = since
        seconds, suspect = sit_out(
            self._period(),
            uptime=None,
            known_run_id=True,
            restarted=False,
            marker=Marker.WATCHED,
            watched=watched_for(since, node_time),
        )
        if not suspect:
            self._sit_out(i, 0.0, "")
            self._served(i)
            return
        node = self._nodes[i]
        until = _clock.now() + seconds
        if until >= node.clock_held_until:
            node.quarantine_reason = WATCHED_REASON
        node.quarantined_until = max(until, node.clock_held_until)
        if i not in self._suspects:
            # Not rechecked (it restarted, to this client's knowledge): served when the watch ends.
            timer = self._timers.pop(i, None)
            if timer is not None:
                timer.cancel()
            self._timers[i] = asyncio.get_running_loop().call_later(seconds, self._served, i)

    def _confirmed(self, i: int, node: Node, marker: Reply) -> None:
        """The marker read right behind a held yes of suspect *i* (``_held``): a current one counts it now."""
        if self._closed or node.vouching is None or i not in self._suspects or math.isinf(node.quarantined_until):
            return  # decided meanwhile (its recheck, a new probe), or closed
        if marker_state(marker, self._run_ids[i], self._period())[0] is Marker.CURRENT:
            self._vouched(i)

    def _vouched(self, i: int) -> None:
        """Another client judged node *i* in service under its current run_id: it counts again at once."""
        self._suspects.discard(i)
        self._unmarked.discard(i)
        self._marked[i] = True
        self._behind[i] = False  # that client raised its counters before it marked it
        self._sit_out(i, 0.0, "")
        log.log(self._info, "redlock node %s: marked in service by another client, counts again", self._nodes[i].name)

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
            node.quarantine_reason = why or (ABSENT_REASON if self._watched[i] is None else WATCHED_REASON)
        node.quarantined_until = until
        if why:
            log.log(self._warning, "redlock node %s %s: it counts toward no quorum for %.1f s", node.name, why, seconds)
        loop = asyncio.get_running_loop()
        if i in self._suspects:
            self._timers[i] = loop.call_later(min(RECHECK_FIRST, seconds), self._recheck, i, RECHECK_FIRST)
        else:
            self._timers[i] = loop.call_later(seconds, self._served, i)

    def _served(self, i: int) -> None:
        """The quarantine ran out: the node is in service, and says so to clients that meet it later; first,
        its fencing counters are raised from the other nodes' (it sits out until they are)."""
        self._timers.pop(i, None)
        self._suspects.discard(i)
        if self._repairs is not None and self._behind[i] and not self._repairs.running(i):
            node = self._nodes[i]
            node.quarantined_until = math.inf
            node.quarantine_reason = "back from a restart: its fencing counters are being raised from the other nodes"
            self._repairs.start(i)
            return
        self._counts_again(i)

    def _counts_again(self, i: int) -> None:
        _release(self._nodes[i])
        log.log(self._info, "redlock node %s: quarantine over, counts again", self._nodes[i].name)
        self._watched[i] = None
        self._mark(i)  # (over a watch: in quarantine no more, but in service)

    def _recheck(self, i: int, delay: float) -> None:
        """A suspect: has another client judged it in service meanwhile, or its watch ended?"""
        self._timers.pop(i, None)
        node = self._nodes[i]
        if self._closed:
            _settle(node)
            return
        if _clock.now() >= node.quarantined_until:
            self._served(i)
            return
        times: list[Reply] = []

        def answered(reply: Reply) -> None:
            if self._closed or i not in self._suspects or math.isinf(node.quarantined_until):
                return  # decided otherwise meanwhile (a new probe, the fresh-cluster check)
            state, since = marker_state(reply, self._run_ids[i], self._period())
            if state is Marker.CURRENT:
                self._vouched(i)
                return
            if state is Marker.WATCHED and since != self._watched[i]:
                self._watched_until(i, since, time_of(times[0]) if times else None)
            elif state is Marker.ABSENT:
                self._marked[i] = False
                self._watched[i] = None
                self._unmarked.add(i)
                if self._in_service:
                    self._watch(i)  # its watch was lost with its data (or not written yet)
            self._check_fresh()
            if i not in self._suspects:
                return  # its watch had run out
            first = node.vouching is not None
            # Not judged yet (a node has not answered): a held yes waits for that, or for the hold's end.
            if self._in_service or not first:
                _settle(node)  # still no marker of a client that judged it in service: a held yes is refused
                if first and not lost(reply):
                    # Not told when met: no other client marked it meanwhile either. (A broken connection's
                    # next probe judges it again, and warns then.)
                    _warn_suspect(self._nodes[i], self._watched[i], self._warning)
            left = node.quarantined_until - _clock.now()
            later = min(delay * 2, max(left, 0.0), self._period() / 4)
            self._timers[i] = asyncio.get_running_loop().call_later(later, self._recheck, i, delay * 2)

        node.send_packed(Reaction(times.append), 0, pack((b"TIME",)))
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


def fresh_state(seen: Sequence[bool], marked: Sequence[bool | None], unknown: Sequence[bool]) -> bool | None:
    """True: in service (a marker, or a node not reached or not read); False: new (every node answered
    without marker); None: not every node answered yet.

    A node with a marker (of any kind) means the cluster was in service. So does a node that
    could not be reached, or whose marker could not be read: it may hold keys granted by a
    majority of which the nodes seen without marker lost theirs. A majority of nodes without
    marker is not enough: nodes never marked (down when the cluster went into service, and met
    by no client since) and one that lost its data can make a majority beside a holder's nodes.
    Telling a new cluster from one where every node lost its data takes a memory no new client
    has (one that knew the old servers sees their run_ids change); Redlock cannot survive a
    majority losing its data anyway. The same holds across voters: a Cluster voter's shards count
    as nodes here (``ShardQuarantine.state``), and a voter of either kind is new only if all are.
    """
    if any(marked) or any(unknown):
        return True
    if all(one and mark is False for one, mark in zip(seen, marked, strict=True)):
        return False
    return None


def _warn_suspect(node: Node, watched: int | None, level: int) -> None:
    """Node *node* is a suspect (no marker, or a watch since *watched*) of a cluster in service: say so."""
    if node.vouching is not None:
        return  # met a moment ago: another client may be marking it now; its first recheck warns if not
    left = node.quarantined_until - _clock.now()
    how = "no marker, while other nodes have theirs" if watched is None else "found without marker"
    said = "redlock node %s has lost its data (%s): it counts toward no quorum for %.1f s"
    log.log(level, said, node.name, how, left)


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
