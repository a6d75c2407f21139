"""The ``redlock run`` command: a distributed flock, against real nodes and real child processes."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import pty
import re
import signal
import socket
import sys
import time
import tty
from pathlib import Path

import pytest

from redlock_async._core._names import semaphore_keys
from redlock_async.cli import (
    EXIT_HELD,
    EXIT_LOST,
    EXIT_NOT_ACQUIRED,
    EXIT_UNAVAILABLE,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    _check_names,
    main,
)
from redlock_async.cli._run import waiting_note

from .conftest import (
    INTERRUPTIBLE,
    Cluster,
    MakeRedlock,
    assert_empty,
    client_connections,
    eventually,
    free_port,
    holders,
    lock_keys,
    mark_in_service,
    refusing_server,
)

PY = sys.executable
NOWHERE = "redis://127.0.0.1:1"  # never connected to: these cases fail before any I/O


async def redlock_run(urls: list[str], *args: str, stderr: int = asyncio.subprocess.PIPE) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PY,
        "-m",
        "redlock_async",
        "run",
        "--nodes",
        ",".join(urls),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
    )


async def finish(process: asyncio.subprocess.Process, timeout: float = 30) -> tuple[int, str, str]:
    async with asyncio.timeout(timeout):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_runs_the_command_under_the_lock_and_passes_its_status(cluster: Cluster) -> None:
    script = "import sys; print('inside'); sys.exit(3)"
    code, out, _ = await finish(await redlock_run(cluster.urls, "job", "--", PY, "-c", script))
    assert (code, out.strip()) == (3, "inside")
    assert [cluster[i].command("GET", "redlock:job") for i in range(len(cluster))] == [None] * len(cluster)


async def test_does_not_run_when_the_lock_is_held(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    async with redlock.lock("busy-job"):
        code, out, err = await finish(
            await redlock_run(cluster.urls, "busy-job", "--wait", "0.3", "--", PY, "-c", "print('ran')")
        )
    assert code == EXIT_NOT_ACQUIRED
    assert "ran" not in out
    assert "held elsewhere" in err


async def test_exports_the_fencing_token(cluster: Cluster) -> None:
    script = "import os; print(os.environ['REDLOCK_FENCING_TOKEN'])"
    first = await finish(await redlock_run(cluster.urls, "fenced-job", "--fencing", "--", PY, "-c", script))
    second = await finish(await redlock_run(cluster.urls, "fenced-job", "--fencing", "--", PY, "-c", script))
    assert first[0] == second[0] == 0
    assert int(second[1]) > int(first[1]) >= 1


async def test_fence_ttl_bounds_the_counter_and_floors_the_token(cluster: Cluster) -> None:
    script = "import os; print(os.environ['REDLOCK_FENCING_TOKEN'])"
    before_us = time.time_ns() // 1000
    code, out, err = await finish(
        await redlock_run(cluster.urls, "bounded-job", "--fencing", "--fence-ttl", "3600", "--", PY, "-c", script)
    )
    assert code == 0, err
    assert int(out) >= before_us - 1_000_000  # the nodes' clock in microseconds (this machine's)
    for i in range(len(cluster)):
        assert 3_590_000 < int(cluster[i].command("PTTL", "redlock-fence:bounded-job")) <= 3_600_000  # type: ignore[call-overload]
    code, _, err = await run_cli("run", "x", "--nodes", NOWHERE, "--fencing", "--fence-ttl", "5", "--", "true")
    assert code == 2
    assert "fence_ttl (5.0 s) must be at least 100.0 s" in err


async def test_signals_reach_the_command_and_the_lock_is_released(cluster: Cluster) -> None:
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(5)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    process = await redlock_run(cluster.urls, "signalled-job", "--", PY, "-c", script)
    assert process.stdout is not None
    async with asyncio.timeout(20):
        assert (await process.stdout.readline()).strip() == b"ready"
    process.send_signal(signal.SIGTERM)
    code, out, _ = await finish(process)
    assert code == 5
    assert "got TERM" in out
    assert [cluster[i].command("GET", "redlock:signalled-job") for i in range(len(cluster))] == [None] * len(cluster)


@pytest.mark.parametrize("name", ["TERM", "INT"])
async def test_a_signal_sent_as_the_command_starts_still_reaches_it(cluster: Cluster, name: str) -> None:
    """A signal that comes while the command is being started (here the command itself sends it to
    redlock, its parent, first thing) is the command's too: it is not lost, and redlock is not killed
    by it, leaving the lock on the nodes (CI: the signal test saw redlock die of SIGTERM, -15)."""
    script = (
        f"sleep 10 </dev/null >/dev/null 2>&1 & s=$!; trap 'kill $s; echo got {name}; exit 5' {name}; "
        f"kill -{name} $PPID; wait $s"
    )
    for _ in range(5):  # each time: the window is a few loop turns wide
        process = await redlock_run(cluster.urls, "self-signalled", "--", "sh", "-c", script)
        code, out, err = await finish(process)
        assert (code, out.strip()) == (5, f"got {name}"), err
        assert [cluster[i].command("GET", "redlock:self-signalled") for i in range(len(cluster))] == [None] * 5


@pytest.mark.slow
async def test_a_lost_lock_stops_the_command(faulty: Cluster) -> None:
    script = "import time; print('ready', flush=True); time.sleep(60)"
    process = await redlock_run(faulty.urls, "doomed-job", "--ttl", "1", "--grace", "2", "--", PY, "-c", script)
    assert process.stdout is not None
    async with asyncio.timeout(20):
        assert (await process.stdout.readline()).strip() == b"ready"
    for i in (0, 1, 2):
        faulty[i].pause()
    code, _, err = await finish(process, timeout=20)
    assert code == EXIT_LOST
    assert "lost doomed-job" in err
    for i in (0, 1, 2):
        faulty[i].resume()


async def test_usage_errors_say_what_to_change(cluster: Cluster) -> None:
    code, _, err = await finish(await redlock_run(cluster.urls, "job"))
    assert code == 2
    assert "give the command after --" in err
    assert err.startswith("usage: redlock run ")  # run's own usage line, not the top-level one
    code, _, err = await finish(await redlock_run(cluster.urls, "job", "--ttl", "-1", "--", "true"))
    assert code == 2
    assert "ttl" in err
    assert err.startswith("usage: redlock run ")


async def test_waiting_is_shown_on_stderr_in_plain_lines(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    code, out, err = await finish(await redlock_run(cluster.urls, "queued-job", "--wait", "5", "--", "true"))
    assert (code, out, err) == (0, "", "")  # had at once: nothing to show
    async with redlock.lock("queued-job"):
        process = await redlock_run(cluster.urls, "queued-job", "--wait", "10", "--", PY, "-c", "print('ran')")
        assert process.stderr is not None
        async with asyncio.timeout(10):
            waiting = await process.stderr.readline()
    assert waiting == b"redlock: waiting for lock 'queued-job' (up to 10 s)\n"
    code, out, err = await finish(process)
    assert (code, out) == (0, "ran\n")
    assert re.fullmatch(r"redlock: acquired lock 'queued-job' after \d+\.\d s\n", err)


@pytest.mark.slow
async def test_a_wait_that_runs_out_says_so(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    async with redlock.lock("queued-job"):
        code, out, err = await finish(await redlock_run(cluster.urls, "queued-job", "--wait", "0.5", "--", "true"))
        quiet = await finish(await redlock_run(cluster.urls, "queued-job", "--wait", "0.5", "-q", "--", "true"))
    assert (code, out) == (EXIT_NOT_ACQUIRED, "")
    lines = err.splitlines()
    assert lines[0] == "redlock: waiting for lock 'queued-job' (up to 0.5 s)"
    assert re.fullmatch(r"redlock: gave up on lock 'queued-job' after 0\.\d s", lines[1])
    assert "held elsewhere" in lines[2]
    assert quiet[:2] == (EXIT_NOT_ACQUIRED, "")
    assert "waiting" not in quiet[2]
    assert "gave up" not in quiet[2]
    assert "held elsewhere" in quiet[2]


async def read_until_closed(fd: int) -> bytes:
    """All a pseudo-terminal's master end reads until every slave end is closed."""
    loop = asyncio.get_running_loop()
    data, closed = bytearray(), loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: no slave end left
            chunk = b""
        data.extend(chunk)
        if not chunk and not closed.done():
            closed.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await closed
    finally:
        loop.remove_reader(fd)
    return bytes(data)


