"""redlock_async.metrics against real nodes: OpenTelemetry's SDK (in-memory reader and exporter) and a
prometheus_client CollectorRegistry, side by side on one Redlock (``on_event=[otel, prometheus]``).

One scripted sequence, with exact counts and attributes: acquires, an extension, a refusal,
a loss in the watchdog's task under a caller's span, a node down, and a node in restart quarantine.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from redlock_async import EventKind, Lock, LockEvent, LockLost, Redlock, sync
from redlock_async.events import OnEvent, combine
from redlock_async.metrics import OpenTelemetry, Prometheus

from .conftest import Cluster, MakeRedlock, eventually


class Otel:
    """An OpenTelemetry SDK of the test's own: an in-memory metric reader and span exporter."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.tracers.get_tracer("test")

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """The data points of metric *name*, by their attributes."""
        data = self.reader.get_metrics_data()
        assert data is not None
        found: dict[frozenset[tuple[str, Any]], Any] = {}
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[frozenset((point.attributes or {}).items())] = point
        return found

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@pytest.fixture
def otel() -> Iterator[Otel]:
    made = Otel()
    yield made
    made.meters.shutdown()
    made.tracers.shutdown()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def attrs(**pairs: Any) -> frozenset[tuple[str, Any]]:
    return frozenset(pairs.items())


