"""examples/celery_app.py under a real Celery worker (prefork, 2 children) against embedded nodes.

The first node is also Celery's broker and result backend. The same task sent twice at once goes
to the two children, and its body runs once: the other copy finds the lock held and skips.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from redlock_async.testing import LocalNodes

celery = pytest.importorskip("celery", reason="the test extra installs celery")

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "celery_app.py"
assert APP.name == "celery_app.py"
TASK = "examples.celery_app.report"


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    with LocalNodes(3) as nodes:
        env = {**os.environ, "REDLOCK_NODES": ",".join(nodes.urls), "PYTHONPATH": str(ROOT)}
        log = tmp_path / "worker.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "examples.celery_app", "worker", "--pool=prefork",
                 "--concurrency=2", "-O", "fair", "--without-gossip", "--without-mingle", "--without-heartbeat",
                 "--loglevel=INFO", "-n", f"test-{os.getpid()}@%h"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            yield nodes.urls, log
        finally:
            process.send_signal(signal.SIGTERM)  # warm shutdown: the children finish and exit
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.slow
@pytest.mark.serial  # two tries at the same moment: a first recheck answered late under parallel load fails both
def test_the_same_task_sent_twice_at_once_runs_once(worker: tuple[list[str], Path], tmp_path: Path) -> None:
    urls, log = worker
    journal = tmp_path / "journal"
    journal.touch()
    client = celery.Celery("client", broker=urls[0], backend=urls[0])
    try:
        deadline = time.monotonic() + 60
        while not client.control.ping(timeout=0.5):
            assert time.monotonic() < deadline, f"the worker did not start:\n{log.read_text()}"
        # Twice at once: each child takes one (prefetch 1, fair scheduling); 3 s > the 2 s ttl.
        first = client.send_task(TASK, args=(42, 3.0, str(journal)))
        second = client.send_task(TASK, args=(42, 3.0, str(journal)))
        results = [first.get(timeout=60), second.get(timeout=60)]
        # Later, once the first is done: it runs again (a lock, not a once-ever marker).
        again = client.send_task(TASK, args=(42, 0.1, str(journal))).get(timeout=60)
    finally:
        client.close()
    assert len({r["pid"] for r in results}) == 2, (results, log.read_text())  # both children took one
    assert sorted(r["ran"] for r in results) == [False, True], results
    assert again["ran"]
    lines = journal.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["start", "end", "start", "end"], lines
    assert "LockLost" not in log.read_text()
