"""The restart quarantine of a Cluster voter's shards: a shard whose primary changed is a restarted node.

A promoted replica that lacks keys its old primary granted is exactly a node restarted empty. So each
shard primary of a ``redis+cluster://`` voter (``_nodes/_cluster_voter.py``) is probed on every new
connection as a standalone node is (``_quarantine.py``): ``INFO server`` and the GET of a marker key,
before any of its votes, and judged by the same rule, :func:`_algorithm.sit_out`:

* a primary that was a replica since it started (the handshake's ``promoted``: its ``master_replid2``)
  sits out the whole period, unless a client marked it in service under its own run id since;
* a primary met serving slots that another primary served before (a failover seen as it happens, a new
  node given slots) is a restart of that shard: no marker of its own, the whole period;
* a primary this client knew under another run id restarted;
* a primary without marker while the voter's other shards have theirs lost its data: the whole period
  (no recheck). A deployment where no voter has a marker (no shard, no standalone node: :meth:`state`
  and ``Quarantine.state`` ask each other) is new: its shards serve at once and are marked.

A shard primary's identity is its run id *and* its replication id (``master_replid``): a primary that was
demoted and promoted back has a new replication id, so the marker it kept (or got back from the replica
that served meanwhile) no longer vouches for it, and its voter re-judges such a connection when a map
reading finds the id changed (``_cluster_voter.py``).

Each shard's marker key hashes to the lowest slot it serves (``key_prefix`` and a hash tag). Only
that shard sits out (its ``quarantined_until``): a vote of the voter counts the quarantine of the shard
that answered it. When a shard sits out because it changed, *on_replaced* is told at once (the Redlock
drops it from the locks whose names it serves).

The watch, as on a standalone node: the first client to judge a shard replaced (promoted, a new owner of
its slots) or without its data, once the deployment is in service, writes on its marker key since when it
is watched (the ``WATCH_SHARD`` script: ``run_id.master_replid/since/µs``, the primary's own time, unless
the marker names this very shard by now). Every client that reads it, at the probe or from the script's
answer, sits the shard out until a period after then (:func:`sit_out`, converted by the primary's time in
the same reply), so a client or a fresh process met later ends the quarantine with the first, not a period
after its own sight. The watch names the replication id too: a primary demoted and promoted back is not
vouched for by the watch it kept. When the watch ends, its marker is read again before the shard counts:
gone (a loss since took it), the shard sits out a new period, watched again.

A shard that changed, or lost its marker, may have lost fencing counter increments too (a promoted replica
lacks those it missed): once its quarantine (or watch) is over it keeps sitting out until its counters (the
slots it serves) are raised from the other voters (``_fence_repair.py``, *repair*), as a standalone node does.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from redlock_async._core import Marker, sit_out
from redlock_async._core import clock as _clock
from redlock_async._health._fence_repair import Repairs
from redlock_async._health._markers import (
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
from redlock_async._nodes import ClusterVoter, Node, Reaction, Reply, info_fields, pack, pack_script, tag_for
from redlock_async._scripts import WATCH_SHARD

log = logging.getLogger("redlock_async._quarantine")

OnReplaced = Callable[[int, Node, str], None]
"""Told when a shard of voter *i* sits out because its primary changed: (voter index, the shard, why)."""

RECHECK = 0.2
"""Seconds between looks at the other voters while a new deployment waits for their word."""

ShardRepair = Callable[[int, Node], Awaitable[str | None]]
"""Raises the fencing counters of a shard of voter *i* from the other voters: None when done, else why not."""

REPAIRING = "its primary changed: its fencing counters are being raised from the other voters"

NEW_OWNER = "serves slots another primary served before (a failover, or a new node): its keys may be missing"
WATCHED = "was found replaced or without its data by a client: it sits out a period from then, for every client"
NOT_JUDGED = "no marker: it lost its data, or is new (the other shards are not judged yet)"
LOST_AGAIN = "lost its watch while it sat out: it lost its data again"


@dataclass
class _Voter:
    """What the quarantine knows of one Cluster voter's shards."""

    voter: ClusterVoter
    run_ids: dict[Node, bytes] = field(default_factory=dict)
    answered: dict[Node, Marker] = field(default_factory=dict)
    timers: dict[Node, asyncio.TimerHandle] = field(default_factory=dict)
    watches: dict[Node, int | None] = field(default_factory=dict)  # sits out under a watch since (µs, its time)
    unwatched: set[Node] = field(default_factory=set)  # judged replaced before the deployment was judged in service