async def test_a_scripted_sequence_gives_exact_counts_and_attributes(faulty: Cluster, otel: Otel) -> None:
    registry = CollectorRegistry()
    adapters = [
        OpenTelemetry(meter_provider=otel.meters, tracer_provider=otel.tracers),
        Prometheus(registry=registry),
    ]
    async with Redlock(faulty.urls, on_event=adapters) as redlock, Redlock(faulty.urls) as other:
        nodes = [node.address for node in redlock.statistics().nodes]
        down = nodes[4]
        counted: Counter[tuple[str, str]] = Counter()  # the votes of each event that counts them

        def count(lock: Lock) -> None:
            counted.update((outcome.node, outcome.vote.value) for outcome in lock.outcomes)

        # 1. Acquired, extended once, released: under a caller's span.
        with otel.tracer.start_as_current_span("first") as first:
            lock = redlock.lock("orders:1", ttl=2.0)
            assert await lock.acquire(blocking=False)
            count(lock)
            await lock.extend()
            count(lock)
            await lock.release()
            count(lock)

        # 2. A refusal: held by another client, one try.
        held = other.lock("orders:2")
        assert await held.acquire(blocking=False)
        refused = redlock.lock("orders:2")
        assert not await refused.acquire(blocking=False)
        assert [o.vote.value for o in refused.outcomes].count("no") >= 3
        count(refused)
        await held.release()

        # 3. Lost in the watchdog's task while the body runs under the caller's span "job".
        with otel.tracer.start_as_current_span("job") as job, pytest.raises(LockLost):
            # ttl 1.5 s: the DELs below block the loop (so that no extension runs before them), and on a
            # loaded box they took longer than a 0.5 s lease (CI: "expired before the watchdog could extend it").
            async with redlock.lock("orders:3", ttl=1.5) as doomed:
                count(doomed)
                for i in range(5):
                    faulty[i].command("DEL", "redlock:orders:3")  # gone: the first extension is refused
                await asyncio.sleep(5.0)  # cancelled at the first extension (due at 1 s), once refused

        # 4. A node down: acquired on the other four.
        faulty[4].kill()
        assert await eventually(lambda: not redlock.statistics().nodes[4].connected, 5.0)
        lock = redlock.lock("orders:4")
        assert await lock.acquire(blocking=False)
        assert lock.outcomes[4].vote.value != "yes"  # down (error, skipped, or still connecting: pending)
        count(lock)
        await lock.release()
        count(lock)

        # 5. The node is back without its data: in restart quarantine, its yes counts toward no quorum.
        faulty[4].restart(keep_data=False)
        for _ in range(100):  # a node connects again on use: connect() uses it, and makes no lock event
            await redlock.connect()
            if redlock.statistics().nodes[4].quarantined:
                break
            await asyncio.sleep(0.1)
        assert redlock.statistics().nodes[4].quarantined, redlock.statistics().nodes[4]
        lock = redlock.lock("orders:5")
        assert await lock.acquire(blocking=False)
        # Its yes does not count (or came after the other four decided).
        assert lock.outcomes[4].vote.value in ("quarantined", "pending")
        count(lock)
        await lock.release()
        count(lock)

    # -- Prometheus -------------------------------------------------------------------------------
    acquire = "redlock_lock_acquire_duration_seconds_count"
    assert sample(registry, acquire, outcome="acquired") == 4
    assert sample(registry, acquire, outcome="not_acquired") == 1
    assert sample(registry, "redlock_lock_hold_duration_seconds_count") == 4  # 3 released, 1 lost
    assert sample(registry, "redlock_lock_lost_total") == 1
    assert sample(registry, "redlock_lock_extension_margin_seconds_count") == 1
    assert sample(registry, "redlock_lock_handoff_duration_seconds_count") == 0  # nobody waited
    assert sample(registry, "redlock_lock_held") == 0
    assert sample(registry, "redlock_node_quarantined", node=down) == 1
    assert sample(registry, "redlock_node_quarantined", node=nodes[0]) == 0
    # Votes: every event's but the loss's (its refused extension, which may repeat an earlier request's).
    assert sum(n for (_, vote), n in counted.items() if vote == "yes") >= 3 * 7  # a majority each, 7 times
    expected_votes = dict(counted)
    votes = {
        (s.labels["node"], s.labels["vote"]): s.value
        for metric in registry.collect()
        if metric.name == "redlock_node_votes"
        for s in metric.samples
        if s.name == "redlock_node_votes_total"
    }
    assert votes == expected_votes
    assert not [m for m in registry.collect() for s in m.samples if "orders" in str(s.labels)]  # no lock names

    # -- OpenTelemetry metrics: the same counts ------------------------------------------------------
    durations = otel.points("redlock.lock.acquire.duration")
    assert {key: p.count for key, p in durations.items()} == {
        attrs(**{"redlock.outcome": "acquired"}): 4,
        attrs(**{"redlock.outcome": "not_acquired"}): 1,
    }
    assert [p.count for p in otel.points("redlock.lock.hold.duration").values()] == [4]
    assert [p.value for p in otel.points("redlock.lock.lost").values()] == [1]
    assert [p.count for p in otel.points("redlock.lock.extension.margin").values()] == [1]
    assert otel.points("redlock.lock.handoff.duration") == {}
    assert [p.value for p in otel.points("redlock.lock.held").values()] == [0]
    assert {key: p.value for key, p in otel.points("redlock.node.quarantined").items()} == {
        attrs(**{"redlock.node": node}): 1 if node == down else 0 for node in nodes
    }
    otel_votes = {
        (dict(key)["redlock.node"], dict(key)["redlock.vote"]): p.value
        for key, p in otel.points("redlock.node.votes").items()
    }
    assert otel_votes == expected_votes

    # -- Traces -------------------------------------------------------------------------------------
    spans = otel.spans("redlock.acquire")
    assert [s.attributes["redlock.lock.name"] for s in spans if s.attributes] == [
        "orders:1",
        "orders:2",
        "orders:3",
        "orders:4",
        "orders:5",
    ]
    one, two, three, _, _ = spans
    assert one.parent is not None
    assert one.parent.span_id == first.get_span_context().span_id
    assert three.parent is not None
    assert three.parent.span_id == job.get_span_context().span_id
    assert two.parent is None  # no span was current
    assert one.attributes is not None
    assert two.attributes is not None
    assert one.attributes["redlock.outcome"] == "acquired"
    assert one.attributes["redlock.attempts"] == 1
    assert two.attributes["redlock.outcome"] == "not_acquired"
    assert list(two.attributes["redlock.votes"]) == [  # type: ignore[arg-type]
        f"{o.node}={o.vote.value}" for o in refused.outcomes
    ]
    assert one.start_time is not None
    assert one.end_time is not None
    assert one.attributes["redlock.wait"] == pytest.approx((one.end_time - one.start_time) / 1e9, abs=1e-6)
    # The loss, told on the caller's span although the watchdog's task found it.
    [job_span] = otel.spans("job")
    [lost] = [event for event in job_span.events if event.name == "redlock.lock.lost"]
    assert lost.attributes is not None
    assert lost.attributes["redlock.lock.name"] == "orders:3"
    assert lost.attributes["redlock.watchdog"] is True
    assert "gone from a majority" in str(lost.attributes["redlock.reason"])
    [first_span] = otel.spans("first")
    assert not first_span.events  # released, not lost


