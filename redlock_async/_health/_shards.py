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

A shard that changed, or lost its marker, may have lost fencing counter increments too (a promoted replica
lacks those it missed): once its quarantine is over it keeps sitting out until its counters (the slots it
serves) are raised from the other voters (``_fence_repair.py``, *repair*), as a standalone node does.

Left out, beside the standalone quarantine: the watch marker (each client sits a period out from its
own first sight; docs/deployment.md says so).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redlock_async._core import Marker, sit_out
from redlock_async._core import clock as _clock
from redlock_async._health._fence_repair import Repairs
from redlock_async._health._markers import (
    lost,
    marker_state,
    marker_value,
    restarted_since_marked,
    server_info,
    why_out,
)
from redlock_async._nodes import ClusterVoter, Node, Reaction, Reply, info_fields, tag_for

log = logging.getLogger("redlock_async._quarantine")

OnReplaced = Callable[[int, Node, str], None]
"""Told when a shard of voter *i* sits out because its primary changed: (voter index, the shard, why)."""

RECHECK = 0.2
"""Seconds between looks at the other voters while a new deployment waits for their word."""

ShardRepair = Callable[[int, Node], Awaitable[str | None]]
"""Raises the fencing counters of a shard of voter *i* from the other voters: None when done, else why not."""

REPAIRING = "its primary changed: its fencing counters are being raised from the other voters"

NEW_OWNER = "serves slots another primary served before (a failover, or a new node): its keys may be missing"


@dataclass
class _Voter:
    """What the quarantine knows of one Cluster voter's shards."""

    voter: ClusterVoter
    run_ids: dict[Node, bytes] = field(default_factory=dict)
    answered: dict[Node, Marker] = field(default_factory=dict)
    timers: dict[Node, asyncio.TimerHandle] = field(default_factory=dict)


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
        if self._repairs is not None:
            self._repairs.cancel((i, shard))  # the new connection's probe judges it again
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
        run_id, uptime, _ = server_info(info)
        if run_id is not None:
            # A shard primary is its process *and* its replication id: a primary that was a replica since (its
            # data replaced by another's, then promoted back) has a new one, and its old marker vouches for nothing.
            fields = info_fields(replication) if isinstance(replication, bytes) else {}
            run_id += b"." + fields.get(b"master_replid", b"?")
        seen, _ = marker_state(marker, run_id, period)
        known = state.run_ids.get(shard)
        newcomer = known is None and shard in state.voter.newcomers and seen is not Marker.CURRENT
        restarted = known is not None and run_id is not None and run_id != known
        seconds, suspect = sit_out(
            period,
            uptime=uptime,
            known_run_id=known is not None and run_id == known,
            restarted=restarted or newcomer,
            marker=Marker.ABSENT if newcomer else seen,
            promoted=shard.promoted,
        )
        if run_id is not None:
            state.run_ids[shard] = run_id
        state.answered[shard] = seen
        changed = shard.promoted or restarted or newcomer
        if seen is not Marker.CURRENT and (
            changed or seen in (Marker.ABSENT, Marker.WATCHED) or restarted_since_marked(seen, marker, run_id)
        ):
            self._behind.add(shard)  # its fencing counters may be low: raised before it counts again
        why = NEW_OWNER if newcomer and not shard.promoted else why_out(seen, marker, run_id, shard.promoted)
        if suspect and not self._in_service:
            # Met without marker: a new deployment if no voter has one (decided once every one answered).
            self._sit_out(i, shard, period, "", run_id)
            self._decide()
            return
        self._sit_out(i, shard, seconds, why, run_id)
        if seconds and changed and self._in_service and self._on_replaced is not None:
            self._on_replaced(i, shard, f"shard {shard.name} {why}")
        if not seconds and shard in self._behind:
            self._served(i, shard, run_id)
        elif not seconds and seen is not Marker.CURRENT:
            self._mark(i, shard, run_id)
        self._decide()

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
                    if marker is Marker.ABSENT and shard.quarantined_until:
                        why = "has no marker while other voters or shards have theirs: it lost its data"
                        self._sit_out(i, shard, self._period(), why, state.run_ids.get(shard))
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

    def _sit_out(self, i: int, shard: Node, seconds: float, why: str, run_id: bytes | None) -> None:
        state = self._voters[i]
        timer = state.timers.pop(shard, None)
        if timer is not None:
            timer.cancel()
        if seconds <= 0:
            shard.quarantined_until = shard.clock_held_until  # its clock's or its evictions' hold stands
            return
        shard.quarantined_until = max(_clock.now() + seconds, shard.clock_held_until)
        shard.quarantine_reason = why or "no marker: it lost its data, or is new (the other shards are not judged yet)"
        if why:  # (else met without marker: decided once every primary answered)
            log.log(
                self._warning, "redlock shard %s %s: it counts toward no quorum for %.1f s", shard.name, why, seconds
            )
        state.timers[shard] = asyncio.get_running_loop().call_later(seconds, self._served, i, shard, run_id)

    def _served(self, i: int, shard: Node, run_id: bytes | None) -> None:
        self._voters[i].timers.pop(shard, None)
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