async def test_a_terminal_gets_a_spinner(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    master, slave = pty.openpty()
    tty.setraw(slave)  # no \n -> \r\n: every \r read is the spinner's own
    try:
        async with redlock.lock("spun-job"):
            process = await redlock_run(cluster.urls, "spun-job", "--wait", "1", "--", "true", stderr=slave)
            os.close(slave)
            slave = -1
            async with asyncio.timeout(20):
                out, _ = await process.communicate()
                shown = await read_until_closed(master)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert (process.returncode, out) == (EXIT_NOT_ACQUIRED, b"")
    assert re.search(rb"\r\S+ waiting for lock 'spun-job' 0\.\d s \(up to 1 s\)", shown)
    assert shown.count(b"\r") >= 5  # refreshed ~10 times a second
    assert b"\r\x1b[K" in shown  # erased when the wait ended
    assert b"redlock: waiting" not in shown  # no plain lines on a terminal


async def redlock_status(urls: list[str], name: str, *options: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "status", name, "--nodes", ",".join(urls), *options,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    return await finish(process)


async def test_status_shows_holder_digest_and_verdict(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    code, out, _ = await redlock_status(cluster.urls, "inspected")
    assert code == 0
    assert "verdict: free (5 of 5 nodes answered; no one can hold a majority)" in out
    redlock = await make_redlock(fencing=True)
    async with redlock.lock("inspected", ttl=30) as lock:
        token = lock.token
        assert token is not None
        code, out, _ = await redlock_status(cluster.urls, "inspected")
    digest = hashlib.sha1(token.encode()).hexdigest()[:8]
    assert code == EXIT_HELD
    assert token not in out  # never the value itself
    assert out.count(f"held by {digest} ({lock.owner})") == 5 + 1  # the digest and the owner label
    assert f"verdict: held by {digest} ({lock.owner}) on 5 of 5 nodes (a majority)" in out
    assert lock.owner == f"{socket.gethostname()}:{os.getpid()}"
    assert "fencing counter 1" in out


async def test_status_shows_the_owner_label_given_to_run(cluster: Cluster) -> None:
    process = await redlock_run(
        cluster.urls, "labelled", "--owner", "nightly-backup", "--", PY, "-c", "import time; time.sleep(30)"
    )
    try:
        assert await eventually(lambda: all(lock_keys(cluster[i]) for i in range(len(cluster))), 10)
        code, out, _ = await redlock_status(cluster.urls, "labelled")
        assert code == EXIT_HELD, out
        assert out.count("(nightly-backup)") == 5 + 1
    finally:
        process.send_signal(signal.SIGTERM)
        await finish(process)
    code, _, err = await run_cli("run", "x", "--nodes", NOWHERE, "--owner", "two\nlines", "--", "true")
    assert code == 2
    assert "--owner: owner must be a non-empty label of printable characters" in err


STANDBY_COMMAND = (
    "import os, sys, time; print(os.environ['REDLOCK_FENCING_TOKEN'], flush=True); time.sleep(float(sys.argv[1]))"
)


async def standby(urls: list[str], owner: str, hold: float) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "run", "scheduler", "--standby", "--ttl", "1", "--owner", owner, "-q",
        "--nodes", ",".join(urls), "--", PY, "-c", STANDBY_COMMAND, str(hold),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.serial
async def test_standby_takes_over_from_a_killed_leader_with_a_larger_term(cluster: Cluster) -> None:
    """Two hot standbys; the leader's redlock run is SIGKILLed (its command dies with it): the other
    runs its command once the lease is over, with a larger term, and never beside the first."""
    first = await standby(cluster.urls, "first", 60)
    assert first.stdout is not None
    async with asyncio.timeout(10):
        first_term = int(await first.stdout.readline())
    second = await standby(cluster.urls, "second", 0.1)
    assert second.stdout is not None
    try:
        await asyncio.sleep(1.5)  # the second waits as long as the first leads (no time limit)
        assert second.returncode is None
        # --ttl 1, the standbys' own: nodes started seconds ago and vouched for under a 1 s quarantine
        # sit out the default 10 s one (a longer lease might be lost there), and status would say unknown.
        code, out, _ = await redlock_status(cluster.urls, "scheduler", "--ttl", "1")
        assert code == EXIT_HELD
        assert "(first)" in out
        killed_at = time.monotonic()
        first.kill()  # SIGKILL: its command dies with it (PR_SET_PDEATHSIG), the lease runs out
        await first.wait()
        async with asyncio.timeout(10):
            second_term = int(await second.stdout.readline())
        took = time.monotonic() - killed_at
        assert second_term > first_term
        # After the lease, not before it: the watchdog extends a third of the ttl before the end, so at the
        # kill at least ~0.33 s of the 1 s lease was left (0.43 s was seen); well within 5 s.
        assert 0.3 < took < 5, took
        code, _, err = await finish(second)
        assert code == 0, err
    finally:
        for process in (first, second):
            if process.returncode is None:
                process.kill()
                await process.wait()


@pytest.mark.slow
@pytest.mark.serial
async def test_a_resigning_leader_hands_over_to_the_standby_at_once(cluster: Cluster) -> None:
    first = await standby(cluster.urls, "first", 1.0)
    assert first.stdout is not None
    async with asyncio.timeout(10):
        first_term = int(await first.stdout.readline())
    second = await standby(cluster.urls, "second", 0.1)
    assert second.stdout is not None
    code, _, err = await finish(first)  # its command ends: it resigns (releases)
    resigned_at = time.monotonic()
    assert code == 0, err
    async with asyncio.timeout(10):
        second_term = int(await second.stdout.readline())
    assert time.monotonic() - resigned_at < 0.8  # the pushed hand-off, not the lease running out
    assert second_term > first_term
    assert (await finish(second))[0] == 0


def test_standby_says_what_to_change(capsys: pytest.CaptureFixture[str]) -> None:
    # In process (the command's main(), as `python -m redlock_async` runs it): a usage error, before any I/O.
    for args, says in (
        (["a", "b", "--standby"], "--standby takes one NAME"),
        (["a", "--standby", "--limit", "2"], "--standby takes one NAME"),
        (["a", "--standby", "--wait", "5"], "--standby waits with no time limit"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(["run", *args, "--nodes", NOWHERE, "--", "true"])
        err = capsys.readouterr().err
        assert exited.value.code == 2, (args, err)
        assert says in err, (args, err)


WRITES = ("set", "del", "eval", "evalsha", "script|load", "script", "publish", "pexpire", "incr")


def write_calls(cluster: Cluster) -> list[dict[str, int]]:
    """Per node, the calls so far of every command that writes (INFO commandstats)."""
    counts = []
    for i in range(len(cluster)):
        stats = cluster[i].command("INFO", "commandstats")
        assert isinstance(stats, dict)
        counts.append({name: int(stats[f"cmdstat_{name}"]["calls"]) for name in WRITES if f"cmdstat_{name}" in stats})
    return counts


async def test_status_writes_nothing_to_any_node(faulty: Cluster) -> None:
    """Not even the restart quarantine's marker on a node that restarted empty (it would vouch for the
    node to clients with longer leases), nor a script probe."""
    from redlock_async import Redlock

    async with Redlock(faulty.urls) as holder, holder.lock("watched", ttl=30.0):
        faulty[2].restart(keep_data=False)
        before = write_calls(faulty)
        for _ in range(2):
            code, out, _ = await redlock_status(faulty.urls, "watched")
            assert code == EXIT_HELD, out
        assert write_calls(faulty) == before
        assert faulty[2].command("GET", "redlock:") is None  # no marker written


async def test_status_is_unknown_when_the_silent_nodes_could_make_a_majority(faulty: Cluster) -> None:
    for i in range(len(faulty)):
        mark_in_service(faulty[i])  # a cluster in service (one met new with nodes down is not known to be new)
    for i in (0, 1):  # a holder on 2 of 5 nodes, 2 nodes down: 2 + 2 could be a majority
        faulty[i].command("SET", "redlock:split", "someone", "PX", 60_000)
    faulty[3].kill()
    faulty[4].kill()
    code, out, _ = await redlock_status(faulty.urls, "split")
    assert code == EXIT_UNKNOWN, out
    assert "verdict: unknown" in out
    # One node silent and the holder on one: 1 + 1 cannot make a majority: free.
    faulty[3].restart()
    mark_in_service(faulty[3])  # as a client does once its quarantine is over
    faulty[1].command("DEL", "redlock:split")
    code, out, _ = await redlock_status(faulty.urls, "split")
    assert code == 0, out
    assert "verdict: free (4 of 5 nodes answered" in out


async def test_status_keeps_logs_out_of_its_table_and_says_each_error_once(cluster: Cluster) -> None:
    for i in (0, 1):
        mark_in_service(cluster[i])  # a cluster in service (one met new with a node down is not known to be new)
    dead = f"redis://127.0.0.1:{free_port()}"
    code, out, err = await redlock_status([*cluster.urls[:2], dead], "table")
    assert code == 0, out  # 2 of 3 answered, free: no one can hold a majority
    assert err == ""  # no log line mixed in: the table says which node could not be reached, and why
    line = next(line for line in out.splitlines() if dead.removeprefix("redis://") in line)
    assert line.split(None, 1)[1] == "unreachable (Connection refused)", line
    assert out.count("Connection refused") == 1
    assert "Errno" not in out


async def test_run_with_a_majority_down_says_too_few_nodes_answered(faulty: Cluster) -> None:
    for i in range(len(faulty)):
        mark_in_service(faulty[i])  # a cluster in service (one met new with nodes down is not known to be new)
    for i in (0, 1, 2):
        faulty[i].kill()
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", "run", "job", "--nodes", ",".join(faulty.urls), "--", PY, "-c", "print('ran')",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    code, out, err = await finish(process)
    assert code == EXIT_UNAVAILABLE, err
    assert "ran" not in out
    assert re.search(
        r"nodes unavailable: [0-2] of 5 nodes answered, 3 could not \(a majority is 3\): not running", err
    ), err
    assert "held elsewhere" not in err
    assert "quarantine" not in err


async def test_run_on_nodes_in_restart_quarantine_says_so_and_for_how_long(faulty: Cluster) -> None:
    """A --ttl 1 client first vouches for the nodes under its short quarantine; a --ttl 60 client sits
    them out for its own: it says restart quarantine and when a majority counts again, not "held elsewhere"."""
    nodes = ",".join(faulty.urls)
    code, out, err = await run_cli("run", "job", "--ttl", "1", "--nodes", nodes, "--", PY, "-c", "print('first')")
    assert (code, out.strip()) == (0, "first"), err
    code, out, err = await run_cli(
        "run", "job", "--ttl", "60", "--wait", "0.5", "--nodes", nodes, "--", PY, "-c", "print('ran')"
    )
    assert code == EXIT_UNAVAILABLE, err
    assert "ran" not in out
    assert "held elsewhere" not in err
    said = re.search(r"in restart quarantine: a majority can vote again in ([0-9.]+) s: not running", err)
    assert said is not None, err
    # The 60 s lease's quarantine, counted from when the client met the nodes (not the 1 s one's); what is
    # left when it says so shrinks with a slow start: 49.1 s once on a 2-core box with other work beside it.
    assert 30 < float(said[1]) <= 61
    assert "vouched for only under a shorter quarantine than ours" in err


# -- the command line as an operator meets it ------------------------------------------------------


async def run_cli(*args: str | bytes) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        PY, "-m", "redlock_async", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    return await finish(process)


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "waiting-lines"])
async def test_ctrl_c_while_waiting_is_one_line_and_130(
    cluster: Cluster, make_redlock: MakeRedlock, quiet: bool
) -> None:
    redlock = await make_redlock()
    async with redlock.lock("interrupted", ttl=30.0) as holder:
        before = [client_connections(cluster[i]) for i in range(len(cluster))]
        process = await asyncio.create_subprocess_exec(
            *INTERRUPTIBLE, PY, "-m", "redlock_async", "run", "interrupted", "--nodes", ",".join(cluster.urls),
            "--wait", "30", *(["--quiet"] if quiet else []), "--", PY, "-c", "print('ran')",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        # It waits for the lock once it is connected to every node (and, without --quiet, has said so), not
        # after a fixed time: CI's first run, compiling redis-py's bytecode, was still importing after 1.5 s.
        assert await eventually(lambda: all(client_connections(cluster[i]) > n for i, n in enumerate(before)), 20.0)
        said = b""
        if not quiet:
            assert process.stderr is not None
            async with asyncio.timeout(20):
                said = await process.stderr.readline()
        process.send_signal(signal.SIGINT)
        code, out, err = await finish(process)
        err = said.decode() + err
        assert code == 130, err
        assert out == ""
        # Without --quiet the wait was announced; the interruption is still one line, and no "gave up".
        waiting = [] if quiet else ["redlock: waiting for lock 'interrupted' (up to 30 s)"]
        assert err.strip().splitlines() == [*waiting, "redlock: interrupted"]
        token = holder.token
        assert token is not None
        # Nothing of the interrupted acquire is left: each node holds the holder's key, or nothing.
        for i in range(len(cluster)):
            assert cluster[i].command("GET", "redlock:interrupted") in (token.encode(), None)
    await asyncio.sleep(0.2)
    assert all(cluster[i].command("EXISTS", "redlock:interrupted") == 0 for i in range(len(cluster)))


async def test_forgetting_the_double_dash_gets_a_hint(cluster: Cluster) -> None:
    code, _, err = await run_cli("run", "job", "--nodes", ",".join(cluster.urls), "true")
    assert code == 2
    assert "usage: redlock run NAME" in err  # the subcommand's usage, not the top-level one
    assert "unrecognized arguments: true (put the command after --: redlock run NAME -- CMD" in err


async def test_empty_nodes_and_a_command_after_status_are_refused(cluster: Cluster) -> None:
    code, _, err = await run_cli("run", "job", "--nodes", "", "--", "true")
    assert (code, "--nodes is empty" in err) == (2, True)
    code, _, err = await run_cli("status", "job", "--nodes", ",".join(cluster.urls), "--", "rm", "-rf", "/")
    assert code == 2
    assert "nothing comes after -- in redlock status: got rm -rf /" in err


async def test_a_command_that_is_not_executable_exits_126(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho ran\n")  # not chmod +x
    code, out, err = await run_cli("run", "job", "--nodes", ",".join(cluster.urls), "--", str(script))
    assert (code, out) == (126, "")
    assert "cannot run" in err
    code, _, _ = await run_cli("run", "job", "--nodes", ",".join(cluster.urls), "--", str(tmp_path / "missing"))
    assert code == 127


async def test_wait_zero_says_one_try(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    async with redlock.lock("one-try", ttl=10.0):
        code, _, err = await run_cli("run", "one-try", "--nodes", ",".join(cluster.urls), "--", "true")
    assert code == EXIT_NOT_ACQUIRED
    assert "is held elsewhere: not running true (one try (--wait 0); --wait S waits for it)" in err
    assert "pending" not in err
    assert "0.0 s" not in err


def test_every_subcommand_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    # In process (the command's main()); `python -m redlock_async run --help` runs as a process below.
    for command in ("run", "status", "break", "demo"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0, command
        out = capsys.readouterr().out
        assert "exit status" in " ".join(out.split()).lower(), command  # argparse wraps lines


# -- bad input: usage errors say what to change, and nothing is sent --------------------------------------


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (["--ttl", "abc"], r"argument --ttl: invalid float value: 'abc'"),
        (["--ttl", "nan"], r"redlock run: error: --ttl must be a number of seconds, got NaN"),
        (["--ttl", "inf"], r"redlock run: error: --ttl must be finite"),
        (["--ttl", "1e400"], r"redlock run: error: --ttl must be finite"),
        (["--ttl", "-1"], r"redlock run: error: --ttl must be > 0 seconds"),
        (["--ttl", "0"], r"redlock run: error: --ttl must be > 0 seconds"),
        (["--ttl", "0.1"], r"redlock run: error: --ttl must be at least 0\.5 seconds, got 0\.1"),
        (["--ttl", "1e16"], r"redlock run: error: ttl must be at most"),
        (["--wait", "-1"], r"redlock run: error: --wait must be >= 0 seconds, got -1\.0"),
        (["--wait", "nan"], r"redlock run: error: --wait must be a number of seconds, got NaN"),
        (["--grace", "nan"], r"redlock run: error: --grace must be a number of seconds, got NaN"),
        (["--grace", "-1"], r"redlock run: error: --grace must be >= 0 seconds"),
        (["--grace", "inf"], r"redlock run: error: --grace must be finite"),
        (["--nodes", "garbage"], r"redlock run: error: nodes\[0\] is not a usable Redis URL"),
        (["--nodes", "redis://h:port"], r"redlock run: error: nodes\[0\] is not a usable Redis URL"),
        (["--nodes", " , ,"], r"redlock run: error: --nodes is empty: give URL,URL"),
        (
            ["--nodes", f"{NOWHERE},{NOWHERE}"],
            r"redlock run: error: nodes\[1\] \(127\.0\.0\.1:1\) is the same server as nodes\[0\]",
        ),
    ],
)
def test_cli_run_options_say_what_to_change(args: list[str], pattern: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "job", "--nodes", NOWHERE, *args, "--", "true"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert re.search(pattern, capsys.readouterr().err)


@pytest.mark.parametrize("command", ["run", "status"])
@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("", r"resource name is empty: name the thing the lock protects"),
        ("x" * (1 << 20), r"resource name is 1048576 bytes, more than 4096: hash long names"),
    ],
    ids=["empty", "1MB"],
)
def test_cli_bad_names(
    command: str, name: str, pattern: str, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, name, "--nodes", ",".join(cluster.urls)] + (["--", "true"] if command == "run" else [])
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert re.search(rf"redlock {command}: error: {pattern}", capsys.readouterr().err)
    assert [lock_keys(cluster[i]) for i in range(len(cluster))] == [[]] * len(cluster)  # nothing was sent


@pytest.mark.slow
async def test_cli_locks_a_name_that_is_not_utf8_as_its_bytes(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    nodes = ",".join(cluster.urls)
    redlock = await make_redlock()
    async with redlock.lock(b"\xff\xfe", ttl=10.0) as lock:
        code, _, err = await run_cli("run", b"\xff\xfe", "--nodes", nodes, "--", PY, "-c", "print('ran')")
        assert code == EXIT_NOT_ACQUIRED, err
        assert "redlock: \\xff\\xfe is held elsewhere" in err
        code, out, err = await run_cli("status", b"\xff\xfe", "--nodes", nodes)
        assert code == 1, err  # held
        assert out.startswith("\\xff\\xfe on 5 nodes")
        assert lock.token is not None
        assert out.count("held by ") == 5 + 1  # each node, and the verdict
    code, out, err = await run_cli("run", b"\xff\xfe", "--nodes", nodes, "--", PY, "-c", "print('ran')")
    assert (code, out.strip()) == (0, "ran"), err
    await assert_empty(cluster)


async def test_cli_with_a_node_that_refuses_scripts(cluster: Cluster) -> None:
    with refusing_server("acl-without-scripting") as (server, url):
        code, out, err = await run_cli("run", "job", "--nodes", url, "--", PY, "-c", "print('ran')")
        assert code == 1
        assert "ran" not in out
        assert "redlock: 1 of 1 nodes refuse commands the lock scripts run" in err
        assert "Traceback" not in err
        assert lock_keys(server) == []


# -- several names, and semaphores (--limit) --------------------------------------------------------------

HOLD = (
    "import os, sys, time\n"
    "print('ready', flush=True)\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
)
"""A command that says it runs, then runs until the file named by its argument exists."""


async def ready(process: asyncio.subprocess.Process) -> None:
    assert process.stdout is not None
    async with asyncio.timeout(20):
        assert (await process.stdout.readline()).strip() == b"ready"


async def test_several_names_are_all_held_while_the_command_runs(
    cluster: Cluster, make_redlock: MakeRedlock, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    process = await redlock_run(cluster.urls, "a", "b", "--", PY, "-c", HOLD, str(go))
    await ready(process)
    assert len(holders(cluster, "a")) >= 3
    assert len(holders(cluster, "b")) >= 3
    redlock = await make_redlock()
    for name in ("a", "b"):
        assert not await redlock.lock(name).acquire(blocking=False), name
    assert not await redlock.lock_many(["b", "c"]).acquire(blocking=False)
    go.touch()
    code, out, err = await finish(process)
    assert (code, out, err) == (0, "", "")  # "ready" was read above
    await assert_empty(cluster)


async def test_one_of_several_names_held_elsewhere_keeps_the_command_from_running(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    nodes = ",".join(cluster.urls)
    redlock = await make_redlock()
    async with redlock.lock("b", ttl=30.0):
        code, out, err = await run_cli("run", "a", "b", "--nodes", nodes, "--", "true")
        assert (code, out) == (EXIT_NOT_ACQUIRED, "")
        assert err == (
            "redlock: at least one of locks 'a'+'b' is held elsewhere: not running true "
            "(one try (--wait 0); --wait S waits for it)\n"
        )
        assert holders(cluster, "a") == []  # all or none: 'a' is not left taken
        code, out, err = await finish(await redlock_run(cluster.urls, "b", "a", "--wait", "0.5", "--", "true"))
        assert (code, out) == (EXIT_NOT_ACQUIRED, "")
        lines = err.splitlines()  # the names in the order given
        assert lines[0] == "redlock: waiting for locks 'b'+'a' (up to 0.5 s)"
        assert re.fullmatch(r"redlock: gave up on locks 'b'\+'a' after 0\.\d s", lines[1])
        assert lines[2:] == [
            "redlock: at least one of locks 'b'+'a' is held elsewhere: not running true (waited 0.5 s)"
        ]
        process = await redlock_run(cluster.urls, "a", "b", "--wait", "20", "--", PY, "-c", "print('ran')")
        assert process.stderr is not None
        async with asyncio.timeout(10):
            assert await process.stderr.readline() == b"redlock: waiting for locks 'a'+'b' (up to 20 s)\n"
    code, out, err = await finish(process)  # 'b' released: both are had
    assert (code, out) == (0, "ran\n")
    assert re.fullmatch(r"redlock: acquired locks 'a'\+'b' after \d+\.\d s\n", err)
    await assert_empty(cluster)


async def test_several_names_export_every_fencing_token(cluster: Cluster) -> None:
    show = "import os; print(os.environ['REDLOCK_FENCING_TOKEN'], os.environ.get('REDLOCK_FENCING_TOKENS'))"
    for expected in ("1 None", "2 None"):  # one name: $REDLOCK_FENCING_TOKEN only, as before
        code, out, err = await finish(await redlock_run(cluster.urls, "--fencing", "a", "--", PY, "-c", show))
        assert (code, out.strip()) == (0, expected), err
    # The first NAME's token; every NAME's, in the order given, a repeated NAME once.
    code, out, err = await finish(await redlock_run(cluster.urls, "--fencing", "b", "a", "b", "--", PY, "-c", show))
    assert (code, out.strip()) == (0, "1 b=1,a=3"), err
    unfenced = "import os; print(os.environ.get('REDLOCK_FENCING_TOKEN'), os.environ.get('REDLOCK_FENCING_TOKENS'))"
    code, out, err = await finish(await redlock_run(cluster.urls, "b", "a", "--", PY, "-c", unfenced))
    assert (code, out.strip()) == (0, "None None"), err  # no --fencing: nothing exported
    # The counters stay, each with its fencer (the acquisition whose fence wrote it: inspection reads it).
    await assert_empty(
        cluster, b"redlock-fence:a", b"redlock-fence:a\x00by", b"redlock-fence:b", b"redlock-fence:b\x00by"
    )


SEMAPHORE_LIMIT_KEY = semaphore_keys("redlock:", "pool").widest
"""The semaphore's widest limit ever used: kept on the nodes (a few bytes, no ttl)."""


@pytest.mark.slow
async def test_limit_lets_that_many_commands_run_at_once(cluster: Cluster, tmp_path: Path) -> None:
    gos = [tmp_path / f"go{i}" for i in range(2)]
    running = [await redlock_run(cluster.urls, "--limit", "2", "pool", "--", PY, "-c", HOLD, str(go)) for go in gos]
    for process in running:
        await ready(process)
    code, out, err = await finish(
        await redlock_run(cluster.urls, "--limit", "2", "pool", "--wait", "0.5", "--", "true")
    )
    assert (code, out) == (EXIT_NOT_ACQUIRED, "")
    lines = err.splitlines()
    assert lines[0] == "redlock: waiting for a permit of semaphore 'pool' (limit 2) (up to 0.5 s)"
    assert re.fullmatch(r"redlock: gave up on a permit of semaphore 'pool' \(limit 2\) after 0\.\d s", lines[1])
    assert lines[2:] == [
        "redlock: every permit of semaphore 'pool' (limit 2) is held elsewhere: not running true (waited 0.5 s)"
    ]
    code, _, err = await finish(await redlock_run(cluster.urls, "pool", "--", "true"))
    assert code == 0, err  # a lock of the same name is another thing than the semaphore
    waiting = await redlock_run(cluster.urls, "--limit", "2", "pool", "--wait", "20", "--", PY, "-c", "print('ran')")
    assert waiting.stderr is not None
    async with asyncio.timeout(10):
        line = await waiting.stderr.readline()
    assert line == b"redlock: waiting for a permit of semaphore 'pool' (limit 2) (up to 20 s)\n"
    gos[0].touch()  # one holder ends: its permit goes to the waiter
    assert (await finish(running[0]))[0] == 0
    code, out, err = await finish(waiting)
    assert (code, out) == (0, "ran\n")
    assert re.fullmatch(r"redlock: acquired a permit of semaphore 'pool' \(limit 2\) after \d+\.\d s\n", err)
    gos[1].touch()
    assert (await finish(running[1]))[0] == 0
    await assert_empty(cluster, SEMAPHORE_LIMIT_KEY)


@pytest.mark.slow
async def test_a_limit_other_than_the_holders_is_one_line_and_exit_2(
    cluster: Cluster, make_redlock: MakeRedlock
) -> None:
    nodes = ",".join(cluster.urls)
    redlock = await make_redlock()
    async with redlock.semaphore("pool", limit=3, ttl=30.0):
        code, out, err = await run_cli("run", "--limit", "2", "pool", "--nodes", nodes, "--wait", "20", "--", "true")
        assert (code, out) == (EXIT_USAGE, "")
        assert len(err.splitlines()) == 1, err  # no usage line, no waiting line: at once
        assert err.startswith("redlock: semaphore 'pool' is held under limit 3, not 2: ")
        assert err.endswith(": not running true\n")
        code, _, err = await run_cli("run", "--limit", "3", "pool", "--nodes", nodes, "--", "true")
        assert code == 0, err  # the holders' limit
    code, _, err = await run_cli("run", "--limit", "2", "pool", "--nodes", nodes, "--", "true")
    assert code == 0, err  # no permit held: a new limit may be used
    await assert_empty(cluster, SEMAPHORE_LIMIT_KEY)


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (
            ["--limit", "2", "a", "b"],
            r"redlock run: error: --limit takes one NAME \(the semaphore\), got 2: a b \(to hold several locks",
        ),
        (["--limit", "2", "--fencing", "a"], r"redlock run: error: --fencing cannot be used with --limit: semaphores"),
        (["--limit", "0", "a"], r"redlock run: error: --limit must be between 1 and 1024, got 0"),
        (["--limit", "1025", "a"], r"redlock run: error: --limit must be between 1 and 1024, got 1025"),
        (["--limit", "two", "a"], r"argument --limit: invalid int value: 'two'"),
        (["--fencing", "a,b", "c"], r"redlock run: error: with --fencing and several NAMEs, a NAME cannot contain ','"),
        (["a", "", "b"], r"redlock run: error: resource name is empty"),
        (["a", "--ttl", "5", "b"], r"unrecognized arguments: b \(give the NAMEs together, before or after the options"),
    ],
)
def test_cli_names_and_limit_say_what_to_change(
    args: list[str], pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--nodes", NOWHERE, *args, "--", "true"])  # fails before any I/O
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: redlock run NAME [NAME ...] [--limit N | --standby]")
    assert re.search(pattern, err), err


def test_a_comma_in_a_name_is_fine_without_fencing_or_with_one_name() -> None:
    parser = argparse.ArgumentParser()
    for name, fencing in ((["a,b", "c"], False), (["a,b"], True), (["a,b", "a,b"], True)):
        args = argparse.Namespace(name=name, fencing=fencing, limit=None, standby=False, owner=None, wait=0.0)
        _check_names(parser, args)  # no SystemExit


async def test_run_help_tells_of_several_names_limit_and_the_tokens() -> None:
    code, out, _ = await run_cli("run", "--help")
    text = " ".join(out.split())  # argparse wraps lines
    assert code == 0
    assert "NAME [NAME ...] [--limit N | --standby]" in text
    assert "--limit N NAME is a semaphore: hold one of its N permits" in text
    assert "$REDLOCK_FENCING_TOKENS has every NAME's as NAME=TOKEN,NAME=TOKEN" in text
    assert f"{EXIT_USAGE} on a usage error, or when --limit differs" in text


async def test_a_limit_conflict_met_while_waiting_is_not_called_giving_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The conflict can first show after a wait (the permits changed hands): the wait was said, then _run's line."""
    monkeypatch.setattr("redlock_async.cli._run.NOTE_EVERY", 60.0)

    class Waited:
        outcomes = ("an attempt was answered",)
        held = False

    with pytest.raises(ValueError, match="held under limit 3"):
        async with waiting_note(Waited(), "a permit of semaphore 'pool' (limit 2)", 5.0):  # type: ignore[arg-type]
            await asyncio.sleep(0.2)
            raise ValueError("semaphore 'pool' is held under limit 3, not 2")
    assert capsys.readouterr().err == "redlock: waiting for a permit of semaphore 'pool' (limit 2) (up to 5 s)\n"


async def test_status_ttl_must_be_a_duration(cluster: Cluster) -> None:
    code, _, err = await redlock_status(cluster.urls, "young", "--ttl", "0")
    assert code == EXIT_USAGE
    assert "--ttl" in err
