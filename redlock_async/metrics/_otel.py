"""OpenTelemetry metrics and traces for ``Redlock(on_event=OpenTelemetry())``, through ``opentelemetry-api``.

Traces: one span per acquire, ``redlock.acquire``, made when the acquire ends (its events
carry its duration) with its real start time. The acquire runs in the caller's task, and
its event is handed over in that task too, so the OpenTelemetry context is still the
caller's: the span's parent is the caller's span. The caller's span is remembered for each
grant, and when the lock is lost (often in the watchdog's task, whose context is no
caller's) the loss is told there as a span event, ``redlock.lock.lost``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.util.types import AttributeValue

from redlock_async import __version__
from redlock_async.events import LockEvent
from redlock_async.metrics._meter import (
    ACQUIRE_BUCKETS,
    GRANTS_REMEMBERED,
    HOLD_BUCKETS,
    MARGIN_BUCKETS,
    EventMeter,
    NameAttribute,
)

__all__ = ["OpenTelemetry"]

SCOPE = "redlock_async"
"""The instrumentation scope of the meter and the tracer."""


@final
class OpenTelemetry(EventMeter):
    """Lock metrics and traces through OpenTelemetry (the global providers unless given).

    Pass it as ``Redlock(..., on_event=OpenTelemetry())``; one instance serves any number
    of Redlocks. *traces*: make a span per acquire (and a span event when a held lock is
    lost); False for metrics only. *name_attribute* adds a ``redlock.lock.group`` attribute
    to the lock metrics, with the group it maps each lock's name to. Spans carry the lock's
    full name (``redlock.lock.name``): a span is one operation, not a series. The instruments
    are in docs/metrics.md.
    """

    def __init__(
        self,
        *,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        traces: bool = True,
        name_attribute: NameAttribute | None = None,
    ) -> None:
        super().__init__(name_attribute)
        if not isinstance(traces, bool):
            raise TypeError(f"traces must be True or False, got {type(traces).__name__}")
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider) if traces else None
        self._acquire = meter.create_histogram(
            "redlock.lock.acquire.duration",
            unit="s",
            description="Time from an acquire's call to its grant or give-up.",
            explicit_bucket_boundaries_advisory=ACQUIRE_BUCKETS,
        )
        self._hold = meter.create_histogram(
            "redlock.lock.hold.duration",
            unit="s",
            description="Time from a lock's grant to its release or loss.",
            explicit_bucket_boundaries_advisory=HOLD_BUCKETS,
        )
        self._margin = meter.create_histogram(
            "redlock.lock.extension.margin",
            unit="s",
            description="Validity the old lease still had when an extension was confirmed (near 0: nearly lost).",
            explicit_bucket_boundaries_advisory=MARGIN_BUCKETS,
        )
        self._handoff = meter.create_histogram(
            "redlock.lock.handoff.duration",
            unit="s",
            description="Time from a release waking a waiter of this process to that waiter's grant.",
            explicit_bucket_boundaries_advisory=ACQUIRE_BUCKETS,
        )
        # Counters and gauges: counted in plain Python at each event (EventMeter), observed at collection.
        meter.create_observable_counter(
            "redlock.lock.lost", [self._observe_lost], unit="{lock}", description="Held locks that were lost."
        )
        meter.create_observable_counter(
            "redlock.node.votes",
            [self._observe_votes],
            unit="{vote}",
            description="Per-node votes of the requests that decided acquires (their last attempt), "
            "extensions and releases.",
        )
        meter.create_observable_up_down_counter(
            "redlock.lock.held", [self._observe_held], unit="{lock}", description="Locks held now."
        )
        meter.create_observable_up_down_counter(
            "redlock.node.quarantined",
            [self._observe_quarantined],
            unit="{node}",
            description="Nodes in restart quarantine now (their yes votes count toward no quorum).",
        )
        # Attribute dicts made once and reused: the SDK reads them, never keeps or changes them.
        self._outcome_attributes: dict[tuple[str, str | None], dict[str, AttributeValue]] = {}
        self._group_attributes: dict[str | None, dict[str, AttributeValue] | None] = {None: None}
        # grant -> the span that was current when it was granted (the caller's), to tell of a loss
        self._callers: dict[int, trace.Span] = {}

    def _group_of(self, group: str | None) -> dict[str, AttributeValue] | None:
        """The attributes of a lock metric (None without name_attribute: the SDK's cheapest path)."""
        if group is None:
            return None
        attributes = self._group_attributes.get(group)
        if attributes is None:
            attributes = self._group_attributes[group] = {"redlock.lock.group": group}
        return attributes

    # -- at each event --------------------------------------------------------------------------

    def acquired(self, event: LockEvent, outcome: str, group: str | None) -> None:
        key = (outcome, group)
        attributes = self._outcome_attributes.get(key)
        if attributes is None:
            attributes = self._outcome_attributes[key] = {"redlock.outcome": outcome, **(self._group_of(group) or {})}
        duration = event.duration or 0.0
        self._acquire.record(duration, attributes)
        if self._tracer is None:
            return
        # The acquire ran in the caller's task, and this is still that task: the current span is the caller's.
        end = time.time_ns()
        span = self._tracer.start_span("redlock.acquire", start_time=end - int(duration * 1e9))
        if span.is_recording():  # sampled: worth the attributes (a span sampled out costs little more)
            span.set_attributes(_acquire_attributes(event, outcome))
        span.end(end_time=end)
        caller = trace.get_current_span()
        if event.grant is not None and outcome == "acquired" and caller.is_recording():
            if len(self._callers) >= GRANTS_REMEMBERED:
                del self._callers[next(iter(self._callers))]  # a lock dropped unreleased: forget it
            self._callers[event.grant] = caller

    def hold(self, seconds: float, group: str | None) -> None:
        self._hold.record(seconds, self._group_of(group))

    def margin(self, seconds: float, group: str | None) -> None:
        self._margin.record(seconds, self._group_of(group))

    def handoff(self, seconds: float, group: str | None) -> None:
        self._handoff.record(seconds, self._group_of(group))

    def lost(self, event: LockEvent) -> None:
        # Often found by the watchdog's task, whose context is no caller's: tell the span of the grant's caller.
        caller = self._callers.pop(event.grant, None) if event.grant is not None else None
        if caller is not None and caller.is_recording():
            attributes: dict[str, AttributeValue] = {
                "redlock.lock.name": event.name,
                "redlock.reason": event.reason,
                "redlock.watchdog": event.watchdog,
            }
            if event.held_for is not None:
                attributes["redlock.hold.duration"] = event.held_for
            caller.add_event("redlock.lock.lost", attributes)

    def released(self, event: LockEvent) -> None:
        if event.grant is not None and self._callers:
            self._callers.pop(event.grant, None)

    # -- at collection ---------------------------------------------------------------------------

    def _observe_lost(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, self._group_of(group)) for group, count in self.lost_now()]

    def _observe_votes(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {"redlock.node": node, "redlock.vote": vote}) for node, vote, count in self.votes_now()
        ]

    def _observe_held(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, self._group_of(group)) for group, count in self.held_now()]

    def _observe_quarantined(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(1 if now else 0, {"redlock.node": node}) for node, now in self.quarantined_now()]


def _acquire_attributes(event: LockEvent, outcome: str) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "redlock.lock.name": event.name,
        "redlock.outcome": outcome,
        "redlock.attempts": event.attempts or 0,
        "redlock.wait": event.duration or 0.0,
        "redlock.votes": [f"{node}={vote.value}" for node, vote in zip(event.nodes, event.votes, strict=True)],
    }
    if event.handoff is not None:
        attributes["redlock.handoff"] = event.handoff
    if event.fencing_token is not None:
        attributes["redlock.fencing_token"] = event.fencing_token
    if event.reason:
        attributes["redlock.reason"] = event.reason
    return attributes
