"""examples/metrics_app.py run for real (FastAPI in process, against ``cluster``), and the Grafana
dashboard checked against the metrics the Prometheus adapter makes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from examples import metrics_app
from redlock_async import Lock
from redlock_async.metrics import Prometheus

from .conftest import Cluster, assert_no_library_tasks

DASHBOARD = Path(__file__).parent.parent / "examples" / "grafana-dashboard.json"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_the_metrics_app_serves_lock_metrics_on_its_metrics_route(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDLOCK_NODES", ",".join(cluster.urls))

    async def work(lock: Lock) -> None:
        # The example's 0.2 s was once over before the second request of job 1 asked, on a loaded CI box
        # (no hand-off counted): a second is long enough for it to be waiting.
        await asyncio.sleep(1.0)

    app = metrics_app.create_app(work=work, registry=CollectorRegistry())
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://app") as client,
    ):
        # Job 1 twice at once (the second waits for the first's release: a hand-off), job 2 once.
        answers = await asyncio.gather(
            client.post("/jobs/1/run"), client.post("/jobs/1/run"), client.post("/jobs/2/run")
        )
        assert [a.status_code for a in answers] == [200, 200, 200]
        scraped = await client.get("/metrics/")
        assert scraped.status_code == 200
        assert scraped.headers["content-type"].startswith("text/plain")
    assert_no_library_tasks()
    found = samples(scraped.text)
    jobs = frozenset({("lock", "jobs")})
    acquired = frozenset({("outcome", "acquired"), ("lock", "jobs")})
    assert found["redlock_lock_acquire_duration_seconds_count", acquired] == 3
    assert found["redlock_lock_hold_duration_seconds_count", jobs] == 3
    assert found["redlock_lock_handoff_duration_seconds_count", jobs] == 1
    assert found["redlock_lock_held", jobs] == 0
    yes = sum(
        value
        for (name, labels), value in found.items()
        if name == "redlock_node_votes_total" and ("vote", "yes") in labels
    )
    assert yes >= 3 * 6  # 3 acquires and 3 releases, a majority of 5 each
    assert not [labels for (_, labels) in found if any("jobs:" in value for _, value in labels)]  # no lock names


def test_the_grafana_dashboard_queries_only_metrics_and_labels_the_adapter_makes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    labels = {"le", "lock", "instance", "job"}
    for family in Prometheus(registry=None, name_attribute=str).describe():
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",), "gauge": ("",)}[family.type]
        names |= {family.name + suffix for suffix in suffixes}
    labels |= {"outcome", "node", "vote"}
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 9
    used = {name for expr in exprs for name in re.findall(r"\bredlock_[a-z_]+", expr)}
    assert used <= names, used - names
    assert {
        "redlock_lock_acquire_duration_seconds_bucket",
        "redlock_lock_hold_duration_seconds_bucket",
        "redlock_lock_lost_total",
        "redlock_node_votes_total",
        "redlock_lock_extension_margin_seconds_bucket",
        "redlock_lock_handoff_duration_seconds_bucket",
        "redlock_lock_held",
        "redlock_node_quarantined",
    } <= used
    grouped = {
        label.strip() for expr in exprs for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")
    }
    assert grouped <= labels, grouped - labels
