"""A lock's events: logged (DEBUG; WARNING for a loss) and handed to its Redlock's ``on_event``.

Nothing is built when no one listens: :func:`heard` says whether an event of a kind would be
logged or handed on, so the acquire's path works out an event's fields only when it is.
"""

from __future__ import annotations

import logging
from typing import Any

from redlock_async._core import clock as _clock
from redlock_async._rounds import Tenure, sitting_out
from redlock_async._shared import Cluster
from redlock_async.events import EventKind, LockEvent

log = logging.getLogger("redlock_async.lock")  # (the name events were always logged under)

_LOST, _NOT_ACQUIRED = EventKind.LOST, EventKind.NOT_ACQUIRED  # module globals: see lock.py's note


def heard(cluster: Cluster, kind: EventKind) -> bool:
    """True when an event of *kind* is logged or handed to on_event (else it need not be made)."""
    return cluster.on_event is not None or log.isEnabledFor(logging.WARNING if kind is _LOST else logging.DEBUG)


def emit(cluster: Cluster, tenure: Tenure, kind: EventKind, **fields: Any) -> None:
    """Log the event of *tenure*'s lock (DEBUG; WARNING for a loss) and hand it to the Redlock's on_event."""
    hook = cluster.on_event
    level = logging.WARNING if kind is _LOST else logging.DEBUG
    logged = log.isEnabledFor(level)
    if hook is None and not logged:
        return
    details = tenure.details
    quarantined: tuple[str, ...] = ()
    for node in cluster.nodes:
        if node.quarantined_until and sitting_out(node):
            quarantined += (node.name,)
    event = LockEvent(
        kind,
        tenure.label,
        grant=None if kind is _NOT_ACQUIRED else tenure.lease.serial,
        quarantined=quarantined,
        nodes=cluster.names,
        votes=tuple(tenure.votes),
        details=None if details is None else tuple(details),
        **fields,
    )
    if logged:
        log.log(level, "%s", event, extra={"redlock": event.fields()})
    if hook is not None:
        try:
            hook(event)
        except Exception:
            log.exception("redlock %r: on_event callback failed", tenure.name)


def emit_lost(cluster: Cluster, tenure: Tenure, why: str, *, watchdog: bool) -> None:
    """The ``lost`` event of *tenure*'s lock, lost for *why*."""
    emit(cluster, tenure, _LOST, held_for=_clock.now() - tenure.lease.acquired_at, reason=why, watchdog=watchdog)
