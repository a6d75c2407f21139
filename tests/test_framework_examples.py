"""The framework examples, run for real: FastAPI through ASGI with its lifespan, aiohttp through its
own test server, both against the 5 nodes of ``cluster``; and examples/long_job.py as a script.

A witness inside each guarded route counts the requests in it, per resource:
one at a time for one resource, several at once for different ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from examples import aiohttp_app, fastapi_app
from redlock_async import Lock, Redlock

from .conftest import Cluster, assert_no_library_tasks, dead_urls, free_port

EXAMPLES = Path(__file__).parent.parent / "examples"
UNAVAILABLE = "the lock service is unavailable (too few nodes can vote): try again later"
"""What the example apps answer with 503 when too few nodes can vote (NodesUnavailable)."""
TESTS = Path(__file__).parent


class Witness:
    """The work of the example apps: records who is inside, per lock resource.

    With ``hold`` it takes that long; without, it waits until ``gate`` is set.
    """

    def __init__(self, hold: float | None = None) -> None:
        self.hold = hold
        self.gate = asyncio.Event()
        self.inside: Counter[str] = Counter()
        self.most: Counter[str] = Counter()  # most requests inside at once, per resource
        self.most_total = 0  # most requests inside at once, all resources
        self.runs: Counter[str] = Counter()
        self._entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    async def work(self, lock: Lock) -> None:
        name = str(lock.name)
        assert lock.held
        self.inside[name] += 1
        self.runs[name] += 1
        self.most[name] = max(self.most[name], self.inside[name])
        self.most_total = max(self.most_total, self.inside.total())
        self._entered[name].set()
        try:
            if self.hold is None:
                await self.gate.wait()
            else:
                await asyncio.sleep(self.hold)
        finally:
            self.inside[name] -= 1

    async def entered(self, name: str) -> None:
        async with asyncio.timeout(10):
            await self._entered[name].wait()


@pytest.fixture
def nodes_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The apps read their nodes from $REDLOCK_NODES, like the redlock command."""
    monkeypatch.setenv("REDLOCK_NODES", ",".join(cluster.urls))


# -- FastAPI ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of *app*, in process, with its lifespan run (the Redlock made and closed)."""
    async with (
        LifespanManager(app) as manager,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://app") as client,
    ):
        yield client
    assert_no_library_tasks()


@pytest.mark.serial
@pytest.mark.usefixtures("nodes_env")
async def test_fastapi_fail_fast_route_answers_409_while_the_job_runs() -> None:
    witness = Witness()
    async with asgi_client(fastapi_app.create_app(witness.work)) as client:
        first = asyncio.create_task(client.post("/jobs/7/run"))
        await witness.entered("jobs:7")
        started = time.monotonic()
        busy = await client.post("/jobs/7/run")
        assert busy.status_code == 409
        assert busy.json() == {"detail": "jobs:7 is busy: try again later"}
        assert time.monotonic() - started < 1.0  # no waiting
        other = asyncio.create_task(client.post("/jobs/8/run"))  # another job runs meanwhile
        await witness.entered("jobs:8")
        assert witness.inside == {"jobs:7": 1, "jobs:8": 1}
        witness.gate.set()
        assert (await first).json() == {"job": "7", "status": "done"}
        assert (await other).status_code == 200
        assert (await client.post("/jobs/7/run")).status_code == 200  # released on the way out
    assert witness.runs == {"jobs:7": 2, "jobs:8": 1}
    assert witness.most == {"jobs:7": 1, "jobs:8": 1}


@pytest.mark.usefixtures("nodes_env")
async def test_fastapi_fail_fast_route_lets_one_of_a_burst_run() -> None:
    witness = Witness(hold=0.2)
    async with asgi_client(fastapi_app.create_app(witness.work)) as client:
        responses = await asyncio.gather(*(client.post("/jobs/1/run") for _ in range(6)))
    assert sorted(r.status_code for r in responses) == [200] + [409] * 5
    assert witness.runs == {"jobs:1": 1}


@pytest.mark.usefixtures("nodes_env")
async def test_fastapi_waiting_route_runs_one_build_per_report_at_a_time() -> None:
    witness = Witness(hold=0.1)
    async with asgi_client(fastapi_app.create_app(witness.work)) as client:
        responses = await asyncio.gather(*(client.post(f"/reports/{report}/build") for report in "aaaabb"))
    assert [r.status_code for r in responses] == [200] * 6
    assert responses[0].json() == {"report": "a", "status": "built"}
    assert witness.runs == {"reports:a": 4, "reports:b": 2}  # everyone waited their turn
    assert witness.most == {"reports:a": 1, "reports:b": 1}
    assert witness.most_total == 2  # a and b were built side by side