async def test_a_waiter_woken_by_a_release_reports_the_hand_off_latency(make_redlock: MakeRedlock) -> None:
    registry = CollectorRegistry()
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=[Prometheus(registry=registry), events.append])
    holder = redlock.lock("handoff")
    assert await holder.acquire()
    waiter = redlock.lock("handoff", acquire_timeout=5.0)
    waiting = asyncio.create_task(waiter.acquire())
    # It tried, found the lock held, and waits in line on every node (under load 100 ms was not always
    # enough: a release before its entry is no hand-off, the entry finds the lock free).
    while waiter.statistics().attempts < 2 or any(node.unanswered for node in redlock.statistics().nodes):
        await asyncio.sleep(0.01)
    await holder.release()
    assert await waiting
    granted = [e for e in events if e.kind is EventKind.ACQUIRED][-1]
    assert granted.handoff is not None
    assert 0 <= granted.handoff < 0.5
    assert granted.duration is not None
    assert granted.handoff < granted.duration
    assert sample(registry, "redlock_lock_handoff_duration_seconds_count") == 1
    assert sample(registry, "redlock_lock_handoff_duration_seconds_sum") == granted.handoff
    assert sample(registry, "redlock_lock_held") == 1
    assert len({e.grant for e in events if e.kind is EventKind.ACQUIRED}) == 2  # two grants of one name
    await waiter.release()
    assert sample(registry, "redlock_lock_held") == 0


async def test_a_release_cancelled_while_the_nodes_answer_still_ends_the_grant(faulty: Cluster) -> None:
    """The lock is no longer held once its release went out: held now goes back to 0, the hold is measured."""
    registry = CollectorRegistry()
    events: list[LockEvent] = []
    hooks: list[OnEvent] = [Prometheus(registry=registry), events.append]
    async with Redlock(faulty.urls, on_event=hooks, node_timeout=0.5, adaptive_timeout=False) as redlock:
        lock = redlock.lock("cut-short")
        assert await lock.acquire(blocking=False)
        assert sample(registry, "redlock_lock_held") == 1
        # The release waits for every node that said yes to the grant: one of them stays silent.
        silent = next(i for i, outcome in enumerate(lock.outcomes) if outcome.vote.value == "yes")
        faulty[silent].pause()
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await lock.release()
        finally:
            faulty[silent].resume()
        assert not lock.held
        assert [e.kind for e in events] == [EventKind.ACQUIRED, EventKind.RELEASED]
        assert sample(registry, "redlock_lock_held") == 0
        assert sample(registry, "redlock_lock_hold_duration_seconds_count") == 1


async def test_name_attribute_groups_lock_names(make_redlock: MakeRedlock, otel: Otel) -> None:
    registry = CollectorRegistry()

    def prefix(name: str) -> str:
        return name.split(":")[0]

    adapters = [
        Prometheus(registry=registry, name_attribute=prefix),
        OpenTelemetry(meter_provider=otel.meters, tracer_provider=otel.tracers, name_attribute=prefix),
    ]
    redlock = await make_redlock(on_event=adapters)
    for name in ("orders:1", "orders:2", "users:7"):
        async with redlock.lock(name):
            pass
    count = "redlock_lock_acquire_duration_seconds_count"
    assert sample(registry, count, outcome="acquired", lock="orders") == 2
    assert sample(registry, count, outcome="acquired", lock="users") == 1
    assert sample(registry, "redlock_lock_hold_duration_seconds_count", lock="orders") == 2
    assert sample(registry, "redlock_lock_held", lock="orders") == 0
    assert {key: p.count for key, p in otel.points("redlock.lock.acquire.duration").items()} == {
        attrs(**{"redlock.outcome": "acquired", "redlock.lock.group": "orders"}): 2,
        attrs(**{"redlock.outcome": "acquired", "redlock.lock.group": "users"}): 1,
    }
    with pytest.raises(TypeError, match="name_attribute must be a function"):
        Prometheus(registry=CollectorRegistry(), name_attribute="prefix")  # type: ignore[arg-type]


