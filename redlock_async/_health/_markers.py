"""What a node's restart-quarantine marker and its INFO say (pure functions of the replies): the marker's
state for this client's server process and period, since when a watched node is watched, the node's time,
and the words for why a node sits out. The :class:`~redlock_async._health._quarantine.Quarantine` acts on them.
"""

from __future__ import annotations

import math

from redlock_async._core import Marker
from redlock_async._nodes import Failure, Reply


def why_out(state: Marker, marker: Reply, run_id: bytes | None, promoted: bool = False) -> str:
    """Why a node that is not a suspect sits out, in words (its warning, and its votes' detail)."""
    if promoted and state is not Marker.CURRENT:
        return "was a replica, promoted to master by a failover: it may lack lock keys its old master granted"
    if state is Marker.STALE and isinstance(marker, bytes) and marker.partition(b"/")[0] == run_id:
        # This very server process was judged in service, but by a client with shorter leases.
        return "was vouched for only under a shorter quarantine than ours, by a client with a shorter ttl"
    if state is Marker.ABSENT:
        return "restarted, and lost its data"
    return "restarted"


def restarted_since_marked(state: Marker, marker: Reply, run_id: bytes | None) -> bool:
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


def marker_state(reply: Reply, run_id: bytes | None, period: float) -> tuple[Marker, int | None]:
    """What the marker says of the server process *run_id*, and since when it is watched (µs, for a
    :attr:`Marker.WATCHED` one; else None)."""
    if isinstance(reply, Failure):
        return Marker.UNKNOWN, None
    if reply is None:
        return Marker.ABSENT, None
    if not isinstance(reply, bytes):
        return Marker.STALE, None
    marked_id, _, judged = reply.partition(b"/")
    if run_id is not None and marked_id != run_id:
        return Marker.STALE, None
    kind, _, since = judged.partition(b"/")
    if kind == b"since":
        watched = integer(since)
        return (Marker.STALE, None) if watched is None else (Marker.WATCHED, watched)
    judged_ms = integer(judged) or 0  # a marker of an older release carries no period
    return (Marker.CURRENT if judged_ms >= math.ceil(period * 1000) else Marker.STALE), None


def watched_for(since: int | None, node_time: int | None) -> float | None:
    """Seconds a node has been watched: from *since* to *node_time* (µs, the node's clock); None if unknown."""
    if since is None or node_time is None:
        return None
    return (node_time - since) / 1e6


def integer(value: object) -> int | None:
    try:
        return int(value) if isinstance(value, bytes | int) else None
    except ValueError:
        return None


def time_of(reply: Reply) -> int | None:
    """The node's time (µs) from a TIME reply; None when it failed."""
    if not isinstance(reply, list) or len(reply) != 2:
        return None
    seconds, micros = integer(reply[0]), integer(reply[1])
    return None if seconds is None or micros is None else seconds * 1_000_000 + micros


def lost(reply: Reply) -> bool:
    return isinstance(reply, Failure) and not reply.answered


def server_info(reply: Reply) -> tuple[bytes | None, float | None, int | None]:
    """run_id, uptime_in_seconds and server_time_usec from an INFO server reply (None for each it does not say)."""
    if not isinstance(reply, bytes):
        return None, None, None
    run_id: bytes | None = None
    uptime: float | None = None
    now: int | None = None
    for line in reply.splitlines():
        key, _, value = line.partition(b":")
        if key == b"run_id":
            run_id = value.strip()
        elif key == b"uptime_in_seconds":
            try:
                uptime = float(value)
            except ValueError:
                uptime = None
        elif key == b"server_time_usec":
            now = integer(value.strip())
    return run_id, uptime, now


def data_replaced(
    named: bytes | None, seen: bytes | None, run_id: bytes | None, known: bytes | None, others: set[bytes | None]
) -> bool:
    """The data on a node is another server's: its marker names (*named*) another node of ours (*others*:
    it was made a replica of that node, which replaced its data, then a master again), or, the same server
    process as before (*run_id* is the *known* one), it now shows a marker of another server than when last
    read (*seen*: replicated from elsewhere). The keys it held are gone, whatever its uptime says."""
    if named is None or run_id is None or named == run_id:
        return False
    return named in others or (known == run_id and named != seen)
