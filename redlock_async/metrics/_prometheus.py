"""Prometheus metrics for ``Redlock(on_event=Prometheus())``, through ``prometheus_client``.

A custom collector: each event only adds to plain Python counts (a histogram is a list of
bucket counts and a sum), and the metric families are made from copies of them at each scrape.
``prometheus_client``'s own metric classes take a thread lock and walk every bucket at each
observation: too dear for a hook that runs at every acquire and release.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import final

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from redlock_async.events import LockEvent
from redlock_async.metrics._meter import (
    ACQUIRE_BUCKETS,
    HOLD_BUCKETS,
    MARGIN_BUCKETS,
    EventMeter,
    NameAttribute,
)

__all__ = ["Prometheus"]

ACQUIRE = "redlock_lock_acquire_duration_seconds"
HOLD = "redlock_lock_hold_duration_seconds"
LOST = "redlock_lock_lost"
VOTES = "redlock_node_votes"
MARGIN = "redlock_lock_extension_margin_seconds"
HANDOFF = "redlock_lock_handoff_duration_seconds"
HELD = "redlock_lock_held"
QUARANTINED = "redlock_node_quarantined"


class _Histogram:
    """One histogram's series, by their label values: bucket counts (not cumulative) and sums."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        series[0][bisect.bisect_left(self.bounds, value)] += 1  # the first bucket whose le >= value
        series[1][0] += value

    def family(self, name: str, documentation: str, labels: Sequence[str]) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, documentation, labels=labels)
        edges = [repr(float(bound)) for bound in self.bounds] + ["+Inf"]
        for values, (counts, total) in list(self.series.items()):
            cumulative, buckets = 0, []
            for edge, count in zip(edges, list(counts), strict=True):
                cumulative += count
                buckets.append((edge, cumulative))
            family.add_metric(list(values), buckets, total[0])
        return family


@final
class Prometheus(EventMeter, Collector):
    """Lock metrics in a ``prometheus_client`` registry (the default one unless *registry* is given).

    Pass it as ``Redlock(..., on_event=Prometheus())``; one instance serves any number of
    Redlocks. It registers itself when made: make one per registry (a second on the same
    registry is a ValueError; ``registry=None`` registers nowhere). *name_attribute* adds a
    ``lock`` label to the lock metrics, with the group it maps each lock's name to. The
    metrics are in docs/metrics.md.
    """

    def __init__(
        self, *, registry: CollectorRegistry | None = REGISTRY, name_attribute: NameAttribute | None = None
    ) -> None:
        super().__init__(name_attribute)
        self._lock_label = ["lock"] if self._group is not None else []
        self._acquire = _Histogram(ACQUIRE_BUCKETS)
        self._hold = _Histogram(HOLD_BUCKETS)
        self._margin = _Histogram(MARGIN_BUCKETS)
        self._handoff = _Histogram(ACQUIRE_BUCKETS)
        self._labels_by: dict[str | None, tuple[str, ...]] = {None: ()}
        self.registry = registry
        """Where the metrics are registered (None: nowhere)."""
        if registry is not None:
            try:
                registry.register(self)
            except ValueError as exc:
                raise ValueError(
                    f"{exc}: these redlock metrics are already registered in this registry. "
                    "Share one Prometheus() between Redlocks, or give each its own registry="
                ) from None

    def _labels(self, group: str | None) -> tuple[str, ...]:
        labels = self._labels_by.get(group)
        if labels is None:
            labels = self._labels_by[group] = (group,) if group is not None else ()
        return labels

    # -- at each event --------------------------------------------------------------------------

    def acquired(self, event: LockEvent, outcome: str, group: str | None) -> None:
        if event.duration is not None:
            self._acquire.observe((outcome,) if group is None else (outcome, group), event.duration)

    def hold(self, seconds: float, group: str | None) -> None:
        self._hold.observe(() if group is None else (group,), seconds)

    def margin(self, seconds: float, group: str | None) -> None:
        self._margin.observe(self._labels(group), seconds)

    def handoff(self, seconds: float, group: str | None) -> None:
        self._handoff.observe(self._labels(group), seconds)

    # -- at each scrape -------------------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        """The families, empty: the registry checks names with these when this collector registers."""
        lock = self._lock_label
        yield HistogramMetricFamily(ACQUIRE, "", labels=["outcome", *lock])
        yield HistogramMetricFamily(HOLD, "", labels=lock)
        yield CounterMetricFamily(LOST, "", labels=lock)
        yield CounterMetricFamily(VOTES, "", labels=["node", "vote"])
        yield HistogramMetricFamily(MARGIN, "", labels=lock)
        yield HistogramMetricFamily(HANDOFF, "", labels=lock)
        yield GaugeMetricFamily(HELD, "", labels=lock)
        yield GaugeMetricFamily(QUARANTINED, "", labels=["node"])

    def collect(self) -> Iterable[Metric]:
        lock = self._lock_label
        yield self._acquire.family(
            ACQUIRE,
            "Seconds from an acquire's call to its grant or give-up, by outcome (acquired, not_acquired).",
            ["outcome", *lock],
        )
        yield self._hold.family(HOLD, "Seconds from a lock's grant to its release or loss.", lock)
        lost = CounterMetricFamily(LOST, "Held locks that were lost.", labels=lock)
        for group, count in self.lost_now():
            lost.add_metric(list(self._labels(group)), count)
        yield lost
        votes = CounterMetricFamily(
            VOTES,
            "Per-node votes of the requests that decided acquires (their last attempt), extensions and releases.",
            labels=["node", "vote"],
        )
        for node, vote, count in self.votes_now():
            votes.add_metric([node, vote], count)
        yield votes
        yield self._margin.family(
            MARGIN, "Validity the old lease still had when an extension was confirmed (near 0: nearly lost).", lock
        )
        yield self._handoff.family(
            HANDOFF, "Seconds from a release waking a waiter of this process to that waiter's grant.", lock
        )
        held = GaugeMetricFamily(HELD, "Locks held now.", labels=lock)
        for group, count in self.held_now():
            held.add_metric(list(self._labels(group)), count)
        yield held
        quarantined = GaugeMetricFamily(
            QUARANTINED,
            "1 while a node is in restart quarantine (its yes votes count toward no quorum), else 0.",
            labels=["node"],
        )
        for node, now in self.quarantined_now():
            quarantined.add_metric([node], 1 if now else 0)
        yield quarantined