async def test_the_loss_counter_and_quarantine_gauges_have_a_sample_before_their_first_event(
    cluster: Cluster, make_redlock: MakeRedlock, otel: Otel
) -> None:
    """Issue 35: redlock_lock_lost_total and redlock_node_quarantined had no sample until their first
    loss or quarantine, so a dashboard's increase() missed each process's first loss. The loss counter
    is 0 from the adapter's start (with groups: from a group's first grant), and each node's gauge is 0
    from the first event that names it."""
    registry, grouped = CollectorRegistry(), CollectorRegistry()
    prometheus = Prometheus(registry=registry)
    assert registry.get_sample_value("redlock_lock_lost_total") == 0
    adapters = [
        prometheus,
        Prometheus(registry=grouped, name_attribute=lambda name: name.split(":")[0]),
        OpenTelemetry(meter_provider=otel.meters, tracer_provider=otel.tracers),
    ]
    redlock = await make_redlock(on_event=adapters)
    async with redlock.lock("orders:1"):
        pass
    nodes = [node.address for node in redlock.statistics().nodes]
    assert len(nodes) == len(cluster)
    assert registry.get_sample_value("redlock_lock_lost_total") == 0
    assert grouped.get_sample_value("redlock_lock_lost_total", {"lock": "orders"}) == 0
    for node in nodes:
        assert registry.get_sample_value("redlock_node_quarantined", {"node": node}) == 0
    assert [p.value for p in otel.points("redlock.lock.lost").values()] == [0]
    assert {key: p.value for key, p in otel.points("redlock.node.quarantined").items()} == {
        attrs(**{"redlock.node": node}): 0 for node in nodes
    }