@pytest.mark.usefixtures("nodes_env")
async def test_fastapi_route_whose_lock_is_lost_is_cancelled_and_answers_503(cluster: Cluster) -> None:
    app = fastapi_app.create_app()
    cancelled = asyncio.Event()

    @app.post("/flaky/{item}")
    async def flaky(item: str, lock: Annotated[Lock, fastapi_app.locked("flaky:{item}", ttl=1.0)]) -> None:
        await asyncio.to_thread(cluster.flush)  # the nodes lose the key: the next extension is refused
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with asgi_client(app) as client:
        started = time.monotonic()
        response = await client.post("/flaky/x")
    assert response.status_code == 503
    assert response.json() == {"detail": "lost the lock on flaky:x: retry"}
    assert cancelled.is_set()
    assert time.monotonic() - started < 5


async def test_fastapi_route_answers_503_not_409_when_no_node_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node down (or a wrong password everywhere): the lock is not busy but unavailable."""
    monkeypatch.setenv("REDLOCK_NODES", ",".join(dead_urls(3)))
    witness = Witness(hold=0.0)
    async with asgi_client(fastapi_app.create_app(witness.work)) as client:
        response = await client.post("/jobs/1/run")
    assert response.status_code == 503, response.text
    assert response.json() == {"detail": f"jobs:1: {UNAVAILABLE}"}
    assert "retry-after" not in response.headers  # no one can say when refused nodes come back
    assert witness.runs == {}


@pytest.mark.usefixtures("nodes_env")
async def test_fastapi_route_in_restart_quarantine_answers_503_with_retry_after(
    faulty: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes vouched for by a client with a 1 s ttl sit out the app's 10 s quarantine: 503, and when to retry."""
    async with Redlock(faulty.urls, ttl=1.0) as short, short.lock("jobs:1"):
        pass
    monkeypatch.setenv("REDLOCK_NODES", ",".join(faulty.urls))
    witness = Witness(hold=0.0)
    async with asgi_client(fastapi_app.create_app(witness.work)) as client:
        response = await client.post("/jobs/1/run")
    assert response.status_code == 503, response.text
    assert 1 <= int(response.headers["retry-after"]) <= 11
    assert witness.runs == {}


async def test_fastapi_app_without_nodes_fails_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDLOCK_NODES", raising=False)
    with pytest.raises(RuntimeError, match="REDLOCK_NODES"):
        async with LifespanManager(fastapi_app.create_app()):
            pass


# -- aiohttp ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def aiohttp_client(app: web.Application) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """A client of *app* served on a local port, with its cleanup_ctx run (the Redlock made and closed)."""
    async with TestClient(TestServer(app)) as client:
        yield client
    assert_no_library_tasks()


@pytest.mark.serial
@pytest.mark.usefixtures("nodes_env")
async def test_aiohttp_fail_fast_route_answers_409_while_the_job_runs() -> None:
    witness = Witness()
    async with aiohttp_client(aiohttp_app.create_app(witness.work)) as client:
        first = asyncio.create_task(client.post("/jobs/7/run"))
        await witness.entered("jobs:7")
        started = time.monotonic()
        async with client.post("/jobs/7/run") as busy:
            assert busy.status == 409
            assert await busy.text() == "jobs:7 is busy: try again later"
        assert time.monotonic() - started < 1.0
        other = asyncio.create_task(client.post("/jobs/8/run"))
        await witness.entered("jobs:8")
        assert witness.inside == {"jobs:7": 1, "jobs:8": 1}
        witness.gate.set()
        async with await first as response:
            assert await response.json() == {"job": "7", "status": "done"}
        async with await other as response:
            assert response.status == 200
        async with client.post("/jobs/7/run") as response:
            assert response.status == 200
    assert witness.runs == {"jobs:7": 2, "jobs:8": 1}
    assert witness.most == {"jobs:7": 1, "jobs:8": 1}


@pytest.mark.usefixtures("nodes_env")
async def test_aiohttp_fail_fast_route_lets_one_of_a_burst_run() -> None:
    witness = Witness(hold=0.2)
    async with aiohttp_client(aiohttp_app.create_app(witness.work)) as client:
        responses = await asyncio.gather(*(client.post("/jobs/1/run") for _ in range(6)))
        statuses = sorted(r.status for r in responses)
        for response in responses:
            response.release()
    assert statuses == [200] + [409] * 5
    assert witness.runs == {"jobs:1": 1}


@pytest.mark.usefixtures("nodes_env")
async def test_aiohttp_waiting_route_runs_one_build_per_report_at_a_time() -> None:
    witness = Witness(hold=0.1)
    async with aiohttp_client(aiohttp_app.create_app(witness.work)) as client:

        async def build(report: str) -> object:
            async with client.post(f"/reports/{report}/build") as response:
                assert response.status == 200
                return await response.json()

        results = await asyncio.gather(*(build(report) for report in "aaaabb"))
    assert results[0] == {"report": "a", "status": "built"}
    assert witness.runs == {"reports:a": 4, "reports:b": 2}
    assert witness.most == {"reports:a": 1, "reports:b": 1}
    assert witness.most_total == 2