class ShardQuarantine:
    """Per Redlock: the shard primaries of its Cluster voters, judged on each connect."""

    def __init__(
        self,
        marker: bytes,
        period: Callable[[], float],
        voters: Sequence[tuple[int, ClusterVoter]],
        *,
        read_only: bool = False,
        on_replaced: OnReplaced | None = None,
        elsewhere: Callable[[], bool | None] | None = None,
        repair: ShardRepair | None = None,
    ) -> None:
        self._marker = marker
        # A shard that may have lost counter increments gets them back before it counts again (docs/fencing.md).
        self._behind: set[Node] = set()
        self._repairs: Repairs[tuple[int, Node]] | None = None
        if repair is not None and not read_only:
            self._repairs = Repairs(lambda key: repair(*key), lambda key: key[1], self._repaired, read_only)
        # The standalone voters' word on a new deployment (``Quarantine.state``): new only if they are new too.
        self._elsewhere = elsewhere
        self._in_service = False  # judged: a new deployment (marked now), or one in service already
        self._asking: asyncio.TimerHandle | None = None  # the next look while the other voters are not all in
        self._period = period
        self._voters = {i: _Voter(voter) for i, voter in voters}
        self._read_only = read_only
        self._on_replaced = on_replaced
        self._warning = logging.DEBUG if read_only else logging.WARNING
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if self._repairs is not None:
            self._repairs.close()
        if self._asking is not None:
            self._asking.cancel()
        for state in self._voters.values():
            for timer in state.timers.values():
                timer.cancel()
            state.timers.clear()

    def marker_key(self, i: int, shard: Node) -> bytes:
        """The marker key of *shard* of voter *i*: it hashes to a slot the shard served when first met."""
        slot = self._voters[i].voter.slot_of(shard)
        return self._marker + tag_for(slot or 0)

    def on_ready(self, i: int, shard: Node) -> None:
        """A new connection to *shard* of voter *i*: nothing of it counts until the probe is answered."""
        shard.quarantined_until = math.inf
        timer = self._voters[i].timers.pop(shard, None)
        if timer is not None:
            timer.cancel()  # the last connection's quarantine ends no more: this probe judges it again
        if self._repairs is not None:
            self._repairs.cancel((i, shard))  # nor its repair
        info: list[Reply] = []
        shard.send_first(
            (Reaction(info.append), (b"INFO", b"server")),
            (Reaction(info.append), (b"INFO", b"replication")),
            (Reaction(lambda marker: self._probed(i, shard, info, marker)), (b"GET", self.marker_key(i, shard))),
        )

    def _probed(self, i: int, shard: Node, infos: list[Reply], marker: Reply) -> None:
        info, replication = infos
        if self._closed or lost(info) or lost(replication) or lost(marker):
            return  # the connection broke under the probe: the next one probes again
        state = self._voters[i]
        period = self._period()
        run_id, uptime, node_time = server_info(info)
        if run_id is not None:
            # A shard primary is its process *and* its replication id: a primary that was a replica since (its
            # data replaced by another's, then promoted back) has a new one, and its old marker vouches for nothing.
            fields = info_fields(replication) if isinstance(replication, bytes) else {}
            run_id += b"." + fields.get(b"master_replid", b"?")
        seen, since = marker_state(marker, run_id, period)
        known = state.run_ids.get(shard)
        # (A watch names this very shard: whichever client judged it replaced, the same end for all.)
        newcomer = known is None and shard in state.voter.newcomers and seen not in (Marker.CURRENT, Marker.WATCHED)
        restarted = known is not None and run_id is not None and run_id != known
        seconds, suspect = sit_out(
            period,
            uptime=uptime,
            known_run_id=known is not None and run_id == known,
            restarted=restarted or newcomer,
            marker=Marker.ABSENT if newcomer else seen,
            watched=watched_for(since, node_time),
            promoted=shard.promoted,
        )
        if run_id is not None:
            state.run_ids[shard] = run_id
        state.answered[shard] = seen
        state.watches.pop(shard, None)
        if seen is Marker.WATCHED and seconds:
            state.watches[shard] = since  # rechecked when it ends: a loss since takes the watch away
        changed = shard.promoted or restarted or newcomer
        if seen is not Marker.CURRENT and (
            changed or seen in (Marker.ABSENT, Marker.WATCHED) or restarted_since_marked(seen, marker, run_id)
        ):
            self._behind.add(shard)  # its fencing counters may be low: raised before it counts again
        why = NEW_OWNER if newcomer and not shard.promoted else why_out(seen, marker, run_id, shard.promoted)
        if seen is Marker.WATCHED and not shard.promoted:
            why = WATCHED
        if suspect and seen is Marker.ABSENT and not self._in_service:
            # Met without marker: a new deployment if no voter has one (decided once every one answered).
            self._sit_out(i, shard, period, "", run_id)
            self._decide()
            return
        self._sit_out(i, shard, seconds, why, run_id)
        if seconds and changed and self._in_service and self._on_replaced is not None:
            self._on_replaced(i, shard, f"shard {shard.name} {why}")
        state.unwatched.discard(shard)
        if not seconds and shard in self._behind:
            self._served(i, shard, run_id)
        elif not seconds and seen is not Marker.CURRENT:
            self._mark(i, shard, run_id)
        elif seen is Marker.ABSENT or (seen is Marker.STALE and (shard.promoted or newcomer)):
            # Judged replaced or empty, a whole period from this sight: the first client's sight counts for all
            # (once the deployment is judged in service: a new one's shards are marked instead).
            state.unwatched.add(shard)
        self._decide()
        if self._in_service and shard in state.unwatched:
            state.unwatched.discard(shard)
            self._watch(i, shard, run_id)

    def judged(self, i: int, shard: Node) -> tuple[bool, bool]:
        """*shard* of voter *i*, as the fencing counters' repair reads it: seen (its probe answered), and behind
        (it may have lost counters since it was last marked in service, and they were not raised since)."""
        return shard in self._voters[i].answered, shard in self._behind

    def state(self) -> bool | None:
        """The Cluster voters' own word on a new deployment: True in service (a shard primary with a marker,
        or whose marker could not be read), False new (every primary of every voter answered without one),
        None not all answered yet (``Quarantine.fresh_state`` says why nothing less will do)."""
        answered = [marker for state in self._voters.values() for marker in state.answered.values()]
        if any(marker is not Marker.ABSENT for marker in answered):
            return True
        for state in self._voters.values():
            primaries = state.voter.primaries()
            if not primaries or any(shard not in state.answered for shard in primaries):
                return None
        return False

    def _decide(self) -> None:
        """Judge a new deployment: in service once any voter says so; new once every one says new (each
        shard met without marker then serves at once, marked); until then, looked at again shortly."""
        if self._in_service or self._closed:
            return
        mine = self.state()
        theirs = False if self._elsewhere is None else self._elsewhere()
        if mine or theirs:
            self._in_service = True
            for i, state in self._voters.items():
                for shard, marker in state.answered.items():
                    if marker is Marker.ABSENT and shard.quarantined_until and shard not in state.unwatched:
                        why = "has no marker while other voters or shards have theirs: it lost its data"
                        self._sit_out(i, shard, self._period(), why, state.run_ids.get(shard))
                        state.unwatched.add(shard)
                # Each judged replaced or empty sits out a period from the first client's sight, for every client.
                for shard in list(state.unwatched):
                    state.unwatched.discard(shard)
                    self._watch(i, shard, state.run_ids.get(shard))
            return
        if mine is None or theirs is None:
            if self._asking is None or self._asking.cancelled():
                self._asking = asyncio.get_running_loop().call_later(RECHECK, self._look_again)
            return
        self._in_service = True
        for i, state in self._voters.items():
            for shard in state.voter.primaries():
                self._sit_out(i, shard, 0.0, "", state.run_ids.get(shard))
                self._mark(i, shard, state.run_ids.get(shard))

    def _look_again(self) -> None:
        self._asking = None
        self._decide()

    # -- the watch ---------------------------------------------------------

    def _watch(self, i: int, shard: Node, run_id: bytes | None) -> None:
        """*shard* sits out a period from now, judged replaced or empty: write, unless its marker names this very
        shard by now, since when it is watched (its own time), so every client ends its quarantine then."""
        if run_id is None or self._read_only or self._closed:
            return
        keys = (self.marker_key(i, shard),)
        shard.send_packed(
            Reaction(partial(self._watch_set, i, shard, run_id)),
            0,
            pack_script(WATCH_SHARD, keys, ()),
            fallback=(WATCH_SHARD, keys, ()),
        )

    def _watch_set(self, i: int, shard: Node, run_id: bytes, reply: Reply) -> None:
        """The watch's answer: the marker *shard* holds now, and its time."""
        if not isinstance(reply, list) or len(reply) != 2:
            return  # failed: it sits out the period from this client's sight (the next probe judges it again)
        marker, now = reply
        self._watched(i, shard, run_id, marker, integer(now))

    def _recheck(self, i: int, shard: Node, run_id: bytes) -> None:
        """The watch *shard* sat out under ends: read its marker (and its time) again before it counts."""
        times: list[Reply] = []
        shard.send_packed(Reaction(times.append), 0, pack((b"TIME",)))
        answered = partial(self._rechecked, i, shard, run_id, times)
        shard.send_packed(Reaction(answered), 0, pack((b"GET", self.marker_key(i, shard))))

    def _rechecked(self, i: int, shard: Node, run_id: bytes, times: list[Reply], marker: Reply) -> None:
        state = self._voters[i]
        if self._closed or lost(marker) or math.isinf(shard.quarantined_until) or state.timers.get(shard) is not None:
            return  # closed, the connection broke (its next probe judges it), or judged again meanwhile
        if state.run_ids.get(shard) != run_id:
            return
        named = marker.partition(b"/")[0] if isinstance(marker, bytes) else None
        if marker is None or (named is not None and named != run_id):
            # Its watch is gone (or another shard's marker came): it lost its data while it sat out.
            self._sit_out(i, shard, self._period(), LOST_AGAIN, run_id)
            self._watch(i, shard, run_id)
            return
        self._watched(i, shard, run_id, marker, time_of(times[0]) if times else None)

    def _watched(self, i: int, shard: Node, run_id: bytes, marker: Reply, node_time: int | None) -> None:
        """*shard*'s marker read (or written) at *node_time*: under a watch, it sits out until a period after the
        watch began (the rule of :func:`sit_out`); marked in service under this very shard, it counts now."""
        state = self._voters[i]
        if self._closed or math.isinf(shard.quarantined_until) or state.run_ids.get(shard) != run_id:
            return  # closed, a new probe out, or another shard behind this connection now
        seen, since = marker_state(marker, run_id, self._period())
        if seen is Marker.WATCHED:
            seconds, _ = sit_out(
                self._period(),
                uptime=None,
                known_run_id=True,
                restarted=False,
                marker=Marker.WATCHED,
                watched=watched_for(since, node_time),
            )
            if seconds > 0:
                self._sit_out(i, shard, seconds, None, run_id)
                state.watches[shard] = since
                return
        elif seen is not Marker.CURRENT and shard not in state.watches:
            return  # (the watch wrote nothing: a marker of this shard under a shorter period) its own sight's end
        state.watches.pop(shard, None)
        self._served(i, shard, run_id)

    # -- sitting out --------------------------------------------------------

    def _sit_out(self, i: int, shard: Node, seconds: float, why: str | None, run_id: bytes | None) -> None:
        """*shard* sits out *seconds* from now (*why*: None keeps the reason given, and says nothing)."""
        state = self._voters[i]
        timer = state.timers.pop(shard, None)
        if timer is not None:
            timer.cancel()
        if seconds <= 0:
            state.watches.pop(shard, None)
            shard.quarantined_until = shard.clock_held_until  # its clock's or its evictions' hold stands
            return
        shard.quarantined_until = max(_clock.now() + seconds, shard.clock_held_until)
        if why is not None:
            shard.quarantine_reason = why or NOT_JUDGED
        if why:  # (else met without marker: decided once every primary answered)
            log.log(
                self._warning, "redlock shard %s %s: it counts toward no quorum for %.1f s", shard.name, why, seconds
            )
        state.timers[shard] = asyncio.get_running_loop().call_later(seconds, self._served, i, shard, run_id)

    def _served(self, i: int, shard: Node, run_id: bytes | None) -> None:
        state = self._voters[i]
        state.timers.pop(shard, None)
        if shard in state.watches and run_id is not None and not self._closed:
            # Its watch ends: is it still there (nothing lost since)? It sits out until the answer is in.
            shard.quarantined_until = max(shard.quarantined_until, _clock.now() + self._period())
            self._recheck(i, shard, run_id)
            return
        if self._repairs is not None and shard in self._behind:
            # Its fencing counters first: it sits out until they are raised (tried again until they are).
            shard.quarantined_until = math.inf
            shard.quarantine_reason = REPAIRING
            self._repairs.start((i, shard))
            return
        self._counts_again(i, shard, run_id)

    def _repaired(self, key: tuple[int, Node]) -> None:
        i, shard = key
        self._behind.discard(shard)
        self._counts_again(i, shard, self._voters[i].run_ids.get(shard))

    def _counts_again(self, i: int, shard: Node, run_id: bytes | None) -> None:
        shard.quarantined_until = shard.clock_held_until
        log.log(self._warning, "redlock shard %s: quarantine over, counts again", shard.name)
        self._mark(i, shard, run_id)

    def _mark(self, i: int, shard: Node, run_id: bytes | None) -> None:
        self._behind.discard(shard)  # counters raised (or nothing to raise: a new deployment, a period's marker)
        if run_id is None or self._read_only or self._closed:
            return
        shard.send(b"SET", self.marker_key(i, shard), marker_value(run_id, self._period()))
