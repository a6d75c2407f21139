"""The read/write lock's faces: inspect() and ``redlock status`` show the writer and the readers,
``redlock run --shared / --exclusive`` (flock -s / -x), and the blocking API's ``rw_lock``."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import threading
import time
from pathlib import Path

from redlock_async.cli._codes import EXIT_HELD, EXIT_NOT_ACQUIRED
from redlock_async.sync import Redlock as SyncRedlock
from redlock_async.testing import History

from .conftest import Cluster, MakeRedlock, eventually

PY = sys.executable
W_READERS = b"redlock:\x00rw\x00doc\x00readers"


def digest(token: str | None) -> str:
    assert token is not None
    return hashlib.sha1(token.encode()).hexdigest()[:8]


async def cli(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    command, rest = args[0], args[1:]
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", command, "--nodes", ",".join(cluster.urls), *rest,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_inspect_shows_the_readers_then_the_writer(make_redlock: MakeRedlock) -> None:
    # The Redlock's ttl is its locks': its quarantine then trusts the nodes it marked (test_inspect.py).
    redlock = await make_redlock(ttl=30.0)
    rw = redlock.rw_lock("doc", owner="reporting")
    readers = [rw.read(), rw.read()]
    for reader in readers:
        assert await reader.acquire(blocking=False)
    info = await redlock.inspect("doc")
    assert info.state == "held"
    assert info.writer is None
    assert sorted(r.holder or "" for r in info.readers) == sorted(digest(r.token) for r in readers)
    assert all(r.owner == "reporting" and r.state == "held" and len(r.nodes) == 5 for r in info.readers)
    for reader in readers:
        await reader.release()
    assert (await redlock.inspect("doc")).state == "free"
    writer = redlock.rw_lock("doc", fencing=True).write()
    assert await writer.acquire(blocking=False)
    info = await redlock.inspect("doc")
    assert info.state == "held"
    assert info.readers == ()
    assert info.writer is not None
    assert info.writer.holder == digest(writer.token)
    assert info.writer.fencing_counter == writer.fencing_token
    await writer.release()


async def test_inspect_and_status_judge_each_readers_entry_by_the_nodes_clock(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    """A reader's entry past its expiry (its reader died) is no holder, though the readers' hash still holds
    it (another reader keeps the hash alive): a verdict that counted it would keep writers waiting in vain,
    one that missed the live reader beside it would call a held lock free."""
    redlock = await make_redlock(ttl=30.0)
    rw = redlock.rw_lock("doc")
    dead, alive = rw.read(), redlock.rw_lock("doc", ttl=0.5).read()
    assert await dead.acquire(blocking=False)
    assert await alive.acquire(blocking=False)  # (no watchdog: held with acquire(), it is never extended)
    dead, alive = alive, dead  # the 0.5 s reader dies: never extended, never released
    await asyncio.sleep(0.8)
    readers = W_READERS
    for i in range(len(cluster)):
        assert cluster[i].command("HLEN", readers) == 2  # both entries are there, one past its expiry
    info = await redlock.inspect("doc")
    assert info.state == "held"
    assert [reader.holder for reader in info.readers] == [digest(alive.token)]
    code, out, _ = await cli(cluster, "status", "doc")
    assert code == EXIT_HELD, out
    assert digest(alive.token) in out
    assert digest(dead.token) not in out
    # Only the dead entry left (the hash kept alive by hand): free, and said so.
    token = alive.token
    assert token is not None
    member = hashlib.sha1(token.encode()).hexdigest()
    for i in range(len(cluster)):
        cluster[i].command("HDEL", readers, member)
        cluster[i].command("PEXPIRE", readers, 60_000)
    info = await redlock.inspect("doc")
    assert (info.state, info.readers) == ("free", ()), info
    code, out, _ = await cli(cluster, "status", "doc")
    assert code == 0, out
    assert await rw.write().acquire(blocking=False)  # and a writer agrees


async def test_status_shows_readers_and_a_writer(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock(ttl=30.0)
    rw = redlock.rw_lock("doc")
    a, b = rw.read(), rw.read()
    assert await a.acquire(blocking=False)
    assert await b.acquire(blocking=False)
    code, out, _ = await cli(cluster, "status", "doc")
    tokens = a.token, b.token
    await a.release()
    await b.release()
    assert code == EXIT_HELD, out
    assert "read/write lock doc: no writer, 2 readers" in out
    assert f"reader {digest(tokens[0])}" in out
    assert f"reader {digest(tokens[1])}" in out
    assert "verdict: held by 2 readers of read/write lock doc" in out
    async with rw.write() as writer:
        code, out, _ = await cli(cluster, "status", "doc")
        token = writer.token
    assert code == EXIT_HELD, out
    assert "read/write lock doc: a writer, 0 readers" in out
    assert f"verdict: held by the writer {digest(token)}" in out
    code, out, _ = await cli(cluster, "status", "doc")
    assert code == 0, out


async def test_run_shared_commands_run_together_and_exclusive_alone(cluster: Cluster, tmp_path: Path) -> None:
    # Each command says it runs, waits (up to 20 s) until all three do, and prints when it went on and
    # ended (monotonic: one clock for every process here). Readers that exclude each other never meet.
    met = tmp_path / "met"
    met.mkdir()
    span = (
        "import os, pathlib, time\n"
        f"met = pathlib.Path({str(met)!r}); (met / str(os.getpid())).touch(); give_up = time.monotonic() + 20\n"
        "while len(list(met.iterdir())) < 3 and time.monotonic() < give_up: time.sleep(0.01)\n"
        "a = time.monotonic(); time.sleep(0.3); print(a, time.monotonic())"
    )
    shared = [await_cli(cluster, "run", "doc", "--shared", "--wait", "10", "--", PY, "-c", span) for _ in range(3)]
    results = await asyncio.gather(*shared)
    assert [code for code, _, _ in results] == [0, 0, 0], results
    spans = [tuple(map(float, out.split())) for _, out, _ in results]
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans  # all three at once
    # A reader that says when its command runs (under load a CLI process takes a second to start) and
    # reads until the writer has come and gone (at most 30 s): the writer finds the lock held.
    started, written = tmp_path / "reading", tmp_path / "writer-done"
    body = (
        f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); give_up = time.monotonic() + 30\n"
        f"while not pathlib.Path({str(written)!r}).exists() and time.monotonic() < give_up: time.sleep(0.01)"
    )
    reading = asyncio.ensure_future(await_cli(cluster, "run", "doc", "--shared", "--", PY, "-c", body))
    try:
        assert await eventually(started.exists, 30.0)
        code, out, err = await cli(cluster, "run", "doc", "--exclusive", "--", PY, "-c", "print('wrote')")
        assert code == EXIT_NOT_ACQUIRED, err
        assert "held elsewhere by readers or a writer" in err
    finally:
        written.touch()
        read = await reading  # the reader's process ends here whatever the outcome: nothing leaks into later tests
    assert read[0] == 0, read
    code, out, err = await cli(
        cluster,
        "run",
        "doc",
        "--exclusive",
        "--fencing",
        "--",
        PY,
        "-c",
        "import os; print(os.environ['REDLOCK_FENCING_TOKEN'])",
    )
    assert code == 0, err
    token = int(out)
    code, out, err = await cli(
        cluster,
        "run",
        "doc",
        "--shared",
        "--fencing",
        "--",
        PY,
        "-c",
        "import os; print(os.environ['REDLOCK_FENCING_TOKEN'])",
    )
    assert (code, int(out)) == (0, token)  # a reader sees the last writer's token


async def await_cli(cluster: Cluster, *args: str) -> tuple[int, str, str]:
    return await cli(cluster, *args)


async def test_run_shared_or_exclusive_says_what_to_change(cluster: Cluster) -> None:
    code, _, err = await cli(cluster, "run", "a", "b", "--shared", "--", "true")
    assert code == 2
    assert "--shared takes one NAME (a read/write lock), without --limit or --standby" in err
    code, _, err = await cli(cluster, "run", "a", "--shared", "--exclusive", "--", "true")
    assert code == 2
    assert "not allowed with argument" in err


def test_the_blocking_api_has_rw_lock(cluster: Cluster) -> None:
    history = History()
    with SyncRedlock(cluster.urls, retry_delay=0.02) as redlock:
        rw = redlock.rw_lock("doc", ttl=5.0)
        inside = []

        def reader(i: int) -> None:
            for _ in range(5):
                with rw.read() as lock, history.section(f"r{i}", lock, shared=True):
                    inside.append(i)
                    time.sleep(0.02)

        def writer() -> None:
            for _ in range(5):
                with rw.write() as lock, history.section("w", lock):
                    time.sleep(0.01)
                time.sleep(0.02)

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)] + [threading.Thread(target=writer)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    history.check()
    assert len(history.sections) == 20