async def test_on_event_takes_several_callbacks_and_one_failing_does_not_stop_the_others(
    make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    first: list[LockEvent] = []
    last: list[LockEvent] = []

    def broken(event: LockEvent) -> None:
        raise RuntimeError("a bug in a user's hook")

    redlock = await make_redlock(on_event=(first.append, broken, last.append))
    async with redlock.lock("several"):
        pass
    assert [e.kind for e in first] == [EventKind.ACQUIRED, EventKind.RELEASED]
    assert last == first
    failures = [r for r in caplog.records if "on_event callback" in r.getMessage()]
    assert len(failures) == 2  # logged once per event, with the hook's name
    assert "broken" in failures[0].getMessage()


def test_on_event_refuses_what_is_not_a_callback_or_a_list_of_them(cluster: Cluster) -> None:
    with pytest.raises(TypeError, match=r"on_event\[1\] must be a function taking a LockEvent, got int"):
        Redlock(cluster.urls, on_event=[print, 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="on_event must be a function taking a LockEvent, a list of them, or None"):
        Redlock(cluster.urls, on_event="print")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got int"):
        Redlock(cluster.urls, on_event=3)  # type: ignore[arg-type]
    assert combine(print) is print
    Redlock(cluster.urls, on_event=[])  # nothing to call: as None


def test_a_second_prometheus_adapter_on_one_registry_says_to_share_it() -> None:
    registry = CollectorRegistry()
    Prometheus(registry=registry)
    with pytest.raises(ValueError, match=r"Share one Prometheus\(\) between Redlocks, or give each its own registry="):
        Prometheus(registry=registry)
    Prometheus(registry=None)  # registered nowhere: as many as you like


@pytest.mark.parametrize(
    ("adapter", "package", "extra"),
    [
        ("OpenTelemetry", "opentelemetry", "otel"),
        ("Prometheus", "prometheus_client", "prometheus"),
    ],
)
def test_without_its_package_an_adapter_says_which_extra_to_install(adapter: str, package: str, extra: str) -> None:
    script = (
        f"import sys; sys.modules[{package!r}] = None\n"
        "import redlock_async.metrics\n"
        "try:\n"
        f"    from redlock_async.metrics import {adapter}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == (
        f"redlock_async.metrics.{adapter} needs the {package} package: pip install 'redlock_async[{extra}]'"
    )


async def test_scrapes_from_another_thread_while_locks_come_and_go_read_whole_counts(
    make_redlock: MakeRedlock,
) -> None:
    """prometheus_client's HTTP server scrapes in a thread of its own, while the loop counts events."""
    registry = CollectorRegistry()
    redlock = await make_redlock(on_event=Prometheus(registry=registry))
    stop = threading.Event()
    scrapes: list[int] = []
    failures: list[BaseException] = []

    def scrape() -> None:
        while not stop.is_set():
            try:
                generate_latest(registry)
                scrapes.append(1)
            except BaseException as exc:
                failures.append(exc)
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()

    async def worker(slot: int) -> None:
        lock = redlock.lock(f"scraped:{slot}")
        for _ in range(20):
            assert await lock.acquire()
            await lock.release()

    try:
        await asyncio.gather(*(worker(slot) for slot in range(16)))
    finally:
        stop.set()
        await asyncio.to_thread(scraper.join)
    assert not failures
    assert scrapes
    assert sample(registry, "redlock_lock_acquire_duration_seconds_count", outcome="acquired") == 16 * 20
    assert sample(registry, "redlock_lock_hold_duration_seconds_count") == 16 * 20
    assert sample(registry, "redlock_lock_held") == 0


def test_the_blocking_api_takes_the_adapters_too(cluster: Cluster, otel: Otel) -> None:
    """Its acquire runs on the library's loop thread, yet the span's parent is the calling thread's span."""
    registry = CollectorRegistry()
    with pytest.raises(TypeError, match=r"on_event\[0\] must be a function"):
        sync.Redlock(cluster.urls, on_event=[3])  # type: ignore[list-item]
    adapters = [Prometheus(registry=registry), OpenTelemetry(tracer_provider=otel.tracers, meter_provider=otel.meters)]
    with (
        sync.Redlock(cluster.urls, on_event=adapters) as redlock,
        otel.tracer.start_as_current_span("caller") as caller,
        redlock.lock("blocking"),
    ):
        assert sample(registry, "redlock_lock_held") == 1
    assert sample(registry, "redlock_lock_acquire_duration_seconds_count", outcome="acquired") == 1
    assert sample(registry, "redlock_lock_held") == 0
    [span] = otel.spans("redlock.acquire")
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id


async def test_a_lock_that_ran_out_unreleased_and_is_acquired_again_ends_its_first_grant(
    make_redlock: MakeRedlock,
) -> None:
    registry = CollectorRegistry()
    events: list[LockEvent] = []
    redlock = await make_redlock(on_event=[Prometheus(registry=registry), events.append])
    lock = redlock.lock("ran-out", ttl=0.6)
    assert await lock.acquire()
    await asyncio.sleep(0.7)  # never extended nor released: its validity runs out
    assert not lock.held
    assert await lock.acquire()
    first, lost, second = events
    assert [first.kind, lost.kind, second.kind] == [EventKind.ACQUIRED, EventKind.LOST, EventKind.ACQUIRED]
    assert lost.grant == first.grant != second.grant
    assert "ran out before it was extended or released" in lost.reason
    assert lost.held_for is not None
    assert lost.held_for >= 0.7
    assert sample(registry, "redlock_lock_held") == 1  # the second grant only
    assert sample(registry, "redlock_lock_lost_total") == 1
    await lock.release()
    assert sample(registry, "redlock_lock_held") == 0


async def test_without_an_sdk_the_opentelemetry_adapter_costs_nothing_and_breaks_nothing(
    make_redlock: MakeRedlock, caplog: pytest.LogCaptureFixture
) -> None:
    """The API alone (no SDK configured, as in a library that leaves the choice to the app): no-op instruments."""
    adapter = OpenTelemetry()  # the global providers: the API's proxies, no SDK behind them here
    redlock = await make_redlock(on_event=adapter)
    with caplog.at_level(logging.DEBUG, logger="redlock_async"):
        async with redlock.lock("no-sdk"):
            pass
    assert not [r for r in caplog.records if "callback failed" in r.getMessage()]
    assert adapter.held_now() == [(None, 0)]