@pytest.mark.usefixtures("nodes_env")
async def test_aiohttp_handler_whose_lock_is_lost_is_cancelled_and_answers_503(cluster: Cluster) -> None:
    cancelled = asyncio.Event()

    @aiohttp_app.locked("flaky:{item}", ttl=1.0)
    async def flaky(request: web.Request, lock: Lock) -> web.StreamResponse:
        await asyncio.to_thread(cluster.flush)  # the nodes lose the key: the next extension is refused
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response()

    app = aiohttp_app.create_app()
    app.router.add_post("/flaky/{item}", flaky)
    async with aiohttp_client(app) as client:
        started = time.monotonic()
        async with client.post("/flaky/x") as response:
            assert response.status == 503
            assert await response.text() == "lost the lock on flaky:x: retry"
    assert cancelled.is_set()
    assert time.monotonic() - started < 5


async def test_aiohttp_handler_answers_503_not_409_when_no_node_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDLOCK_NODES", ",".join(dead_urls(3)))
    witness = Witness(hold=0.0)
    async with aiohttp_client(aiohttp_app.create_app(witness.work)) as client, client.post("/jobs/1/run") as response:
        assert response.status == 503
        assert await response.text() == f"jobs:1: {UNAVAILABLE}"
        assert "Retry-After" not in response.headers
    assert witness.runs == {}


async def serving(process: asyncio.subprocess.Process, port: int) -> None:
    """Wait until *process* accepts connections on 127.0.0.1:*port*.

    Up to 60 s: a loaded CI box (a first run compiling aiohttp's bytecode beside the suite) saw both
    replicas still starting after 20 s. Only a failure waits that long."""
    async with asyncio.timeout(60):
        while True:
            if process.returncode is not None:
                raise AssertionError(f"the app exited with {process.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return


APP_MAIN = "examples.aiohttp_app:main"


def listening(port: int) -> list[str]:
    """The IPv4 addresses listening on TCP *port* on this machine (from /proc/net/tcp: Linux)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.append(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["script", "aiohttp.web"])
async def test_aiohttp_app_runs_as_two_replicas_on_loopback(cluster: Cluster, runner: str) -> None:
    """Two processes of the app, each on a port of its own (loopback), share the lock through the nodes:
    of two requests for one job at once, one runs and the other is told 409."""
    ports = [free_port(), free_port()]
    env = {**os.environ, "REDLOCK_NODES": ",".join(cluster.urls), "PYTHONPATH": str(EXAMPLES.parent)}

    def commands(port: int) -> list[str]:
        if runner == "script":
            return [str(EXAMPLES / "aiohttp_app.py"), "--port", str(port)]
        return ["-m", "aiohttp.web", "-H", "127.0.0.1", "-P", str(port), APP_MAIN]

    replicas = [
        await asyncio.create_subprocess_exec(
            sys.executable, *commands(port), env=env, cwd=EXAMPLES.parent,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        for port in ports
    ]  # fmt: skip
    try:
        for process, port in zip(replicas, ports, strict=True):
            await serving(process, port)
        async with httpx.AsyncClient(timeout=10) as client:
            answers = await asyncio.gather(*(client.post(f"http://127.0.0.1:{port}/jobs/1/run") for port in ports))
        assert sorted(answer.status_code for answer in answers) == [200, 409], [a.text for a in answers]
        for port in ports:  # loopback only, never 0.0.0.0
            assert listening(port) == ["127.0.0.1"]
    finally:
        for process in replicas:
            if process.returncode is None:
                process.terminate()
            await process.communicate()


def test_aiohttp_main_refuses_arguments_it_does_not_take() -> None:
    with pytest.raises(SystemExit, match="use -H HOST -P PORT"):
        aiohttp_app.main(["--port", "8081"])


# -- scripts ------------------------------------------------------------------


@pytest.mark.serial
@pytest.mark.slow
def test_long_job_example_extends_between_chunks_and_stops_when_lost(cluster: Cluster) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "long_job.py")],
        env={**os.environ, "REDLOCK_NODES": ",".join(cluster.urls)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum(line.startswith("export: chunk ") for line in lines) == 5, lines
    assert any(line.startswith("export: all 5 chunks done") for line in lines), lines
    assert "rival: export is held, not taken" in lines  # after the first ttl had passed: extended
    lost = "import: lock lost after chunk 2: stopped, chunks 2-5 left to the new holder"
    assert lines.index("rival: took import over") < lines.index(lost)
    assert not any(line.startswith("import: chunk 2/") for line in lines)  # nothing committed once lost


def test_every_example_is_run_by_a_test() -> None:
    """A new example needs a test: by its file name (run as a script) or imported from examples."""
    tests = "\n".join(path.read_text() for path in TESTS.glob("test_*.py"))
    imported = {name for line in re.findall(r"^from examples import (.+)$", tests, re.M) for name in line.split(", ")}
    for example in sorted(set(EXAMPLES.glob("*.py")) - {EXAMPLES / "__init__.py"}):
        assert f'"{example.name}"' in tests or example.stem in imported, f"examples/{example.name} is run by no test"
